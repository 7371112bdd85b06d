"""Changes to one configuration that lower its peak memory, each re-estimated.

Used by PLAN.md ("what to change first if it runs out of memory") and by `planner check`
("the cheapest changes that make it fit"). Each alternative changes one thing, keeps the
global batch (halving the micro-batch doubles accumulation), and is ranked by what it costs
in throughput; only changes that lower the peak and stay feasible are kept.
"""


from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import estimate_config
from planner.schema.estimate import Alternative, EstimateResult
from strategies import TECHNIQUES, TrainingConfig


def _variants(c: TrainingConfig, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    """Halving the micro-batch (the workload's own change), then every technique's savers."""
    out: list[tuple[str, dict]] = []
    if c.micro_batch_size > 1:
        half = c.micro_batch_size // 2
        out.append((f"micro-batch {c.micro_batch_size} -> {half} (accumulation {c.grad_accum} -> {c.grad_accum * 2})",
                    {"micro_batch_size": half, "grad_accum": c.grad_accum * 2}))
    for s in TECHNIQUES:
        out += s.savers(c, hardware)
    return out


def memory_savers(model: ModelSpec, hardware: HardwareSpec, config: TrainingConfig, margin: float = 0.0,
                  baseline: EstimateResult | None = None) -> list[Alternative]:
    """Feasible one-step changes that lower the peak, fastest first."""
    base = baseline or estimate_config(model, hardware, config, margin)
    out = []
    for change, update in _variants(config, hardware):
        result = estimate_config(model, hardware, config.model_copy(update=update), margin)
        if result.feasible and result.memory["peak"] < base.memory["peak"]:
            out.append(Alternative(change, result))
    out.sort(key=lambda a: (-a.result.time.tokens_per_second, a.result.memory["peak"]))
    return out
