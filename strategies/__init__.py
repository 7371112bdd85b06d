"""The techniques planner can choose, one module each, and the registry that drives everything
per technique.

An explicit list, no import-time registration. ``REGISTRY`` is the order in which the strategies
resolve the plan layout (the adapter decides what is trained, precision the dtypes, sharding each
model-state term's divisor, offload its location) and then write the memory and time ledgers:
every row final as written (a model state placed by the layout), so the rows and the peak do not
depend on the order in which they are written (tests/test_strategies_contract.py).
``TECHNIQUES`` is the same strategies in vocabulary order (``order``): the order of
TrainingConfig's fields, of flags and of every summary. Every command, request, search space,
renderer, reader (``planner check``), alternative, emitted file and runtime hook iterates them, so
adding a technique is one module, one line here, and its tests.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from planner.core.numerics import EXACT, Rung, numerics_key
from planner.core.vocabulary import config_model
from planner.strategies import (
    adapter,
    attention,
    checkpoint_offload,
    checkpointing,
    generation,
    loss,
    method,
    offload,
    optimizer,
    precision,
    sequence_parallel,
    sharding,
    tensor_parallel,
    tiled_mlp,
)
from planner.strategies.base import Check, Engine, PlanContext, PlanLayout, Strategy

REGISTRY: tuple[Strategy, ...] = (
    adapter.STRATEGY,
    precision.STRATEGY,
    optimizer.STRATEGY,
    sharding.STRATEGY,
    tensor_parallel.STRATEGY,
    tiled_mlp.STRATEGY,  # (beside sharding: a search prunes its refusals under DDP and FSDP early)
    offload.STRATEGY,
    checkpointing.STRATEGY,
    attention.STRATEGY,
    loss.STRATEGY,
    method.STRATEGY,
    generation.STRATEGY,
    sequence_parallel.STRATEGY,
    checkpoint_offload.STRATEGY,
)
TECHNIQUES: tuple[Strategy, ...] = tuple(sorted(REGISTRY, key=lambda s: s.order))
BY_FIELD: dict[str, Strategy] = {s.field: s for s in TECHNIQUES}
FIELDS: tuple[str, ...] = tuple(BY_FIELD)

#: One fully specified training configuration: a field per technique (vocabulary order), then the
#: workload (micro_batch_size, grad_accum, seq_len). A frozen pydantic model.
SETTINGS = tuple(x for s in TECHNIQUES for x in s.settings)
if TYPE_CHECKING:  # the same model, written out (strategies/static_types.py)
    from planner.strategies.static_types import TrainingConfig
else:
    TrainingConfig = config_model([(s.field, s.enum, s.default) for s in TECHNIQUES], SETTINGS)


def summary(config, style: str = "plain", sep: str = ", ") -> str:
    """The techniques of ``config`` (a TrainingConfig or a mapping of its fields) in one line, every
    technique included (but one whose ``describe`` leaves its plain value unsaid), vocabulary order.

    Styles: ``plain`` "adamw, bf16-mixed, checkpointing full, sharding zero3, ..." (a strategy whose
    value reads alone is bare); ``named`` "optimizer adamw | ..." (every value named); ``compact``
    the short names ("ckpt full"); ``markdown`` values in backticks."""
    parts = []
    for s in TECHNIQUES:
        value = _described(s, config)
        if value == "":  # a technique whose plain value goes without saying (method sft)
            continue
        if style == "named":
            parts.append(f"{s.field} {value}")
        elif style == "markdown":
            parts.append(f"`{value}`" if s.bare else f"{s.field} `{value}`")
        elif style == "compact":
            parts.append(str(value) if s.bare else f"{s.short} {value}")
        else:
            parts.append(str(value) if s.bare else f"{s.field} {value}")
    return sep.join(parts)


def _described(s: Strategy, config) -> Any:
    """``config``'s value of ``s`` as its ``describe`` says it ("ulysses x4"; "" where it goes
    without saying), else the value itself."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    return s.describe(get) if s.describe is not None else get(s.field)


