"""planner check: the job's files mapped onto the vocabulary, the verdict, what to change,
exit codes, and no traceback for any input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.check import CheckRequest, check
from planner.cli import app
from planner.core import job as job_module
from planner.core.errors import PlannerInputError
from planner.cost import adapters
from planner.cost.activations import DTypes
from planner.emit import emit
from planner.engine.estimate import estimate_config
from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies import TECHNIQUES, TrainingConfig

from helpers import examples

ROOT = Path(__file__).resolve().parent.parent
LLAMA = "meta-llama/Llama-3.1-8B"
runner = CliRunner()


def cli(*args):
    r = runner.invoke(app, ["check", *args])
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    return r


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data) if path.suffix == ".json" else yaml.safe_dump(data))
    return path


def test_known_keys_match_the_installed_libraries(tmp_path):
    pytest.importorskip("deepspeed")
    subprocess.run([sys.executable, str(ROOT / "tests/tools/known_keys.py"), str(tmp_path / "keys.json")],
                   check=True, capture_output=True)
    fresh = json.loads((tmp_path / "keys.json").read_text())
    shipped = json.loads((ROOT / "planner/catalog/data/known_keys.json").read_text())
    for group in ("accelerate", "accelerate_sagemaker", "training_args", "deepspeed_zero", "deepspeed_top"):
        assert set(shipped[group]) == set(fresh[group]), group


@pytest.mark.parametrize("model, gpus, narrowing", [
    (LLAMA, "1xA100-40", {}),  # paged, bf16-pure: needs plan.json for the bf16 weights
    (LLAMA, "8xH100-80", {"sharding": ["zero3"]}),
    (LLAMA, "8xH100-80", {"sharding": ["fsdp"], "precision": ["bf16-mixed"]}),
    (LLAMA, "2x8xH100-80", {"sharding": ["fsdp-hybrid"]}),
    (LLAMA, "4xA100-80", {"sharding": ["zero2"], "offload": ["optimizer"], "optimizer": ["adamw"]}),
    ("Qwen/Qwen2.5-1.5B", "2xL40S", {"sharding": ["ddp"], "optimizer": ["adamw-8bit"]}),
])
def test_round_trip_from_suggest_out(tmp_path, model, gpus, narrowing):
    """check on the files `planner suggest --out` wrote: exit 0 and the plan's peak."""
    result = suggest(SuggestRequest(model=model, gpus=gpus, top=1, **narrowing))
    assert result.fits
    emit(result, tmp_path)
    plan = result.plans[0]
    r = cli("--model", model, "--gpus", gpus, "--job-dir", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["estimate"]["memory"]["peak"] == plan.memory["peak"]
    assert out["estimate"]["config"] == plan.config.model_dump(mode="json")


def test_files_alone_with_flags_for_what_files_cannot_say(tmp_path):
    result = suggest(SuggestRequest(model=LLAMA, gpus="8xH100-80", sharding=["zero2"], checkpointing=["full"], top=1))
    emit(result, tmp_path)
    c = result.plans[0].config
    args = ["--model", LLAMA, "--gpus", "8xH100-80", "--accelerate-config", str(tmp_path / "accelerate_config.yaml"),
            "--training-args", str(tmp_path / "training_args.json"), "--attention", c.attention, "--seq-len", str(c.seq_len),
            "--optimizer", c.optimizer, "--json"]
    r = cli(*args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["estimate"]["memory"]["peak"] == result.plans[0].memory["peak"]
    assert out["sources"]["sharding"].startswith("deepspeed_config.json")  # found through the accelerate config


def test_mappings(tmp_path):
    acc = write(tmp_path / "a.yaml", {"distributed_type": "FSDP", "num_processes": 16, "num_machines": 2,
                                     "mixed_precision": "bf16", "fsdp_config": {"fsdp_version": 1,
                                     "fsdp_sharding_strategy": "HYBRID_SHARD", "fsdp_offload_params": True,
                                     "fsdp_activation_checkpointing": True}})
    targs = write(tmp_path / "t.yaml", {"output_dir": "o", "per_device_train_batch_size": 2, "optim": "adamw_torch",
                                        "max_seq_length": 4096, "use_liger_kernel": True})
    r = check(CheckRequest(model=LLAMA, gpus="2x8xH100-80", accelerate_config=acc, training_args=targs, alternatives=0))
    c = r.estimate.config
    assert (c.sharding, c.offload, c.checkpointing, c.precision, c.loss, c.seq_len, c.micro_batch_size) == (
        "fsdp-hybrid", "optimizer+params", "full", "bf16-mixed", "chunked", 4096, 2)
    assert any("FSDP1" in w for w in r.warnings)
    ds = write(tmp_path / "ds.json", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}},
                                      "fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1,
                                      "gradient_accumulation_steps": 8, "train_batch_size": 64,
                                      "optimizer": {"type": "AdamW"}})
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=ds, alternatives=0))
    c = r.estimate.config
    assert (c.sharding, c.offload, c.precision, c.grad_accum, c.optimizer) == ("zero2", "optimizer", "fp16-mixed", 8, "adamw")
    assert any("NVMe" in w for w in r.warnings)
    assert r.sources["grad_accum"] == "ds.json: gradient_accumulation_steps"


def test_fp8_without_compile_is_timed_as_it_runs(tmp_path):
    """An fp8 job the Trainer does not compile runs torchao's casts eagerly, slower than bf16
    (pytorch/ao#685): its memory is fp8's (the ledger models eager fp8, as traced) and its step
    time bf16-mixed's, never the compiled fp8 speed-up; with torch_compile the fp8 time stands."""
    result = suggest(SuggestRequest(model=LLAMA, gpus="8xH100-80", precision=["fp8-mixed"], sharding=["fsdp"], top=1))
    emit(result, tmp_path)
    plan = result.plans[0]
    compiled = check(CheckRequest(model=LLAMA, gpus="8xH100-80", job_dir=tmp_path, alternatives=0))
    targs = json.loads((tmp_path / "training_args.json").read_text())
    assert targs["torch_compile"] is True
    write(tmp_path / "training_args.json", targs | {"torch_compile": False})
    request = CheckRequest(model=LLAMA, gpus="8xH100-80", job_dir=tmp_path, alternatives=0)
    eager = check(request)
    as_bf16 = estimate_config(resolve_model(LLAMA), request.hardware(),
                              plan.config.model_copy(update={"precision": "bf16-mixed"}))
    assert compiled.estimate.time.tokens_per_second == plan.time.tokens_per_second
    assert eager.estimate.config.precision == "fp8-mixed"
    assert eager.estimate.memory["peak"] == plan.memory["peak"]
    assert eager.estimate.time.tokens_per_second == as_bf16.time.tokens_per_second < plan.time.tokens_per_second
    assert any("pytorch/ao#685" in w for w in eager.warnings)


def test_not_fitting_job_gets_changes_that_fit(tmp_path):
    targs = write(tmp_path / "t.json", {"output_dir": "o", "per_device_train_batch_size": 4,
                                        "gradient_accumulation_steps": 4, "bf16": True, "optim": "adamw_torch",
                                        "max_seq_length": 4096})
    r = cli("--model", LLAMA, "--gpus", "4xA100-80", "--training-args", str(targs), "--sharding", "zero2", "--json")
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert not out["fits"] and out["changes"]
    # checkpointing is part of the first fix (with the reserve its recompute keeps, measured on an
    # H100, a smaller micro-batch goes with it: strategies/checkpointing.py ``reserve``)
    assert "checkpointing none -> " in out["changes"][0]["change"]
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.cost.overheads import DEFAULT_MARGIN
    from planner.strategies import TrainingConfig

    for change in out["changes"]:  # (a paged plan's peak is the usable memory its state fills: the same margin)
        again = estimate_config(resolve_model(LLAMA), parse_gpus("4xA100-80"), TrainingConfig(**change["config"]),
                                DEFAULT_MARGIN)
        assert again.fits and again.memory["peak"] == change["peak_bytes"] < out["estimate"]["memory"]["peak"]
    assert any("->" in reason for reason in out["reasons"])


