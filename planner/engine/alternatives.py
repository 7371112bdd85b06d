"""Changes to one configuration, each re-estimated: those that lower its peak memory, and those
that make it faster.

Used by PLAN.md ("what to change first if it runs out of memory") and by `planner check`
("the cheapest changes that make it fit"; "faster and fits"). Every change keeps the global
batch (halving the micro-batch doubles accumulation). ``memory_savers``: one change, ranked by
what it costs in throughput; only changes that lower the peak and stay feasible are kept.
``faster_changes``: a bounded neighbourhood of the job, never a search of the whole space.
"""

from collections.abc import Callable
from itertools import product

from planner.core.lengths import Lengths
from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import estimate_config, evaluate
from planner.engine.ranking import TIE_BAND
from planner.engine.space import reshaped
from planner.schema.estimate import Alternative, EstimateResult
from planner.strategies import TECHNIQUES, TrainingConfig, approximation_note, ladder_key


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
                  baseline: EstimateResult | None = None, lengths: Lengths | None = None) -> list[Alternative]:
    """Feasible one-step changes that lower the peak: those that add no approximation to the job's
    numerics first, then the least approximation (labelled), each fastest first (``ladder_key``).
    ``lengths``: the samples' token counts, which shape a padded micro-batch of another size."""
    base = baseline or estimate_config(model, hardware, config, margin)
    out = []
    for change, update in _variants(config, hardware):
        result = estimate_config(model, hardware, reshaped(config.model_copy(update=update), lengths), margin)
        if result.feasible and result.memory["peak"] < base.memory["peak"]:
            out.append(Alternative(change + approximation_note(result.config, config), result))
    out.sort(key=lambda a: (ladder_key(a.result.config, config), -a.result.time.tokens_per_second, a.result.memory["peak"]))
    return out


def _neighbours(c: TrainingConfig) -> list[dict]:
    """The changes ``faster_changes`` tries: every other value of one technique the search tries
    (the training method, a strategy that takes "any" such as the adapter, stays the job's), every
    other micro-batch that divides the per-GPU batch (accumulation re-derived), and each technique
    change with each micro-batch. About (values x micro-batches) configurations: ~250 for a
    64-sequence batch, against the ~35,000 of the whole space."""
    per_gpu = c.micro_batch_size * c.grad_accum
    batches: list[dict] = [{}] + [{"micro_batch_size": b, "grad_accum": per_gpu // b}
                      for b in range(1, per_gpu + 1) if per_gpu % b == 0 and b != c.micro_batch_size]
    techniques: list[dict] = [{}] + [{s.field: v} for s in TECHNIQUES if not (s.any_choice or s.named)
                         for v in (s.searched or tuple(s.enum)) if v != getattr(c, s.field)]
    return [t | b for t, b in product(techniques, batches) if t or b]


def faster_changes(model: ModelSpec, hardware: HardwareSpec, config: TrainingConfig, margin: float,
                   baseline: EstimateResult, limit: int, lengths: Lengths | None = None,
                   keep: Callable[[TrainingConfig], bool] = lambda c: True) -> list[EstimateResult]:
    """Configurations one technique and / or the micro-batch away from ``config`` that fit and are
    faster than ``baseline`` beyond the ranking's tie band (a smaller gain is within the model's
    error, planner/engine/ranking.py ``TIE_BAND``): those that add no approximation to its numerics first, then the least
    approximation (``ladder_key``), each fastest first (ties: lower peak), at most ``limit``, each
    estimated in full. A bounded search: ``_neighbours``, evaluated without result objects.
    ``lengths``: as ``memory_savers``'; ``keep``: which configurations may be offered (what the job's
    launcher can express)."""
    found = []
    for i, update in enumerate(_neighbours(config)):
        ev = evaluate(model, hardware, reshaped(config.model_copy(update=update), lengths), margin, skip_infeasible=True)
        if ev.fits and ev.tokens_per_second > baseline.time.tokens_per_second * (1 + TIE_BAND) and keep(ev.ctx.config):
            found.append((ladder_key(ev.ctx.config, config), -ev.tokens_per_second, ev.peak, i, ev.ctx.config))
    return [estimate_config(model, hardware, c, margin) for *_, c in sorted(found)[:limit]]
