"""The optimizer step's own memory and traffic, against torch's AdamW on real CPU tensors.

torch's AdamW runs one of three implementations: the fused kernel (the Trainer's
``adamw_torch_fused``, planner's ``adamw``), the multi-tensor foreach kernels (``adamw_torch``, the
default where ``fused`` is not asked for on CUDA: ``adamw-foreach``) and the single-tensor loop
(host tensors). The foreach step allocates ``sqrt(exp_avg_sq)`` for every tensor at once
(torch/optim/adam.py ``_multi_tensor_adam``); planner's ledger holds it at the step
(planner/cost/optimizer_states.py ``foreach_step_temporary``). Measured here with the CPU allocator
(torch profiler memory events, as tests/test_loss_path.py), over a second step (states exist).
"""

import pytest

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.core.ledger import Phase
from planner.cost.optimizer_states import foreach_step_temporary
from planner.engine.estimate import estimate_config
from planner.strategies import TrainingConfig

torch = pytest.importorskip("torch")

SHAPES = ((64, 1024), (128, 1024), (256, 1024), (512, 1024), (1000,))


def _step_peak(dtype, **implementation) -> tuple[int, int]:
    """(peak bytes allocated during a second AdamW step above its start, the states' bytes)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(shape, dtype=dtype)) for shape in SHAPES]
    opt = torch.optim.AdamW(ps, lr=1e-3, **implementation)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, record_function("step"):
        opt.step()
    live = top = 0
    events = prof.profiler.kineto_results.events()
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        live += nbytes
        top = max(top, live)
    states = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    return top, states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_foreach_step_holds_one_second_moment_and_the_fused_none(dtype):
    foreach, states = _step_peak(dtype, foreach=True)
    assert abs(foreach - foreach_step_temporary(states)) <= 64, (foreach, states)  # (python-side scalars)
    fused, _ = _step_peak(dtype, fused=True)
    assert fused <= 64, fused


def _plan(optimizer: str, gpus: str = "1xA100-80", **extra):
    cfg = TrainingConfig(precision="bf16-mixed", optimizer=optimizer, micro_batch_size=1, seq_len=1024,
                         checkpointing="full", **extra)
    return estimate_config(resolve_model("meta-llama/Llama-3.2-1B"), parse_gpus(gpus), cfg)


@pytest.mark.parametrize("gpus, sharding", [("1xA100-80", "none"), ("4xA100-80", "zero2"), ("4xA100-80", "fsdp")])
def test_a_foreach_plan_holds_the_copy_at_the_step_and_moves_more(gpus, sharding):
    """adamw-foreach holds half its per-GPU states once more at the step (sharded as they are; its
    step counters are host scalars, the fused kernel's are on the GPU); its step moves 14
    state-sized passes, the fused kernel's 4 (and the gradients twice), with the same clipping
    passes."""
    fused, foreach = _plan("adamw", gpus, sharding=sharding), _plan("adamw-foreach", gpus, sharding=sharding)
    rows = {r.label: r for r in foreach.ledger}
    temp = rows["foreach sqrt(exp_avg_sq), every tensor at once"]
    states = next(r for r in foreach.ledger if r.term == "optimizer_states" and r.label.startswith("optimizer states"))
    assert temp.bytes == foreach_step_temporary(states.bytes) and temp.phases == [Phase.STEP]
    assert not any("foreach" in r.label for r in fused.ledger)
    # (less the fused kernel's step counters on the GPU, and the allocator reserve's share of them)
    assert foreach.phase_peaks[Phase.STEP] - fused.phase_peaks[Phase.STEP] >= 0.999 * temp.bytes
    step = {p.config.optimizer: next(r.seconds for r in p.time.rows if r.label.endswith("step on the GPU"))
            for p in (fused, foreach)}
    clip = {p.config.optimizer: next(r.seconds for r in p.time.rows if r.label.startswith("gradient clipping"))
            for p in (fused, foreach)}
    assert clip["adamw"] == clip["adamw-foreach"] > 0
    assert 1.9 < step["adamw-foreach"] / step["adamw"] < 3.5, step  # (ZeRO's fp32 upcast passes are shared)