def test_fitting_job_lists_faster_plans(tmp_path):
    targs = write(tmp_path / "t.json", {"output_dir": "o", "per_device_train_batch_size": 1,
                                        "gradient_accumulation_steps": 8, "bf16": True, "optim": "adamw_torch",
                                        "gradient_checkpointing": True})
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", training_args=targs, sharding="zero3"))
    assert r.fits and r.faster
    assert all(f.fits and f.tokens_per_second > r.estimate.time.tokens_per_second for f in r.faster)
    # a bounded search: one technique and / or the micro-batch away, the global batch kept, fastest first
    job = r.estimate.config
    for f in r.faster:
        techniques = [s.field for s in TECHNIQUES if getattr(f.config, s.field) != getattr(job, s.field)]
        assert len(techniques) <= 1 and f.config.adapter == job.adapter, f.change
        assert f.config.micro_batch_size * f.config.grad_accum == job.micro_batch_size * job.grad_accum
    speeds = [f.tokens_per_second for f in r.faster]
    assert speeds == sorted(speeds, reverse=True)


@pytest.mark.parametrize("files, flags, needle", [
    ({"t.json": {"bf16": True, "fp16": True}}, [], "both bf16 and fp16"),
    ({"t.json": {"fp16": True}, "ds.json": {"bf16": {"enabled": True}}}, [], "contradiction"),
    ({"ds.json": {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "train_batch_size": 64}}, [],
     "train_batch_size"),
    ({"a.yaml": {"distributed_type": "FSDP", "num_processes": 8}, "t.json": {"deepspeed": {"zero_optimization": {"stage": 2}}}},
     [], "contradiction"),
    ({"t.json": {"learning_rat": 1e-4}}, [], "unknown key"),
    ({"a.yaml": {"distributed_typ": "NO"}}, [], "unknown key"),
    ({"ds.json": {"zero_optimization": {"stag": 2}}}, [], "unknown key"),
    ({"t.json": {"per_device_train_batch_size": "four"}}, [], "must be an integer"),
    ({"t.json": {"per_device_train_batch_size": -3}}, [], "out of range"),
    ({"t.json": {"per_device_train_batch_size": 10**30}}, [], "out of range"),
    ({"ds.json": {"zero_optimization": {"stage": 7}}}, [], "ZeRO stage"),
    ({"a.yaml": {"distributed_type": "XLA", "num_processes": 8}}, [], "not planned"),
    ({"t.json": {"per_device_train_batch_size": 2}}, ["--gpus", "1xNOPE"], "unknown GPU"),
])
def test_bad_input_exit_2(tmp_path, files, flags, needle):
    args = []
    for name, data in files.items():
        option = {"t": "--training-args", "d": "--deepspeed-config", "a": "--accelerate-config"}[name[0]]
        args += [option, str(write(tmp_path / name, data))]
    gpus = [] if "--gpus" in flags else ["--gpus", "8xH100-80"]
    r = cli("--model", LLAMA, *gpus, *flags, *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output


def test_a_launcher_count_differing_from_gpus_is_a_note_not_an_error(tmp_path):
    """open-r1's and the handbook's SLURM scripts pass --num_processes / --num_machines to accelerate
    launch over the YAML's: --gpus decides, and the output names the file's count."""
    acc = write(tmp_path / "a.yaml", {"distributed_type": "MULTI_GPU", "num_processes": 4, "num_machines": 1})
    r = cli("--model", LLAMA, "--gpus", "2x8xH100-80", "--accelerate-config", str(acc))
    assert r.exit_code in (0, 1), r.output
    assert "num_processes = 4, but --gpus 2x8xH100-80 is 16 GPUs" in " ".join(r.output.split())
    assert "num_machines = 1" in r.output


def test_unreadable_inputs_exit_2(tmp_path):
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "trunc.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: [2,\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "bin.json").write_bytes(bytes(range(256)))
    for option, path in [("--training-args", tmp_path / "empty.json"), ("--accelerate-config", tmp_path / "trunc.yaml"),
                         ("--accelerate-config", tmp_path / "list.yaml"), ("--deepspeed-config", tmp_path / "bin.json"),
                         ("--training-args", tmp_path), ("--training-args", tmp_path / "missing.json"),
                         ("--job-dir", tmp_path / "missing")]:
        r = cli("--model", LLAMA, "--gpus", "8xH100-80", option, str(path))
        assert r.exit_code == 2, (option, path, r.output)
    assert cli("--model", LLAMA, "--gpus", "8xH100-80").exit_code == 2  # no files at all


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**40, 10**40), st.floats(allow_nan=True),
                    st.text(max_size=12))
KEYS = st.sampled_from(["distributed_type", "num_processes", "mixed_precision", "fsdp_config", "deepspeed_config",
                        "zero_optimization", "stage", "bf16", "fp16", "enabled", "optim", "deepspeed", "fsdp",
                        "per_device_train_batch_size", "gradient_accumulation_steps", "train_batch_size",
                        "offload_optimizer", "device", "fsdp_version", "use_cpu", "max_seq_length"]) | st.text(max_size=8)
TREES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(KEYS, kids, max_size=4),
                     max_leaves=12)


