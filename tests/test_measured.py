"""The measured fidelity's machinery on the CPU: the child-process runner, its timeout, OOM and
crash classification, the memory budget on a shared GPU, each engine's real training step, the
calibration store it writes, two-depth extrapolation, and the CLI without a GPU. The GPU test at
the end runs only where CUDA is available."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import FULL

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.catalog.calibration import CalibrationStore  # noqa: E402
from planner.catalog.models import model_config  # noqa: E402
from planner.engine.estimate import estimate
from planner.probes.child import KILL_GRACE_SECONDS, run_child  # noqa: E402
from planner.probes.device import DeviceInfo, catalog_gpu  # noqa: E402
from planner.probes.measured import SHARED_RESERVE_BYTES, MeasureRequest, classify_failure, measure, memory_budget  # noqa: E402
from planner.schema.estimate import EstimateRequest
from planner.strategies import TrainingConfig  # noqa: E402

TINY = str(Path(__file__).parent / "data" / "tiny-llama" / "config.json")
GIB = 2**30
CPU = DeviceInfo(available=True, name="cpu")


def tiny_request(**kw) -> MeasureRequest:
    config = {"seq_len": 64} | kw.pop("config", {})
    return MeasureRequest(**{"config_json": json.loads(Path(TINY).read_text()), "config": TrainingConfig(**config),
                             "device": "cpu", "warmup_steps": 1, "timed_steps": 2} | kw)


def cli(*args: str):
    from typer.testing import CliRunner

    from planner.cli import app

    return CliRunner().invoke(app, list(args))


def test_memory_budget_caps_at_the_plan_and_the_free_memory():
    # a 40 GiB plan on an idle 80 GiB card: the plan's memory less the context
    b = memory_budget(total=80 * GIB, free=79 * GIB, context=GIB // 2, cap=40 * GIB, unified=0)
    assert b.allocator_limit_bytes == 40 * GIB - GIB // 2 and not b.refused and not b.note
    # a shared card with 20 GiB free: the free memory less the reserve, and a note that says so
    b = memory_budget(total=80 * GIB, free=20 * GIB, context=GIB // 2, cap=40 * GIB, unified=0)
    assert b.allocator_limit_bytes == 20 * GIB - SHARED_RESERVE_BYTES and "may fit" in b.note
    # paged state comes off both limits, and is refused when it exceeds the free memory
    b = memory_budget(total=80 * GIB, free=79 * GIB, context=0, cap=None, unified=10 * GIB)
    assert b.allocator_limit_bytes == 79 * GIB - SHARED_RESERVE_BYTES - 10 * GIB
    b = memory_budget(total=80 * GIB, free=8 * GIB, context=0, cap=None, unified=10 * GIB)
    assert b.refused and "unified memory" in b.refused
    # emulating a 40 GiB card on an idle 80 GiB one: the paged state comes off the device's free
    # memory only; the allocator keeps the whole room the 40 GiB card gives it (the seed case)
    b = memory_budget(total=80 * GIB, free=79 * GIB, context=GIB // 2, cap=40 * GIB, unified=16 * GIB)
    assert b.allocator_limit_bytes == 40 * GIB - GIB // 2 and not b.refused and not b.note


def test_failures_are_classified():
    assert classify_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == "oom"
    assert classify_failure(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")) == "oom"
    assert classify_failure(MemoryError()) == "oom"
    assert classify_failure(RuntimeError("CUDA error: an illegal memory access was encountered")) == "error"
    assert classify_failure(ValueError("bad config")) == "error"
    assert classify_failure(ImportError("adam-mini is not installed (pip install adam-mini)")) == "refused"


def test_catalog_gpu_from_driver_names():
    assert catalog_gpu("NVIDIA H100 80GB HBM3", 85_520_809_984) == "H100-SXM-80"
    assert catalog_gpu("NVIDIA H200", 150_754_820_096) == "H200-141"
    assert catalog_gpu("Some Future GPU", 10 * GIB) == "Some Future GPU"


def emitted_deepspeed(config: dict, world: int) -> dict:
    """The DeepSpeed JSON planner emits for the tiny model's plan (torch AdamW: nothing to compile)."""
    from planner.emit import build_files, single_plan_result

    plan = estimate(EstimateRequest(model=TINY, gpus=f"{world}xH100-80", **({"seq_len": 64} | config)))
    return json.loads(build_files(single_plan_result(plan))["deepspeed_config.json"])