def value_words(s: Strategy, config) -> str:
    """``config``'s value of ``s`` for a table cell: as ``describe`` says it, the plain value where
    that goes without saying."""
    value = _described(s, config)
    return str(value) if value != "" else str(getattr(config, s.field))


#: The numerics ladder: every rung a choice of the registry sits on, least quality risk first.
LADDER: tuple[Rung, ...] = tuple(sorted({r for s in TECHNIQUES for r in s.numerics.values()}, key=lambda r: r.risk))


def approximations(config) -> list[tuple[str, str, Rung]]:
    """The choices of ``config`` that are not exact: (field, value, rung), least risk first."""
    out = [(s.field, str(getattr(config, s.field)), s.numerics[getattr(config, s.field)])
           for s in TECHNIQUES if getattr(config, s.field) in s.numerics]
    return sorted(out, key=lambda a: a[2].risk)


def approximation_words(config) -> list[str]:
    """The approximations of ``config`` as a user reads them, least risk first."""
    return [f"{field} {value} ({rung.words})" for field, value, rung in approximations(config)]


def numerics_of(config) -> tuple[float, ...]:
    """The plan's place on the numerics ladder (planner/core/numerics.py): () when exact."""
    return numerics_key([s.numerics.get(getattr(config, s.field), EXACT) for s in TECHNIQUES])


def ladder_key(config, job) -> tuple:
    """One order for every list of alternatives to a job (check's fixes and faster plans,
    PLAN.md's changes), the numerics ladder's as suggest ranks: a change that adds no
    approximation to ``job``'s numerics first, then the least approximation; the caller breaks
    what is left by speed."""
    n = numerics_of(config)
    return (n > numerics_of(job), n)


def approximation_note(config, job) -> str:
    """" (an approximation: ...)" naming what ``config`` approximates beyond ``job`` ("": nothing)."""
    before = {(f, v) for f, v, _ in approximations(job)}
    added = [rung.words for f, v, rung in approximations(config) if (f, v) not in before]
    return f" (an approximation: {'; '.join(added)})" if added and numerics_of(config) > numerics_of(job) else ""


def complexity(config) -> int:
    """How much a plan adds to plain training (every strategy's ``complexity`` of its choice): the
    tie-break between plans of equal speed, simpler first."""
    return sum(s.complexity.get(getattr(config, s.field), 0) for s in TECHNIQUES)


def reserve_extra(config) -> float:
    """The caching allocator's reserve the plan's techniques add beyond the base fraction, as a
    fraction of the allocated peak: the largest of its choices' ``reserve`` (not their sum: on an
    H100, beyond the base and the loss's logits hole, QLoRA with full checkpointing reserved 3.1 %
    of its allocated peak (8B), full checkpointing alone 0.6-9.5 %, QLoRA alone 2.4 % (1B);
    docs/measured.md)."""
    return max((s.reserve.get(getattr(config, s.field), 0.0) for s in TECHNIQUES), default=0.0)


#: The strategies with a choice whose memory is a staircase in the micro-batch (``Choice.convex``).
STAIRCASES: tuple[Strategy, ...] = tuple(s for s in TECHNIQUES if s.staircase)


def memory_convex(values: Mapping[str, Any]) -> bool:
    """Whether a plan's GPU memory is convex in the micro-batch: none of its choices (``values``:
    field -> value, a configuration's or a search's technique combination) is a staircase
    (``Choice.convex``)."""
    return not any(values[s.field] in s.staircase for s in STAIRCASES)


__all__ = ["LADDER", "SETTINGS", "approximations", "complexity", "memory_convex", "reserve_extra", "numerics_of",
           "BY_FIELD", "FIELDS", "REGISTRY", "TECHNIQUES", "Check", "Engine", "PlanContext", "PlanLayout",
           "Strategy", "TrainingConfig", "summary"]