@settings(max_examples=examples(2500, 150))
@given(content=st.one_of(TREES.map(lambda t: ("json", json.dumps(t, allow_nan=True))),
                         TREES.map(lambda t: ("yaml", yaml.safe_dump(t))),
                         st.text(max_size=200).map(lambda t: ("yaml", t)),
                         st.binary(max_size=100).map(lambda b: ("json", b.decode("latin-1"))),
                         TREES.map(lambda t: ("yaml", yaml.safe_dump(t)[: len(yaml.safe_dump(t)) // 2]))),
       option=st.sampled_from(["--accelerate-config", "--deepspeed-config", "--training-args"]),
       gpus=st.sampled_from(["8xH100-80", "1xA100-40", "x", "0x8xH100", "99999999999999999999xA100"]),
       extra=st.sampled_from([[], ["--mbs", "-1"], ["--seq-len", "0"], ["--margin", "7"], ["--grad-accum", "3"]]))
def test_garbage_never_makes_a_traceback(tmp_path_factory, content, option, gpus, extra):
    suffix, text = content
    path = tmp_path_factory.getbasetemp() / f"garbage.{suffix}"
    path.write_text(text, errors="surrogateescape")
    r = runner.invoke(app, ["check", "--model", LLAMA, "--gpus", gpus, option, str(path), *extra])
    assert r.exception is None or isinstance(r.exception, SystemExit), (text, r.exception)
    assert "Traceback" not in r.output
    assert r.exit_code in (0, 1, 2)
    if r.exit_code == 2:
        assert r.output.startswith("error:") or "Usage:" in r.output or "Error" in r.output


@settings(max_examples=examples(1000))
@given(key=st.sampled_from(["per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "optim",
                            "use_liger_kernel", "max_seq_length", "gradient_checkpointing", "deepspeed", "fsdp_config"]),
       value=st.one_of(st.integers(-10**40, -1), st.integers(10**7, 10**40), st.lists(st.integers(), min_size=1, max_size=2),
                       st.dictionaries(st.text(min_size=1, max_size=3), st.integers(), min_size=1, max_size=2),
                       st.floats(allow_nan=True)).filter(lambda v: not isinstance(v, bool)),
       unknown=st.text(alphabet="qxzjvk_", min_size=3, max_size=10))
def test_invalid_job_files_exit_2(tmp_path_factory, key, value, unknown):
    """Wrong types, impossible numbers and unknown keys: always exit 2 with a message."""
    path = tmp_path_factory.getbasetemp() / "invalid.json"
    path.write_text(json.dumps({"output_dir": "o", key: value, unknown: 1}))
    r = runner.invoke(app, ["check", "--model", LLAMA, "--gpus", "8xH100-80", "--training-args", str(path)])
    assert r.exit_code == 2 and r.output.startswith("error:"), (key, value, r.output)


def test_python_api_is_the_json(tmp_path):
    targs = write(tmp_path / "t.json", {"output_dir": "o", "per_device_train_batch_size": 1, "bf16": True,
                                        "optim": "paged_adamw_8bit", "gradient_checkpointing": True})
    api = check(CheckRequest(model=LLAMA, gpus="1xA100-40", training_args=targs, precision="bf16-pure", seq_len=512))
    cli_out = json.loads(cli("--model", LLAMA, "--gpus", "1xA100-40", "--training-args", str(targs),
                             "--precision", "bf16-pure", "--seq-len", "512", "--json").output)
    assert api.model_dump(mode="json") == cli_out


def test_examples_launch_only_what_fits(tmp_path):
    fits = suggest(SuggestRequest(model=LLAMA, gpus="8xH100-80", top=1))
    emit(fits, tmp_path / "ok")
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    ok = subprocess.run([sys.executable, str(ROOT / "examples/launch_with_check.py"), "--model", LLAMA, "--gpus",
                         "8xH100-80", "--job-dir", str(tmp_path / "ok"), "--margin", "0", "--", "echo", "LAUNCHED"],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "LAUNCHED" in ok.stdout, ok.stderr
    big = write(tmp_path / "big.json", {"output_dir": "o", "per_device_train_batch_size": 8, "bf16": True})
    no = subprocess.run([sys.executable, str(ROOT / "examples/launch_with_check.py"), "--model", LLAMA, "--gpus",
                         "1xA100-40", "--training-args", str(big), "--", "echo", "LAUNCHED"],
                        capture_output=True, text=True, env=env)
    assert no.returncode == 1 and "LAUNCHED" not in no.stdout and "will not fit" in no.stderr
    subprocess.run(["bash", "-n", str(ROOT / "examples/slurm_preflight.sbatch")], check=True)


@pytest.mark.parametrize("content", [
    {"distributed_type": "DEEPSPEED", "num_processes": 8, "deepspeed_config": {"offload_optimizer_device": [1]}},
    {"distributed_type": "DEEPSPEED", "num_processes": 8, "deepspeed_config": {"deepspeed_config_file": "a\x00b.json"}},
    {"distributed_type": "DEEPSPEED", "num_processes": 8, "deepspeed_config": {"zero_stage": {"x": 1}}},
])
def test_odd_values_in_nested_sections_exit_2(tmp_path, content):
    path = write(tmp_path / "a.yaml", content)
    assert cli("--model", LLAMA, "--gpus", "8xH100-80", "--accelerate-config", str(path)).exit_code == 2


def test_files_read_as_their_libraries_read_them(tmp_path):
    """Legacy keys and precedence as accelerate, DeepSpeed and the Trainer apply them."""
    # accelerate converts the legacy dynamo_backend (BaseConfig.process_config): not an unknown key
    acc = write(tmp_path / "a.yaml", {"distributed_type": "MULTI_GPU", "num_processes": 8, "dynamo_backend": "INDUCTOR",
                                      "mixed_precision": "no"})
    targs = write(tmp_path / "t.json", {"per_device_train_batch_size": 1, "bf16": True})
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=acc, training_args=targs, alternatives=0))
    assert r.estimate.config.precision == "bf16-mixed"  # the Trainer's bf16 over accelerate's "no"
    assert any("dynamo_config" in w for w in r.warnings)
    # DeepSpeed's legacy bfloat16 section; and no 16-bit section at all is fp32 training
    alias = write(tmp_path / "alias.json", {"zero_optimization": {"stage": 3}, "bfloat16": {"enabled": True},
                                            "train_micro_batch_size_per_gpu": 1})
    fp32 = write(tmp_path / "fp32.json", {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    read = {p.name: check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=p, alternatives=0)).estimate
            for p in (alias, fp32)}
    assert read["alias.json"].config.precision == "bf16-mixed" and read["fp32.json"].config.precision == "fp32"
    assert read["fp32.json"].memory["peak"] > read["alias.json"].memory["peak"]


def test_accelerate_refuses_deepspeed_keys_beside_a_deepspeed_file(tmp_path):
    """accelerate raises when its YAML's deepspeed_config names a file and also sets zero_stage,
    offload devices, ... (DeepSpeedPlugin._deepspeed_config_checks): so does check (exit 2)."""
    ds = write(tmp_path / "ds.json", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    acc = write(tmp_path / "a.yaml", {"distributed_type": "DEEPSPEED", "num_processes": 8,
                                      "deepspeed_config": {"deepspeed_config_file": str(ds), "zero_stage": 2}})
    r = cli("--model", LLAMA, "--gpus", "8xH100-80", "--accelerate-config", str(acc))
    assert r.exit_code == 2 and "accelerate refuses" in " ".join(r.output.split()), r.output


def test_what_is_not_modelled_or_ignored_is_named(tmp_path):
    """A DeepSpeed top-level typo (DeepSpeed ignores it), DeepSpeed compile and its own Ulysses
    sequence parallelism: each a warning naming it; accelerate's context parallelism with the
    alltoall strategy: a refusal naming it (planning it as data parallelism would be planning
    another job)."""
    ds = write(tmp_path / "ds.json", {"zero_optimisation": {"stage": 3}, "bf16": {"enabled": True},
                                      "compile": {"deepcompile": True}, "sequence_parallel_size": 4,
                                      "train_micro_batch_size_per_gpu": 1})
    acc = write(tmp_path / "a.yaml", {"distributed_type": "FSDP", "num_processes": 8,
                                      "fsdp_config": {"fsdp_version": 2},
                                      "parallelism_config": {"parallelism_config_dp_shard_size": 4,
                                                             "parallelism_config_cp_size": 2,
                                                             "parallelism_config_cp_comm_strategy": "alltoall"}})
    warned = " ".join(check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=ds, alternatives=0)).warnings)
    assert "zero_optimisation (did you mean zero_optimization?)" in warned
    for needle in ("compile: DeepSpeed's torch.compile", "Ulysses"):
        assert needle in warned, needle
    with pytest.raises(PlannerInputError) as refused:
        check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=acc, alternatives=0))
    said = " ".join(refused.value.problems)
    for needle in ("parallelism_config_cp_comm_strategy 'alltoall': planner models ring attention's default "
                   "'allgather' strategy only",):
        assert needle in said, needle
    auto = write(tmp_path / "auto.json", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
                                          "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})
    warned = " ".join(check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=auto, alternatives=0)).warnings)
    for needle in ('train_micro_batch_size_per_gpu is "auto"', 'gradient_accumulation_steps is "auto"'):
        assert needle in warned, needle


def test_accelerate_tensor_parallelism_is_read_as_that_degree_with_what_the_script_must_do(tmp_path):
    """accelerate's parallelism_config_tp_size is transformers' TP plan of that degree with accelerate's
    FSDP2 over dp_shard: planned as --tensor-parallel transformers --tp-size N, with a warning that the
    script must load the model sharded (accelerate skips TP for a model loaded whole); its sizes must
    multiply to the GPUs, replicas only where the shard group is a node; TP without FSDP is refused by
    the rule that refuses it in suggest."""
    from planner.strategies.tensor_parallel import TP_LOADING

    def config(dt: str = "FSDP", **sizes) -> Path:
        return write(tmp_path / f"{dt}{len(sizes)}{sum(sizes.values())}.yaml", {
            "distributed_type": dt, "num_processes": 8, "mixed_precision": "bf16", "fsdp_config": {"fsdp_version": 2},
            "parallelism_config": {f"parallelism_config_{k}_size": v for k, v in sizes.items()}})

    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=config(tp=2, dp_shard=4), alternatives=0))
    c = r.estimate.config
    assert (str(c.tensor_parallel), c.tp_size, str(c.sharding), c.fsdp_version) == ("transformers", 2, "fsdp", 2)
    assert any(TP_LOADING in w and "parallelism_config_tp_size 2" in w for w in r.warnings), r.warnings
    same = estimate_config(resolve_model(LLAMA), parse_gpus("8xH100-80"), c, CheckRequest(model=LLAMA, gpus="8xH100-80").margin)
    assert same.memory["peak"] == r.estimate.memory["peak"]
    hybrid = check(CheckRequest(model=LLAMA, gpus="2x8xH100-80", accelerate_config=config(
        tp=2, dp_shard=4, dp_replicate=2), gradient_sync="micro-batch", alternatives=0)).estimate.config
    assert (str(hybrid.sharding), hybrid.tp_size) == ("fsdp-hybrid", 2)
    for sizes, gpus, said in ((dict(tp=2), "8xH100-80", "tp 2 = 2 processes, but the job runs 8"),
                              (dict(tp=2, dp_shard=2, dp_replicate=4), "2x8xH100-80", "replicas whose shard group is "
                                                                                       "not a node's 8 GPUs")):
        with pytest.raises(PlannerInputError) as e:
            check(CheckRequest(model=LLAMA, gpus=gpus, accelerate_config=config(**sizes), alternatives=0))
        assert any(said in p for p in e.value.problems), e.value.problems
    with pytest.raises(PlannerInputError, match="with tensor parallelism is not modelled"):
        check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=config("MULTI_GPU", tp=8), alternatives=0))