@pytest.mark.parametrize("config,world,deepspeed", [  # CI: ZeRO-3 with LoRA (helpers.FULL)
    pytest.param({}, 1, False, id="adamw-bf16-mixed", marks=FULL),
    pytest.param({"checkpointing": "full", "precision": "bf16-pure", "grad_accum": 2}, 1, False,
                 id="full-ckpt-bf16-pure-accum", marks=FULL),
    # (CI measures FSDP2 as a rank of 8 and QLoRA in tests/test_gpu_validate.py's CPU run)
    pytest.param({"sharding": "fsdp", "grad_accum": 2}, 4, False, id="fsdp2-fake-4-ranks", marks=FULL),
    pytest.param({"sharding": "zero3"}, 4, True, id="zero3-fake-4-ranks", marks=FULL),
    pytest.param({"adapter": "qlora", "checkpointing": "full"}, 1, False, id="qlora", marks=FULL),
    pytest.param({"adapter": "lora", "sharding": "zero3"}, 4, True, id="lora-zero3-fake-4-ranks"),
])
@pytest.mark.heavy
def test_each_engine_trains_for_real(config, world, deepspeed):
    ds = emitted_deepspeed(config, world) if deepspeed else None
    r = measure(tiny_request(config=config, world_size=world, deepspeed_config=ds), timeout=300)
    assert r.status == "ok", r.message
    assert len(r.step_seconds) == 2 and all(s > 0 for s in r.step_seconds)
    assert r.versions["torch"] == torch.__version__
    if world > 1:
        assert any("fake process group" in n and "modelled" in n for n in r.notes)
    if "adapter" in config:  # the peft-wrapped model trained (QLoRA: its linears quantized by bitsandbytes)
        assert any(n.startswith(f"{config['adapter']}: peft r16") for n in r.notes), r.notes
        assert config["adapter"] != "qlora" or any("quantized to NF4" in n for n in r.notes)


