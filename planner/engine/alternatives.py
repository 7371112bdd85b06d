"""Changes to one configuration that lower its peak memory, each re-estimated.

Used by PLAN.md ("what to change first if it runs out of memory") and by `planner check`
("the cheapest changes that make it fit"). Each alternative changes one thing, keeps the
global batch (halving the micro-batch doubles accumulation), and is ranked by what it costs
in throughput; only changes that lower the peak and stay feasible are kept.
"""

from dataclasses import dataclass

from planner.engine.estimate import EstimateResult, estimate_config
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.vocabulary import Checkpointing, Loss, Offload, Optimizer, Sharding, TrainingConfig

EIGHT_BIT = {Optimizer.ADAMW: Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW: Optimizer.PAGED_ADAMW_8BIT,
             Optimizer.LION: Optimizer.LION_8BIT}
PAGED = {Optimizer.ADAMW: Optimizer.PAGED_ADAMW, Optimizer.ADAMW_8BIT: Optimizer.PAGED_ADAMW_8BIT}
DEEPER_SHARDING = {Sharding.DDP: (Sharding.ZERO2, Sharding.ZERO3, Sharding.FSDP), Sharding.ZERO1: (Sharding.ZERO2,),
                   Sharding.ZERO2: (Sharding.ZERO3,), Sharding.FSDP_GRAD_OP: (Sharding.FSDP,)}


@dataclass(frozen=True)
class Alternative:
    change: str  # "checkpointing none -> full"
    result: EstimateResult


def _variants(c: TrainingConfig, num_gpus: int) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = []
    if c.micro_batch_size > 1:
        half = c.micro_batch_size // 2
        out.append((f"micro-batch {c.micro_batch_size} -> {half} (accumulation {c.grad_accum} -> {c.grad_accum * 2})",
                    {"micro_batch_size": half, "grad_accum": c.grad_accum * 2}))
    for target in (Checkpointing.SELECTIVE, Checkpointing.FULL):
        if list(Checkpointing).index(target) > list(Checkpointing).index(c.checkpointing):
            out.append((f"checkpointing {c.checkpointing} -> {target}", {"checkpointing": target}))
    if c.loss == Loss.STANDARD:
        out.append(("loss standard -> chunked", {"loss": Loss.CHUNKED}))
    for table, what in ((EIGHT_BIT, "8-bit states"), (PAGED, "paged states")):
        if c.optimizer in table:
            out.append((f"optimizer {c.optimizer} -> {table[c.optimizer]} ({what})", {"optimizer": table[c.optimizer]}))
    for s in DEEPER_SHARDING.get(c.sharding, ()):
        out.append((f"sharding {c.sharding} -> {s}", {"sharding": s}))
    if num_gpus == 1 and c.sharding == Sharding.NONE:
        out.append(("sharding none -> zero3 (DeepSpeed on one GPU)", {"sharding": Sharding.ZERO3}))
    if c.offload == Offload.NONE:
        if c.sharding in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3):
            out.append(("offload none -> optimizer", {"offload": Offload.OPTIMIZER}))
        if c.sharding in (Sharding.ZERO3, Sharding.FSDP, Sharding.FSDP_HYBRID, Sharding.FSDP_GRAD_OP):
            out.append(("offload none -> optimizer+params", {"offload": Offload.OPTIMIZER_PARAMS}))
    return out


def memory_savers(model: ModelSpec, hardware: HardwareSpec, config: TrainingConfig, margin: float = 0.0,
                  baseline: EstimateResult | None = None) -> list[Alternative]:
    """Feasible one-step changes that lower the peak, fastest first."""
    base = baseline or estimate_config(model, hardware, config, margin)
    out = []
    for change, update in _variants(config, hardware.num_gpus):
        result = estimate_config(model, hardware, config.model_copy(update=update), margin)
        if result.feasible and result.memory["peak"] < base.memory["peak"]:
            out.append(Alternative(change, result))
    out.sort(key=lambda a: (-a.result.time.tokens_per_second, a.result.memory["peak"]))
    return out