def test_an_infeasible_job_gets_its_one_field_fixes_first(tmp_path):
    """paged-adamw-8bit under FSDP2 cannot run: the changes that make it fit are single fields (the
    optimizer, or the engine), not four-field re-plans."""
    acc = write(tmp_path / "a.yaml", {"distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
                                      "fsdp_config": {"fsdp_version": 2}})
    targs = write(tmp_path / "t.json", {"per_device_train_batch_size": 1, "optim": "paged_adamw_8bit", "bf16": True})
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=acc, training_args=targs))
    assert not r.fits and r.changes
    for c in r.changes:
        changed = [k for k in type(c.config).model_fields if getattr(c.config, k) != getattr(r.estimate.config, k)]
        assert len(changed) == 1 and c.fits, (c.change, changed)
    assert {c.change.split()[0] for c in r.changes} <= {"optimizer", "sharding", "offload", "precision",
                                                        "checkpointing", "loss", "attention"}
    assert any(c.change == "optimizer paged-adamw-8bit -> adamw" for c in r.changes)


def test_a_job_folder_may_hold_its_training_arguments_as_yaml(tmp_path):
    """--job-dir reads training_args.yaml (or .yml) as it reads training_args.json: the same
    verdict; a folder with both is refused (exit 2) naming them, since either could be the job's."""
    planned = tmp_path / "plan"
    emit(suggest(SuggestRequest(model=LLAMA, gpus="8xH100-80", sharding=["zero2"], top=1)), planned)
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("accelerate_config.yaml", "deepspeed_config.json", "runtime.json"):
        (mine / name).write_text((planned / name).read_text())
    args = json.loads((planned / "training_args.json").read_text())
    (mine / "training_args.yaml").write_text(yaml.safe_dump(args))
    target = dict(model=LLAMA, gpus="8xH100-80", alternatives=0)
    as_yaml = check(CheckRequest(job_dir=mine, **target))
    as_json = check(CheckRequest(job_dir=planned, **target))
    assert as_yaml.estimate.config == as_json.estimate.config
    assert as_yaml.fits == as_json.fits
    (mine / "training_args.json").write_text(json.dumps(args))
    r = CliRunner().invoke(app, ["check", "--job-dir", str(mine), "--model", LLAMA, "--gpus", "8xH100-80"])
    assert r.exit_code == 2 and "training_args.json and training_args.yaml" in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("extra, said", [({}, True), ({"torch_dtype": "bfloat16"}, False),
                                         ({"deepspeed": {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}},
                                          False)])
def test_a_recipe_without_a_load_dtype_says_what_was_assumed(tmp_path, extra, said):
    """A Trainer recipe that names no load dtype is planned with fp32 weights (transformers 4's
    load); transformers 5 loads the checkpoint's stored dtype, so a job with no engine keeping fp32
    masters would train bf16 weights: check says so. Not when the recipe names the dtype, nor
    under DeepSpeed (its bf16 keeps fp32 partitions whatever the load)."""
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True,
            "max_seq_length": 2048} | extra
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps(args))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    warned = any("no torch_dtype / dtype" in w and "transformers >= 5" in w for w in r.warnings)
    assert warned is said, r.warnings
    if extra.get("torch_dtype"):
        assert r.estimate.config.precision == "bf16-pure"


@pytest.mark.parametrize("args, trl, loss, said", [
    ({"loss_type": "chunked_nll"}, None, "chunked", False),
    ({"loss_type": "nll"}, None, "standard", False),
    ({"packing": True}, (1, 7), "chunked", False),  # TRL 1.7's SFT default
    ({"packing": True}, (1, 6), "standard", False),
    ({"packing": True}, None, "standard", True),  # TRL not installed: the larger loss, said
    ({"packing": True, "use_liger_kernel": False}, (1, 9), "standard", False),
])
def test_trl_sft_loss_type_and_its_default_per_version(tmp_path, monkeypatch, args, trl, loss, said):
    """TRL's SFTConfig loss_type (trl/trainer/sft_config.py): chunked_nll never holds the full
    logits; from TRL 1.7 it is the default unless use_liger_kernel is set (1.6: "The default value
    of `loss_type` will change from "nll" to "chunked_nll" in TRL 1.7")."""
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: trl if package == "trl" else None)
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True,
                                "max_length": 2048, "gradient_checkpointing": True} | args))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.loss == loss
    assert any("no loss_type" in w for w in r.warnings) is said, r.warnings


@pytest.mark.parametrize("installed, path", [((4, 38), "fp32-logits"), ((4, 45), "fp32-logits"),
                                             ((4, 46), "shift-logits"), ((4, 48), "shift-logits"),
                                             ((4, 49), "pad-labels"), ((5, 23), "pad-labels")])
def test_the_loss_path_is_the_installed_transformers(tmp_path, monkeypatch, installed, path):
    """check plans the standard loss as the transformers installed here computes it (releases'
    modeling_llama.py and loss_utils.py: fp32 logits returned up to 4.45, the shifted fp32 copy in
    ForCausalLMLoss 4.46-4.48, padded labels from 4.49), and a Trainer job drops the model output;
    the older paths hold more at the loss, so the same job's peak grows."""
    monkeypatch.setattr(job_module, "installed_release",
                        lambda package, parts=2: installed if package == "transformers" else None)
    args = tmp_path / "training_args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 4, "bf16": True, "max_length": 2048,
                                "gradient_checkpointing": True, "optim": "adamw_torch_fused"}))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=args, alternatives=0))
    assert r.estimate.config.loss_path == path
    assert r.sources["loss_path"] == f"transformers {installed[0]}.{installed[1]} installed here"
    assert r.estimate.config.model_output == "dropped" and "compute_loss" in r.sources["model_output"]
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: None)
    today = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=args, alternatives=0))
    assert today.estimate.config.loss_path == "pad-labels" and today.sources["loss_path"] == "default"
    held, now = r.estimate.phase_peaks["forward"], today.estimate.phase_peaks["forward"]  # (the loss's moments)
    if path == "shift-logits":  # its forward holds one more fp32 copy than 4.49's at least: 14 V T > 12 V T
        assert held - now >= 2 * 128_256 * 4 * 2048, (held, now)
    else:
        assert held >= now if path == "fp32-logits" else held == now


@pytest.mark.parametrize("args, rows", [({"eval_strategy": "steps"}, 8), ({"evaluation_strategy": "epoch"}, 8),
                                        ({"eval_strategy": "steps", "per_device_eval_batch_size": 64}, 64),
                                        ({"eval_strategy": "no", "per_device_eval_batch_size": 64}, None), ({}, None)])
def test_evaluation_during_training_is_said_with_its_loss_bytes(tmp_path, args, rows):
    """A Trainer recipe that evaluates while training (eval_strategy steps or epoch; transformers
    4's evaluation_strategy) gets a warning: evaluation is not planned, and its eval micro-batch
    (per_device_eval_batch_size, the Trainer's default 8) holds the loss's forward copies, (c + 8) V
    bytes per token under transformers >= 4.49 (prediction_step runs the model with labels), beside
    the model states; over the usable memory it says to lower the eval batch."""
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "max_length": 4096,
                                "gradient_checkpointing": True} | args))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, adapter="lora", alternatives=0))
    said = [w for w in r.warnings if "evaluation is not planned" in w]
    if rows is None:
        assert not said, said
        return
    logits = 10 * 128_256 * rows * 4096  # bf16 logits, their fp32 copy, log_softmax's output
    assert len(said) == 1 and f"{rows} x 4,096 tokens holds {logits / 2**30:.2f} GiB at its loss" in said[0], said
    assert ("lower per_device_eval_batch_size" in said[0]) is (rows == 64), said