def test_the_run_starts_with_the_allocator_it_is_given():
    """"" (torch's default allocator) where a validation case asks for it, in the forked child
    gpu_validate runs (measure's own child: the store test below; the launch's expandable segments
    otherwise: tests/test_gpu_validate.py): the child's environment, recorded with its measurement;
    the parent's environment untouched. Forked from a fresh interpreter, as gpu_validate forks from
    its own: this test process holds other tests' threads, and a fork copies their held locks."""
    code = (
        "import json, os, sys\n"
        "from planner.core.launch_contract import ALLOC_CONF_VAR\n"
        "from planner.probes.measured import MeasureRequest, measure_forked\n"
        "before = os.environ.get(ALLOC_CONF_VAR)\n"
        "r = measure_forked(MeasureRequest.model_validate_json(sys.stdin.read()), timeout=120)\n"
        "print(json.dumps([r.status, r.message, r.allocator_conf, os.environ.get(ALLOC_CONF_VAR) == before]))\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], input=tiny_request(allocator_conf="")
                          .model_dump_json(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    status, message, conf, untouched = json.loads(done.stdout.strip().splitlines()[-1])
    assert (status, conf, untouched) == ("ok", "", True), message


def test_oom_is_a_result_not_a_crash():
    # 1 MiB of address space beyond the built model: the first forward cannot allocate
    r = measure(tiny_request(memory_cap_bytes=2**20, config={"micro_batch_size": 16, "seq_len": 256}), timeout=300)
    assert r.status == "oom" and r.where == "warmup 1" and "allocate" in r.message


def test_timeout_ends_the_probe():
    start = time.perf_counter()
    r = measure(tiny_request(timed_steps=10**7), timeout=6)
    assert r.status == "timeout" and "timed out" in r.message
    assert time.perf_counter() - start < 6 + KILL_GRACE_SECONDS + 10


def test_a_dying_child_is_recorded():
    outcome = run_child("planner.probes.measured", "this is not a request", timeout=120)
    assert outcome.status == "crashed" and outcome.returncode == 1 and "ValidationError" in outcome.stderr_tail
    assert "died" in outcome.describe()


@pytest.mark.heavy
def test_measure_plan_compares_and_stores(tmp_path):
    from planner.probes.measured_command import measure_plan

    plan = estimate(EstimateRequest(model=TINY, gpus="4xH100-80", sharding="fsdp", seq_len=64))
    r = measure_plan(plan, TINY, model_config(TINY), CPU, device_kind="cpu", warmup_steps=1, steps=2, timeout=300,
                     extrapolate_from=[1, 2], store=tmp_path / "cal.sqlite")
    assert r.status == "ok" and r.extrapolated_from == [1, 2] and r.layers is None
    assert r.measured_step_seconds > 0 and r.tokens_per_second == pytest.approx(64 / r.measured_step_seconds)
    nccl = sum(row.bytes for row in plan.ledger if "NCCL" in row.label)
    assert nccl > 0 and r.predicted_peak_bytes == plan.memory["peak"] - nccl  # a fake process group has no NCCL
    assert r.predicted_step_seconds == pytest.approx(plan.time.step_seconds - plan.time.terms["communication"])
    rows = CalibrationStore(tmp_path / "cal.sqlite").measurements()
    assert sorted(m.layers for m in rows) == [1, 2]  # the two real runs, not the extrapolation
    assert all(m.world_size == 4 and m.communication == "modelled" and m.status == "ok" for m in rows)


@FULL  # (CI: test_the_run_starts_with_the_allocator_it_is_given)
def test_a_run_under_another_allocator_is_not_stored(tmp_path):
    """A validation case under torch's default allocator measures what a job without planner's
    launch reserves: the calibration (the launch's allocator) keeps nothing of it."""
    from planner.probes.measured_command import measure_plan

    plan = estimate(EstimateRequest(model=TINY, gpus="1xH100-80", seq_len=64))
    r = measure_plan(plan, TINY, model_config(TINY), CPU, device_kind="cpu", warmup_steps=1, steps=2, timeout=300,
                     store=tmp_path / "cal.sqlite", allocator_conf="")
    assert r.status == "ok" and r.measurement.allocator_conf == "" and r.stored is None
    assert not (tmp_path / "cal.sqlite").exists()


@pytest.mark.heavy
def test_extrapolation_from_two_depths_matches_full_depth():
    """The two-depth method on exact figures: traced phase peaks of Llama-3.2-1B at 2 and 4 layers,
    extrapolated to 8, against the trace at 8 layers (to 0.5 %)."""
    from planner.probes.extrapolate import extrapolate
    from planner.probes.measured import MeasureResult
    from planner.probes.traced import TraceRequest, trace_many

    config = TrainingConfig(seq_len=256, checkpointing="none")
    cfg = model_config("meta-llama/Llama-3.2-1B")
    traced = trace_many([TraceRequest(config_json=cfg, config=config, layers=d) for d in (2, 4, 8)], timeout=900)
    runs = [MeasureResult(status="ok", phase_peaks=t.phase_peaks, max_allocated_bytes=t.peak_bytes,
                          max_reserved_bytes=t.peak_bytes, step_seconds=[1.0]) for t in traced]
    out = extrapolate(runs[0], 2, runs[1], 4, 8)
    for phase, peak in traced[2].phase_peaks.items():
        assert out.phase_peaks[phase] == pytest.approx(peak, rel=0.005), phase
    assert out.max_allocated_bytes == pytest.approx(traced[2].peak_bytes, rel=0.005)


def test_a_third_depth_checks_linearity():
    """Figures affine in depth pass the check; a phase that bends below the two deepest depths is
    named (the Llama-3.2-1B forward phase with full checkpointing, from traced figures in MiB:
    5911.3 / 7307.4 / 10339.7 at 2 / 4 / 8 layers)."""
    from planner.probes.extrapolate import extrapolate_runs
    from planner.probes.measured import MeasureResult

    def run(forward: float, step: float) -> MeasureResult:
        return MeasureResult(status="ok", phase_peaks={"forward": round(forward * 2**20), "step": round(step * 2**20)},
                             max_allocated_bytes=round(max(forward, step) * 2**20), step_seconds=[1.0])

    straight = extrapolate_runs([(2, run(100, 200)), (4, run(140, 260)), (8, run(220, 380))], 16)
    assert straight.phase_peaks["step"] == round(620 * 2**20) and "every phase on the line" in straight.notes[-1]
    bent = extrapolate_runs([(2, run(5911.3, 200)), (4, run(7307.4, 260)), (8, run(10339.7, 380))], 16)
    assert "forward -2.0%" in bent.notes[-1] and "step" not in bent.notes[-1].split("off the line")[0]
    assert bent.phase_peaks["forward"] == round((10339.7 + 8 * (10339.7 - 7307.4) / 4) * 2**20)


def test_probe_takes_a_plan_file(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(cli("estimate", "--model", TINY, "--gpus", "1xH100-80", "--seq-len", "64", "--json").stdout)
    r = cli("probe", "--plan", str(plan), "--json")
    assert r.exit_code in (0, 1), r.output  # the traced probe ran (agreement is test_traced.py's business)
    comparison = json.loads(r.stdout)["comparison"]
    assert comparison["model"] == TINY and comparison["config"]["seq_len"] == 64 and comparison["terms"]
    bad = cli("probe", "--plan", str(plan), "--rank", "3")
    assert bad.exit_code == 2 and "holds 1 plan" in " ".join(bad.output.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("args", [
    ["probe", "--model", TINY, "--gpus", "1xH100-80", "--fidelity", "measured"],
    ["suggest", "--model", TINY, "--gpus", "1xH100-80", "--probe", "2"],
], ids=["probe", "suggest"])
def test_without_a_gpu_the_measured_probe_says_so(args):
    proc = subprocess.run([sys.executable, "-P", "-m", "planner", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert "no GPU for a measured probe" in proc.stderr and "--fidelity traced" in proc.stderr.replace("\n", " ")
    assert "Traceback" not in proc.stderr


@FULL
def test_suggest_probe_picks_the_fastest_measured_plan():
    from planner.engine.suggest import suggest
    from planner.probes.measured_command import probe_suggestion
    from planner.schema.suggest import SuggestRequest

    result = suggest(SuggestRequest(model=TINY, gpus="1xH100-80", seq_len=64, global_batch_size=16, top=3,
                                    optimizer=["adamw"], sharding=["none"], offload=["none"], loss=["standard"],
                                    precision=["bf16-mixed"]))  # (16 sequences: each probe a few seconds on a CPU)
    probed = probe_suggestion(result, 2, CPU, timeout=300, device_kind="cpu")
    assert len(probed.probes) == 2 and all(p.status == "ok" for p in probed.probes)
    rates = [p.tokens_per_second for p in probed.probes]
    assert probed.best_rank == rates.index(max(rates)) + 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_measured_probe_on_this_gpu(tmp_path):
    """Qwen2.5-0.5B, full depth, AdamW bf16-mixed: the analytic peak within 10 % of the driver's."""
    from planner.probes.measured_command import measure_plan, require_gpu

    device = require_gpu()
    plan = estimate(EstimateRequest(model="Qwen/Qwen2.5-0.5B", gpus=f"1x{catalog_gpu(device.name, device.total_bytes)}",
                                    seq_len=1024, micro_batch_size=2))
    r = measure_plan(plan, "Qwen/Qwen2.5-0.5B", model_config("Qwen/Qwen2.5-0.5B"), device, timeout=600,
                     store=tmp_path / "cal.sqlite")
    assert r.status == "ok", r.message
    assert abs(r.memory_error) <= 0.10
