"""The step-time model against the steps planner's own launch path took on a real GPU
(benchmarks/results/H100-SXM-80: every run of benchmarks/gpu_validate.sh, each case's median over
runs), and the library facts its step-time terms rest on.

Each constant solved or fitted on those runs (planner/catalog/data/efficiency.yaml ``stack``,
planner/cost/overheads.py) is held here to the measurement it came from, so a later change of the
model that moves it away shows; the terms taken from the libraries' code are held to that code
(the tensor counts an optimizer steps, the chunks Liger's loss walks, bitsandbytes' per-tensor
synchronization). Tolerances: 5 % where a constant was solved on the case, 10-15 % where the case
only checks a term derived from code, and the median for the stack factor.
"""

import csv
import statistics
import sys
from pathlib import Path

import pytest

from planner.catalog.models import catalog, resolve_model
from planner.cost import activations
from planner.cost.overheads import PER_TENSOR_STEP_SECONDS
from planner.engine.estimate import estimate, resolve_config
from planner.schema.estimate import EstimateRequest
from planner.strategies import PlanContext
from planner.strategies.adapter import target_modules
from planner.strategies.optimizer import per_tensor_step_seconds

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "H100-SXM-80"
sys.path.insert(0, str(ROOT / "benchmarks"))


def measured_steps() -> dict[str, float]:
    """Each full-depth case's median measured step over every run that timed it, seconds."""
    steps: dict[str, list[float]] = {}
    for path in sorted(RESULTS.glob("*/probes.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                if row["depth"] == "full" and row["status"] == "ok" and row["measured_step_s"]:
                    steps.setdefault(row["key"], []).append(float(row["measured_step_s"]))
    return {key: statistics.median(values) for key, values in steps.items()}


MEASURED = measured_steps()


def planned_step(key: str) -> float:
    """planner's step for the validation case ``key`` on the GPU it ran on, seconds."""
    from validation.cases import CASES

    case = next(c for c in CASES if c.key == key)
    plan = estimate(EstimateRequest(model=case.model, gpus=case.gpus_on("H100-SXM-80"), **case.config))
    return plan.time.step_seconds


def error(key: str) -> float:
    return planned_step(key) / MEASURED[key] - 1


def test_the_stack_factor_centres_the_plain_cases():
    """efficiency.yaml's stack factor is the value at which the plain Llama-3.2-1B cases (AdamW
    under bf16 autocast, with full checkpointing, bf16-pure, under torch's default allocator) err
    by about 0 in median; none by more than 15 %."""
    errors = [error(k) for k in ("1b-adamw", "1b-adamw-ckpt-full", "1b-bf16-pure", "1b-adamw-torch-alloc")]
    assert abs(statistics.median(errors)) <= 0.05, errors
    assert max(abs(e) for e in errors) <= 0.15, errors


def test_selective_checkpointing_floor_reproduces_its_case():
    """overheads.SELECTIVE_CHECKPOINT_SECONDS_PER_LAYER was solved on this case: within 5 %; and
    planner ranks selective checkpointing slower than full here, as measured."""
    assert abs(error("1b-ckpt-selective")) <= 0.05
    assert MEASURED["1b-ckpt-selective"] > MEASURED["1b-adamw-ckpt-full"]
    assert planned_step("1b-ckpt-selective") > planned_step("1b-adamw-ckpt-full")


@pytest.mark.parametrize("key", ["1b-adamw-8bit", "1b-paged-adamw-8bit", "1b-paged-adamw", "1b-adamw-4bit"])
def test_per_tensor_optimizers_reproduce_their_cases(key):
    """overheads.PER_TENSOR_STEP_SECONDS, solved between these cases: each within 10 %; and the
    8-bit optimizer's step slower than AdamW's, as measured (0.159 against 0.123 s)."""
    assert abs(error(key)) <= 0.10
    if key == "1b-adamw-8bit":
        assert planned_step(key) > planned_step("1b-adamw")


def test_qlora_host_floor_reproduces_its_case_and_hides_at_8b():
    """overheads.NF4_MATMUL_HOST_SECONDS was solved on the 1B QLoRA case: within 5 %; the 8B case,
    whose matmuls hide it, within 10 %."""
    assert abs(error("1b-qlora")) <= 0.05
    assert abs(error("8b-qlora")) <= 0.10


def test_fsdp2_copies_reproduce_the_one_rank_case():
    """FSDP2's copy-in, copy-out and casts around its collectives are derived from torch's code,
    not fitted: FSDP2 on one rank within 5 % (13 % fast without them)."""
    assert abs(error("1b-fsdp2-w1")) <= 0.05


def test_chunked_loss_traffic_reproduces_its_case():
    """The chunked loss's head-gradient traffic is derived from Liger's code, not fitted: within 10 %
    of the measured step, which is slower than the standard loss's (0.156 against 0.123 s)."""
    assert abs(error("1b-chunked-loss")) <= 0.10
    assert planned_step("1b-chunked-loss") > planned_step("1b-adamw")


def test_liger_walks_the_chunks_its_code_says():
    """Liger-Kernel 0.8.5 ops/fused_linear_cross_entropy.py: inc_factor = ceil(V / h), chunk_size =
    min(next_pow2(ceil(BT / inc_factor)), BT). Llama-3.2-1B (V 128,256, h 2,048) at 2 x 2048 tokens:
    inc 63, ceil(4096 / 63) = 66 -> 128 tokens a chunk, 32 chunks; Llama-2-7B (32,000, 4,096) at
    16,384: inc 8 -> 2,048; a micro-batch smaller than one chunk is one chunk."""
    assert activations.liger_chunk_tokens(4096, 128_256, 2048) == 128
    assert activations.liger_chunk_tokens(16_384, 32_000, 4096) == 2048
    assert activations.liger_chunk_tokens(100, 32_000, 4096) == 16
    assert activations.liger_chunk_tokens(7, 32_000, 4096) == 1


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("model", ["meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "microsoft/Phi-3-mini-4k-instruct"])
def test_an_optimizer_steps_as_many_tensors_as_the_model_trains(model):
    """The tensors a per-tensor optimizer steps (strategies/optimizer.py ``per_tensor_step_seconds``):
    in full fine-tuning the model's parameter tensors, tied embeddings once; with LoRA on all
    linears, A and B per wrapped module. transformers' own model and peft's, on the meta device."""
    pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from planner.probes.meta_model import build_on_meta

    spec = resolve_model(model)
    live = build_on_meta(catalog()[model].config)
    full = len(list(live.parameters()))
    wrapped = peft.get_peft_model(live, peft.LoraConfig(
        r=8, target_modules=target_modules("all-linear", spec.family), task_type="CAUSAL_LM"))
    lora = sum(1 for p in wrapped.parameters() if p.requires_grad)
    for adapter, want in (("none", full), ("lora", lora)):
        request = EstimateRequest(model=model, gpus="1xH100-SXM-80", optimizer="adamw-8bit", adapter=adapter)
        ctx = PlanContext(spec, request.hardware(), resolve_config(request, spec, request.hardware()))
        host, library = per_tensor_step_seconds(ctx)
        assert library == "bitsandbytes" and round(host / PER_TENSOR_STEP_SECONDS[library]) == want, adapter


def test_bitsandbytes_synchronizes_after_every_tensor():
    """overheads.SYNCHRONIZED_STEP: bitsandbytes' optimizer step synchronizes with the GPU inside its
    loop over the parameters (0.50: ``sync_gpu(p)`` after ``update_step``), so its host time adds to
    the kernels'. A version that drops it makes the term wrong: this fails then."""
    import inspect

    optimizer = pytest.importorskip("bitsandbytes.optim.optimizer")
    source = inspect.getsource(optimizer.Optimizer8bit.step)
    loop = source[source.index("for pindex, p in enumerate"):]
    assert "self.update_step(" in loop and "sync_gpu(p)" in loop.split("self.update_step(")[1].split("\n\n")[0]