def test_llamafactory_evaluation_is_said_as_the_trainers(tmp_path):
    """LLaMA-Factory passes the Trainer's eval_strategy and per_device_eval_batch_size through
    (HfArgumentParser over TrainingArguments), so its evaluation is said as a Trainer recipe's."""
    f = tmp_path / "lf.yaml"
    f.write_text("model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nbf16: true\ncutoff_len: 4096\n"
                 "val_size: 0.1\neval_strategy: steps\nper_device_eval_batch_size: 2\n")
    r = check(CheckRequest(gpus="1xH100-80", training_args=f, alternatives=0))
    said = [w for w in r.warnings if "evaluation is not planned" in w]
    assert len(said) == 1 and "lf.yaml: eval_strategy steps, per_device_eval_batch_size 2" in said[0], r.warnings
    assert f"holds {10 * 128_256 * 2 * 4096 / 2**30:.2f} GiB at its loss" in said[0], said


@pytest.mark.parametrize("loss_key, full", [({"use_liger_kernel": True}, True), ({"loss_type": "chunked_nll"}, False)])
def test_evaluation_with_a_chunked_loss(tmp_path, loss_key, full):
    """Liger's patched forward fuses the loss only while training (Liger-Kernel lce_forward: "if in
    training mode, don't materialize logits"), so its evaluation holds the full logits; TRL's
    chunked_nll chunks whenever labels are given, evaluation included."""
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "max_length": 4096,
                                "eval_strategy": "steps", "per_device_eval_batch_size": 4} | loss_key))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, adapter="lora", alternatives=0))
    assert r.estimate.config.loss == "chunked"
    said = " ".join(w for w in r.warnings if "evaluation is not planned" in w)
    assert ("Liger computes the full logits outside training" in said) is full, said
    assert ("TRL's chunked loss" in said) is (not full), said


def test_trl_loss_type_refusals(tmp_path):
    """chunked_nll beside use_liger_kernel is refused as TRL refuses it; a GRPO or DPO loss_type
    (dr_grpo, sigmoid) is not SFT's: the recipe is refused as preference or RL training, never
    planned as SFT."""
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "loss_type": "chunked_nll",
                                "use_liger_kernel": True}))
    r = CliRunner().invoke(app, ["check", "--training-args", str(path), "--model", LLAMA, "--gpus", "1xH100-80"])
    assert r.exit_code == 2 and "contradiction" in " ".join(r.output.split()), r.output
    for other in ("dr_grpo", "sigmoid"):
        path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "loss_type": other}))
        with pytest.raises(PlannerInputError, match=f"loss_type {other}: a preference or RL loss"):
            check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))


def test_an_fsdp_job_accumulating_reads_when_its_gradients_are_reduced(tmp_path):
    """The Trainer enters accelerate's no_sync between accumulation boundaries unless
    accelerator_config.gradient_accumulation_kwargs.sync_each_batch is true: without it every rank
    holds every trained parameter's unsharded fp32 gradient (4 B x 8.03B for Llama-3.1-8B), and
    reducing every micro-batch is the exact change that saves it."""
    acc = write(tmp_path / "a.yaml", {"distributed_type": "FSDP", "num_processes": 8, "mixed_precision": "bf16",
                                      "fsdp_config": {"fsdp_version": 2}})
    base = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True}
    verdicts = {}
    for name, extra in (("default", {}), ("each", {"accelerator_config": {
            "gradient_accumulation_kwargs": {"sync_each_batch": True}}})):
        targs = write(tmp_path / f"{name}.json", base | extra)
        verdicts[name] = check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=acc, training_args=targs))
    step, each = verdicts["default"].estimate, verdicts["each"].estimate
    assert (step.config.gradient_sync, each.config.gradient_sync) == ("step", "micro-batch")
    n = step.model.num_trainable_parameters
    assert step.memory["peak"] - each.memory["peak"] >= 4 * n - -(-4 * n // 8)
    assert not verdicts["default"].fits and verdicts["each"].fits
    fixes = {c.change: c for c in verdicts["default"].changes}
    assert fixes["gradient sync step -> micro-batch (sync_each_batch)"].fits, list(fixes)
    bad = write(tmp_path / "bad.json", base | {"accelerator_config": {"gradient_accumulation_kwargs": {
        "sync_each_batch": "sometimes"}}})
    with pytest.raises(PlannerInputError, match="sync_each_batch must be true or false, not 'sometimes'"):
        check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=acc, training_args=bad))
    listed = write(tmp_path / "listed.json", base | {"accelerator_config": [1]})
    with pytest.raises(PlannerInputError, match="accelerator_config must be a mapping or a file name, not \\[1\\]"):
        check(CheckRequest(model=LLAMA, gpus="8xH100-80", accelerate_config=acc, training_args=listed))


@pytest.mark.parametrize("installed, optimizer", [({"transformers": (4, 53), "torch": (2, 9)}, "adamw-foreach"),
                                                  ({"transformers": (4, 54), "torch": (2, 7)}, "adamw-foreach"),
                                                  ({"transformers": (4, 54), "torch": (2, 8)}, "adamw"),
                                                  ({"transformers": (5, 24)}, "adamw-foreach"), ({}, "adamw")])
def test_a_recipe_without_optim_gets_the_trainers_default_here(tmp_path, monkeypatch, installed, optimizer):
    """The Trainer's default optim is adamw_torch_fused from transformers 4.54 with torch 2.8 and
    later, adamw_torch (torch's foreach AdamW) otherwise (training_args.py ``default_optim``);
    without transformers installed the vocabulary's default stands."""
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: installed.get(package))
    args = write(tmp_path / "training_args.json", {"per_device_train_batch_size": 1, "bf16": True, "max_length": 1024})
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=args, alternatives=0))
    assert r.estimate.config.optimizer == optimizer
    assert ("the Trainer's default" in r.sources["optimizer"]) is bool(installed), r.sources["optimizer"]


@pytest.mark.parametrize("params, optimizer", [({"torch_adam": True}, "adamw-foreach"),
                                               ({"torch_adam": True, "fused": True}, "adamw"),
                                               ({"torch_adam": True, "foreach": False}, "adamw"), ({}, "adamw")])
def test_deepspeeds_torch_adam_is_read_as_the_kernel_it_runs(tmp_path, params, optimizer):
    """DeepSpeed's AdamW block with torch_adam builds torch.optim.AdamW with the block's params
    (deepspeed/runtime/engine.py get_optimizer_configuration): foreach unless fused is set; without
    torch_adam DeepSpeed's own FusedAdam."""
    ds = write(tmp_path / "ds.json", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
                                      "train_micro_batch_size_per_gpu": 1,
                                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-5} | params}})
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=ds, seq_len=2048, alternatives=0))
    assert r.estimate.config.optimizer == optimizer


def test_torchs_adamw_under_deepspeed_offload_is_deepspeeds_cpu_adam(tmp_path):
    """Without an optimizer block, the Trainer's optimizer goes to DeepSpeed, and accelerate swaps
    torch's AdamW for DeepSpeed's CPU Adam under optimizer offload (map_pytorch_optim_to_deepspeed);
    with a block, DeepSpeed builds the block and a Trainer optim naming another is said."""
    targs = write(tmp_path / "t.json", {"per_device_train_batch_size": 1, "optim": "adamw_torch", "bf16": True})
    offload = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "bf16": {"enabled": True}}
    ds = write(tmp_path / "ds.json", offload)
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=ds, training_args=targs, seq_len=2048,
                           alternatives=0))
    assert r.estimate.config.optimizer == "adamw" and "map_pytorch_optim_to_deepspeed" in r.sources["optimizer"]
    ds = write(tmp_path / "ds2.json", {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
                                       "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}}})
    r = check(CheckRequest(model=LLAMA, gpus="8xH100-80", deepspeed_config=ds, training_args=targs, seq_len=2048,
                           alternatives=0))
    assert r.estimate.config.optimizer == "adamw" and any("is not what runs" in w for w in r.warnings), r.warnings


@pytest.mark.parametrize("trl, fsdp, bf16, prep, warned", [
    ((0, 25), False, True, "fp32-norms", False), ((0, 25), False, False, "fp32", False), (None, False, True, "none", True),
    ((0, 26), False, True, "none", False), ((0, 25), True, True, "none", False)])
def test_trl_qlora_prepared_with_kbit_training_is_planned(tmp_path, monkeypatch, trl, fsdp, bf16, prep, warned):
    """TRL before 0.26 passes a 4-bit base that is not sharded through peft's
    prepare_model_for_kbit_training (trl/models/utils.py prepare_peft_model: ``if is_qlora and not
    is_sharded_qlora``), then under bf16 casts the embeddings and head back to bf16
    (``peft_module_casting_to_bf16``): check plans kbit prep fp32-norms (fp32 without bf16) and its
    fp32 residual stream. TRL 0.26 (#4577) and FSDP-QLoRA (a base loaded on the host) do not
    prepare it; with no TRL installed to say which release runs the job, check plans none and says
    the activation memory is a lower bound."""
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: trl if package == "trl" else None)
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "max_length": 2048, "gradient_checkpointing": True,
                                "use_peft": True, "load_in_4bit": True} | ({"bf16": True} if bf16 else {"fp16": True})
                               | ({"fsdp": "full_shard auto_wrap"} if fsdp else {})))
    r = check(CheckRequest(model=LLAMA, gpus="2xH100-80" if fsdp else "1xH100-80", training_args=path,
                           alternatives=0))
    assert r.estimate.config.adapter == "qlora" and r.estimate.config.kbit_prep == prep, r.sources
    said = [w for w in r.warnings if "prepare_model_for_kbit_training" in w and "lower bound" in w]
    assert bool(said) is warned, r.warnings
    if said:
        assert "not installed" in said[0] and "--kbit-prep fp32-norms" in said[0]
    if prep != "none":  # planned so: every layer's checkpointed input is fp32
        saved = next(row for row in r.estimate.ledger if row.label.startswith("saved activations"))
        spec = resolve_model(LLAMA)
        assert saved.bytes == 4 * spec.hidden_size * spec.num_layers * 2048


@pytest.mark.parametrize("trl, tf, extra, warned", [
    ((0, 26), (4, 57), {}, True), ((0, 26), (5, 0), {}, False), ((0, 27), (5, 0), {}, True), (None, None, {}, True),
    (None, (5, 0), {}, True),
    ((0, 27), (5, 0), {"dtype": "bfloat16"}, False), ((0, 26), (4, 57), {"load_in_4bit": True}, False)])
def test_trl_lora_without_a_load_dtype_may_load_an_fp32_base(tmp_path, monkeypatch, trl, tf, extra, warned):
    """A TRL LoRA recipe with no dtype: TRL up to 0.26 passes dtype None, which transformers 4
    loads in fp32 (a bitsandbytes base: fp16) and 5 in the stored dtype; TRL from 0.27 asks for
    float32 (#4778). planner plans the base in the compute dtype, so check says the memory of an
    fp32 base is a lower bound."""
    installed = {"trl": trl, "transformers": tf}
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: installed.get(package))
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "max_length": 2048,
                                "gradient_checkpointing": True, "use_peft": True} | extra))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    said = [w for w in r.warnings if "frozen base may be fp32" in w]
    assert bool(said) is warned, r.warnings
    if said:
        assert "lower bound" in said[0] and r.estimate.config.adapter in ("lora", "qlora")
        assert ("TRL from 0.27" in said[0]) is (trl is None), said


@pytest.mark.parametrize("modules, note", [(None, True), (["q_proj", "v_proj"], False), (["v_proj", "q_proj"], False)])
def test_trl_lora_targets_q_and_v_are_planned_as_qv(tmp_path, modules, note):
    """A TRL recipe's ``lora_target_modules``: q_proj and v_proj are the ``qv`` set; none at all is
    peft's per-architecture default, q_proj and v_proj on Llama (peft
    ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``), also ``qv``, with a note that says so.
    The plan trains peft's count for those two projections: 3,407,872 on Llama-3-8B at r 8, the
    figure peft's ``print_trainable_parameters`` prints for its default targets."""
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "max_length": 2048, "use_peft": True,
                                "lora_r": 8} | ({"lora_target_modules": modules} if modules else {})))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.lora_targets == "qv"
    assert any("peft's default" in w for w in r.warnings) is note, r.warnings
    assert r.estimate.model.num_trainable_parameters == 3_407_872


@pytest.mark.parametrize("installed, kept", [((0, 42, 0), True), ((0, 43, 1), True), ((0, 43, 2), False),
                                             ((0, 50, 2), False)])
def test_qlora_is_planned_as_the_installed_bitsandbytes_keeps_its_inputs(tmp_path, monkeypatch, installed, kept):
    """bitsandbytes' MatMul4Bit kept each 4-bit matmul's input on its autograd context until
    0.43.2 (PR #1270), where a checkpoint's hooks cannot drop it: check plans a QLoRA job as the
    bitsandbytes installed here runs it, says so, and the older one's checkpointed peak holds every
    layer's matmul inputs (planner.cost.adapters.kept_input_bytes) more."""
    monkeypatch.setattr(job_module, "installed_release",
                        lambda package, parts=2: installed if package == "bitsandbytes" and parts == 3 else None)
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "max_length": 2048,
                                "gradient_checkpointing": True, "use_peft": True, "load_in_4bit": True}))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.adapter == "qlora"
    assert r.estimate.config.nf4_matmul == ("keeps-input" if kept else "frees-input")
    assert r.sources["nf4_matmul"] == f"bitsandbytes {'.'.join(map(str, installed))} installed here"
    assert any("before 0.43.2" in w for w in r.warnings) is kept, r.warnings
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: None)
    today = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert today.estimate.config.nf4_matmul == "frees-input" and today.sources["nf4_matmul"] == "default"
    model = resolve_model(LLAMA)
    per_layer = adapters.kept_input_bytes(model, DTypes(2, 2)) * 2 * 2048
    grown = r.estimate.memory["activations"] - today.estimate.memory["activations"]
    assert grown == (pytest.approx(per_layer * model.num_layers, rel=0.01) if kept else 0), grown


@pytest.mark.parametrize("kwargs, installed, impl", [
    ({"gradient_checkpointing_kwargs": {"use_reentrant": True}}, (5, 24), "reentrant"),
    ({"gradient_checkpointing_kwargs": {"use_reentrant": False}}, (4, 57), "non-reentrant"),
    ({}, (4, 57), "reentrant"), ({}, (5, 0), "non-reentrant"), ({}, None, "non-reentrant")])
def test_the_checkpoint_implementation_is_the_jobs(tmp_path, monkeypatch, kwargs, installed, impl):
    """The Trainer passes gradient_checkpointing_kwargs to torch's checkpoint; without them
    transformers 4 (4.57.1's modeling_utils.py) checkpoints reentrant, 5 (5.0.0) non-reentrant.
    Over an LLM.int8() base the difference is every layer's kept matmul inputs."""
    monkeypatch.setattr(job_module, "installed_release",
                        lambda package, parts=2: installed if package == "transformers" else None)
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "max_length": 2048,
                                "gradient_checkpointing": True, "use_peft": True, "load_in_8bit": True} | kwargs))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.adapter == "lora-int8" and r.estimate.config.checkpoint_impl == impl
    said = {True: "training_args.json: gradient_checkpointing_kwargs use_reentrant",
            False: f"transformers {installed[0]}.{installed[1]}'s default" if installed else "default"}[bool(kwargs)]
    assert said in r.sources["checkpoint_impl"], r.sources["checkpoint_impl"]
    model = resolve_model(LLAMA)
    rows = {row.label: row.bytes for row in r.estimate.ledger}
    saved = next(v for k, v in rows.items() if k.startswith("saved activations"))
    kept = adapters.kept_input_bytes(model, DTypes(2, 2)) if impl == "non-reentrant" else 0
    assert saved == pytest.approx((2 * model.hidden_size + kept) * model.num_layers * 2 * 2048, abs=1)


@pytest.mark.parametrize("text, impl", [
    ("adapter: lora\nload_in_8bit: true\ngradient_checkpointing: true\n", "reentrant"),
    ("adapter: lora\nload_in_8bit: true\ngradient_checkpointing: true\n"
     "gradient_checkpointing_kwargs:\n  use_reentrant: false\n", "non-reentrant"),
    ("finetuning_type: lora\nquantization_bit: 8\n", "reentrant"),
    ("finetuning_type: lora\nquantization_bit: 8\nuse_reentrant_gc: false\n", "non-reentrant")])
def test_axolotl_and_llamafactory_checkpoint_reentrant_by_default(tmp_path, text, impl):
    """axolotl sets use_reentrant True when checkpointing with no kwargs, rl or unfrozen_parameters
    (utils/config/__init__.py normalize_config); LLaMA-Factory's use_reentrant_gc defaults to True
    (hparams/model_args.py) and checkpointing is on unless disabled."""
    head = "base_model: m\nsequence_len: 2048\nmicro_batch_size: 1\nlora_r: 8\nlora_alpha: 16\n" if "adapter" in text \
        else "stage: sft\ncutoff_len: 2048\n"
    path = tmp_path / "job.yaml"
    path.write_text(head + text)
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.checkpointing == "full" and r.estimate.config.checkpoint_impl == impl, r.sources


def test_reentrant_checkpointing_is_emitted_and_read_back(tmp_path):
    """A plan's checkpoint implementation is what its files run (the Trainer's
    activation_checkpointing_kwargs) and what check reads back from them; FSDP's own checkpointing
    is non-reentrant, so a reentrant plan under FSDP checkpoints through the Trainer instead."""
    result = suggest(SuggestRequest(model=LLAMA, gpus="1xH100-80", checkpointing=["full"], checkpoint_impl="reentrant",
                                    top=1))
    emit(result, tmp_path)
    args = json.loads((tmp_path / "training_args.json").read_text())
    assert args["activation_checkpointing_kwargs"] == {"use_reentrant": True}
    back = check(CheckRequest(model=LLAMA, gpus="1xH100-80", job_dir=tmp_path, alternatives=0))
    assert back.estimate.config == result.plans[0].config
    fsdp = suggest(SuggestRequest(model=LLAMA, gpus="2xH100-80", checkpointing=["full"], sharding=["fsdp"],
                                  checkpoint_impl="reentrant", top=1))
    emit(fsdp, tmp_path / "fsdp")
    args = json.loads((tmp_path / "fsdp" / "training_args.json").read_text())
    assert args["activation_checkpointing"] and args["activation_checkpointing_kwargs"] == {"use_reentrant": True}
    assert not yaml.safe_load((tmp_path / "fsdp" / "accelerate_config.yaml").read_text())["fsdp_config"].get(
        "fsdp_activation_checkpointing")
    back = check(CheckRequest(model=LLAMA, gpus="2xH100-80", job_dir=tmp_path / "fsdp", alternatives=0))
    assert back.estimate.config == fsdp.plans[0].config


def test_an_int8_job_checkpointed_non_reentrant_is_told_the_reentrant_fix(tmp_path):
    """Llama-3.1-8B LoRA over LLM.int8() at 2 x 2048 on a 24 GB card: the non-reentrant checkpoint
    keeps every layer's int8 matmul inputs (6.5 GiB) and the job misses; check says why and names
    the reentrant checkpoint among the changes that make it fit, at the same speed."""
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "max_length": 2048,
                                "gradient_checkpointing": True, "use_peft": True, "load_in_8bit": True,
                                "lora_target_modules": "all-linear",
                                "gradient_checkpointing_kwargs": {"use_reentrant": False}}))
    r = check(CheckRequest(model=LLAMA, gpus="1xRTX4090-24", training_args=path, alternatives=3))
    assert not r.fits and any("--checkpoint-impl reentrant" in w for w in r.warnings), r.warnings
    fix = next(ch for ch in r.changes if ch.change.startswith("checkpoint-impl non-reentrant -> reentrant"))
    assert fix.fits and fix.tokens_per_second == r.estimate.time.tokens_per_second
    model = resolve_model(LLAMA)
    saved = adapters.kept_input_bytes(model, DTypes(2, 2)) * model.num_layers * 2 * 2048  # (both peak at the forward's end)
    again = estimate_config(model, parse_gpus("1xRTX4090-24"), fix.config)
    assert again.memory["peak"] == fix.peak_bytes
    assert r.estimate.peak_phase == again.peak_phase == "forward"
    assert r.estimate.memory["activations"] - again.memory["activations"] == pytest.approx(saved, rel=0.001)


def test_a_kbit_prepared_plan_is_emitted_read_back_and_told_its_fix(tmp_path, monkeypatch):
    """A QLoRA plan over a base prepared as TRL <= 0.25 prepares it: runtime.json says kbit_prep
    (planner's launch applies it: planner/runtime/adapter.py) and check reads it back to the same
    plan. Llama-3.1-8B QLoRA at 1 x 1536 without checkpointing on a 24 GB card misses only for the
    preparation's fp32 residual stream and MLP intermediates: check names the unprepared base
    among the changes that make it fit, at least that difference lower (2 bytes more per element
    of the gate, its activation and up, per layer)."""
    result = suggest(SuggestRequest(model=LLAMA, gpus="1xH100-80", adapter=["qlora"], checkpointing=["full"],
                                    precision=["bf16-mixed"], kbit_prep="fp32-norms", top=1))
    assert result.plans and result.plans[0].config.kbit_prep == "fp32-norms"
    emit(result, tmp_path)
    assert json.loads((tmp_path / "runtime.json").read_text())["kbit_prep"] == "fp32-norms"
    back = check(CheckRequest(model=LLAMA, gpus="1xH100-80", job_dir=tmp_path, alternatives=0))
    assert back.estimate.config == result.plans[0].config
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: (0, 25) if package == "trl" else None)
    path = tmp_path / "trl" / "training_args.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "max_length": 1536, "use_peft": True,
                                "load_in_4bit": True, "lora_dropout": 0.0, "gradient_checkpointing": False,
                                "lora_target_modules": "all-linear"}))
    r = check(CheckRequest(model=LLAMA, gpus="1xRTX4090-24", training_args=path, alternatives=3))
    assert r.estimate.config.kbit_prep == "fp32-norms" and not r.fits
    fix = next(ch for ch in r.changes if ch.change == "kbit-prep fp32-norms -> none")
    model = resolve_model(LLAMA)
    assert fix.fits and r.estimate.memory["peak"] - fix.peak_bytes >= 6 * model.intermediate_size * model.num_layers * 1536


@pytest.mark.parametrize("change, why", [({"attention": "eager"}, "eager attention"), ({"precision": "bf16-pure"}, "autocast"),
                                         ({"sharding": "fsdp"}, "sharded engine"),
                                         ({"model": "microsoft/Phi-3-mini-4k-instruct"}, "Llama-style")])
def test_a_kbit_prepared_plan_is_refused_where_it_is_not_modelled(change, why):
    """planner models a prepared base's fp32 residual stream for Llama-style layers under autocast
    with fused attention, on one GPU or DDP; elsewhere it refuses with the reason."""
    from planner.catalog.gpus import parse_gpus
    from planner.engine.estimate import estimate_config
    from planner.strategies import TrainingConfig

    model = resolve_model(change.pop("model", LLAMA))
    config = TrainingConfig(**{"adapter": "qlora", "kbit_prep": "fp32", "precision": "bf16-mixed", "checkpointing": "full",
                               "sharding": "none"} | change)
    r = estimate_config(model, parse_gpus("2xH100-80" if change.get("sharding") else "1xH100-80"), config)
    assert not r.feasible and any(why in reason for reason in r.reasons), r.reasons


@pytest.mark.parametrize("text, prep", [
    ("finetuning_type: lora\nquantization_bit: 4\nupcast_layernorm: true\n", "fp32-norms"),
    ("finetuning_type: lora\nquantization_bit: 4\n", "none"),
    ("base_model: m\nadapter: qlora\nload_in_4bit: true\nsequence_len: 2048\nmicro_batch_size: 1\nlora_r: 8\n"
     "lora_alpha: 16\n", "none")])
def test_the_frameworks_own_preparation_is_read(tmp_path, monkeypatch, text, prep):
    """LLaMA-Factory's upcast_layernorm casts the norms' weights to fp32 over its 4-bit base
    (model_utils/checkpointing.py prepare_model_for_training): kbit prep fp32-norms. Neither it
    nor axolotl (which casts the norms back to the compute dtype after peft's preparation,
    loaders/model.py) runs TRL's preparation, whatever TRL is installed."""
    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: (0, 25) if package == "trl" else None)
    path = tmp_path / "job.yaml"
    path.write_text(("stage: sft\ncutoff_len: 2048\n" if "finetuning_type" in text else "") + text)
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.adapter == "qlora" and r.estimate.config.kbit_prep == prep, r.sources
    assert not [w for w in r.warnings if "lower bound" in w and "prepare_model_for_kbit_training" in w], r.warnings


def test_a_zero3_qlora_job_is_planned_with_its_whole_load(tmp_path, monkeypatch):
    """PEFT's ZeRO-3 QLoRA recipe (Llama-2-70B on two 40 GB GPUs, 2 x 2048, checkpointing): planned,
    not refused. TRL <= 0.25 prepares the base (its parameters sit on the GPU, not sharded yet),
    but DeepSpeed's engine casts the whole module to bf16 when it starts, so no preparation is
    planned; the peak holds the whole 4-bit base each GPU loads before DeepSpeed partitions it."""
    from planner.engine.estimate import WHOLE_LOAD_LABEL

    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: (0, 25) if package == "trl" else None)
    ds = write(tmp_path / "ds.json", {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}})
    args = tmp_path / "training_args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "bf16": True,
                                "max_length": 2048, "gradient_checkpointing": True, "use_peft": True,
                                "load_in_4bit": True, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.1,
                                "lora_target_modules": "all-linear"}))
    r = check(CheckRequest(model="meta-llama/Llama-2-70b-hf", gpus="2xA100-40", deepspeed_config=ds, training_args=args,
                           alternatives=0))
    c = r.estimate.config
    assert (c.adapter, c.sharding, c.kbit_prep) == ("qlora", "zero3", "none") and r.estimate.feasible, r.estimate.reasons
    assert r.fits and any(row.label == WHOLE_LOAD_LABEL for row in r.estimate.ledger)


@pytest.mark.parametrize("kernels, loss, layer_kernels", [
    (None, "chunked", "rope, rms_norm, swiglu, geglu, layer_norm"),
    ({"rope": False, "rms_norm": False, "swiglu": False, "geglu": False, "layer_norm": False}, "chunked", None),
    ({"fused_linear_cross_entropy": False, "rope": False, "rms_norm": False, "swiglu": False, "geglu": False,
      "layer_norm": False}, "standard", None),
    ({"swiglu": False}, "chunked", "rope, rms_norm, geglu, layer_norm")])
def test_liger_kernel_config_is_read(tmp_path, kernels, loss, layer_kernels):
    """``use_liger_kernel`` runs every Liger kernel its ``liger_kernel_config`` leaves on (Liger's
    patch functions default them on): the fused linear cross-entropy is the chunked loss, and the
    layer kernels still on are named (planner counts transformers' modules: an upper bound)."""
    path = tmp_path / "training_args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "bf16": True, "max_length": 4096,
                                "use_liger_kernel": True} | ({"liger_kernel_config": kernels} if kernels else {})))
    r = check(CheckRequest(model=LLAMA, gpus="1xH100-80", training_args=path, alternatives=0))
    assert r.estimate.config.loss == loss
    said = [w for w in r.warnings if "Liger's layer kernels" in w]
    assert (said[0].split("(")[1].split(" unless")[0] if said else None) == layer_kernels, r.warnings


SAGEMAKER = ROOT / "tests/data/recipes/huggingface__notebooks/sagemaker/22_accelerate_sagemaker_examples/src"


@pytest.mark.parametrize("path, gpus, sharding, precision", [
    # huggingface/notebooks: DATA_PARALLEL on ml.p3.16xlarge (8 V100), fp16
    (SAGEMAKER / "text-classification/accelerate_config.yaml", "8xV100-16", "ddp", "fp16-mixed"),
    # teticio/audio-diffusion: 'NO' (one process) and mixed_precision 'No' (accelerate lowercases it)
    (ROOT / "tests/data/recipes/teticio__audio-diffusion/accelerate_sagemaker.yaml", "1xV100-16", "none", "fp32"),
])
def test_sagemaker_accelerate_configs_are_read_as_accelerate_reads_them(path, gpus, sharding, precision):
    """compute_environment AMAZON_SAGEMAKER: accelerate reads the file as its SageMakerConfig, whose
    keys (ec2_instance_type, iam_role_name, ...) are known; DATA_PARALLEL (SageMaker's data parallel
    library) is planned as DDP; the instance type is named as not read."""
    result = check(CheckRequest(model="Qwen/Qwen2.5-0.5B", gpus=gpus, accelerate_config=path, alternatives=0))
    c = result.estimate.config
    assert (str(c.sharding), str(c.precision)) == (sharding, precision), result.sources
    assert any("ec2_instance_type" in w and "not read" in w for w in result.warnings), result.warnings


def test_sagemaker_model_parallel_and_unknown_keys_are_refused(tmp_path):
    d = yaml.safe_load((SAGEMAKER / "text-classification/accelerate_config.yaml").read_text())
    for change, needle in (({"distributed_type": "MODEL_PARALLEL"}, "MODEL_PARALLEL is not planned"),
                           ({"num_processes": 8}, r"unknown key\(s\) num_processes")):  # a ClusterConfig key
        path = tmp_path / "sm.yaml"
        path.write_text(yaml.safe_dump(d | change))
        with pytest.raises(PlannerInputError, match=needle):
            check(CheckRequest(model="Qwen/Qwen2.5-0.5B", gpus="8xV100-16", accelerate_config=path, alternatives=0))


def test_an_unquoted_no_distributed_type_is_no(tmp_path):
    """YAML 1.1 reads ``distributed_type: NO`` as false (accelerate writes it quoted): read as NO."""
    path = tmp_path / "acc.yaml"
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: NO\nmixed_precision: bf16\nnum_processes: 1\n")
    result = check(CheckRequest(model="Qwen/Qwen2.5-0.5B", gpus="1xA100-80", accelerate_config=path, alternatives=0))
    assert str(result.estimate.config.sharding) == "none" and "distributed_type NO" in result.sources["sharding"]


def test_trainer_fsdp_config_as_a_json_path_is_read_as_transformers_reads_it(tmp_path):
    """TrainingArguments(fsdp_config="fsdp.json") loads the file (json.load) and drops each key's
    fsdp_ prefix (transformers 5.23 training_args.py): its offload and version are the plan's."""
    (tmp_path / "fsdp.json").write_text(json.dumps({"fsdp_offload_params": True, "fsdp_version": 2}))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"fsdp": "full_shard auto_wrap", "fsdp_config": "fsdp.json", "bf16": True}))
    result = check(CheckRequest(model="Qwen/Qwen2.5-0.5B", gpus="8xA100-80", training_args=args, alternatives=0))
    c = result.estimate.config
    assert (str(c.sharding), str(c.offload), c.fsdp_version) == ("fsdp", "optimizer+params", 2), result.sources
    (tmp_path / "fsdp.json").write_text("[1, 2]")
    with pytest.raises(PlannerInputError, match="fsdp_config"):
        check(CheckRequest(model="Qwen/Qwen2.5-0.5B", gpus="8xA100-80", training_args=args, alternatives=0))
