"""The order in which fitting plans are offered: numerics first, then speed, with ties.

1. **Numerics** (planner/core/numerics.py, ``--numerics``): under ``ladder`` (the default) the
   plans offered are the exact ones when one fits, otherwise those of the least approximation
   that fits (``allowed_levels``); ``exact`` offers exact plans only; ``any`` every plan, by speed.
   Faster plans that change numerics are shown beside the winner (``_trade_offs``), never instead.
2. **Ties.** Plans within ``TIE_BAND`` of the fastest are ties, broken toward the plan whose
   speed rests on no assumed rate (``Candidate.rests``: paged state's migration, a CPU optimizer
   step; planner/core/timing.py ``ASSUMED_RATE_TERMS``; whether, not how much, so every
   micro-batch of a combination says the same and the sized search stays exact), then the
   simpler plan (``strategies.complexity``: bf16 over fp16, no offload, no sharding where replicas
   fit, fewer techniques), then by speed, then by lower peak.
3. **Headroom.** Ties go to room: a listed plan that leaves less than ``HEADROOM`` of the usable
   GPU memory free gives way to a smaller micro-batch of the same techniques (the global batch
   kept by more accumulation) that leaves at least that much and stays within ``TIE_BAND`` of
   its speed (planner/engine/suggest.py ``_roomier``); then the listed plans are ordered again
   with such a thin plan after every tied plan that has room (``Candidate.thin``, the tie-break
   after ``rests``). The model's error against published runs (docs/world.md) is larger than the
   safety margin, and a tie is no reason to take that risk. The search itself ranks without it
   (its records hold each combination's largest micro-batch that fits), so both engines'
   answers stay the same; the suggest step applies it to what they list.
4. **Distinct alternatives.** Each family (optimizer, precision with bf16/fp16-mixed as one,
   checkpointing, sharding engine, offload, sequence-parallel degree) is represented by its best
   plan; near-copies (another loss, micro-batch, or FSDP
   reshard setting of the same family) are not listed twice.

Why 5 %: the step-time model is held to published throughput within ±10 % (tests/
test_step_time_published.py); two plans for the same model on the same GPU share most of that
error (one efficiency table, one FLOP count), so a difference under half of it is not evidence
that one plan is faster. A judgement, stated, not a fit.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from planner.core.numerics import NumericsPolicy
from planner.strategies import complexity, numerics_of
from planner.strategies.precision import SIXTEEN_BIT_MIXED
from planner.strategies.sharding import engine_of

TIE_BAND = 0.05
#: The free share of usable GPU memory below which a tied plan with more room is preferred.
HEADROOM = 0.10


@dataclass(frozen=True)
class Candidate:
    """A fitting plan as the ranking sees it (``item`` is the caller's record)."""

    item: Any  # the caller's record
    config: Any  # a TrainingConfig (or any object with its technique fields)
    tokens_per_second: float
    peak: int
    rests: float = 0.0  # the fraction of its step at rates planner assumes
    thin: bool = False  # leaves less than HEADROOM of the usable GPU memory free (set after the search)

    @property
    def numerics(self) -> tuple[float, ...]:
        return numerics_of(self.config)

    @property
    def family(self) -> tuple:
        return family(self.config)


def family(c) -> tuple:
    """Plans a user would call the same: bf16- and fp16-mixed are one family (the same states and
    speed; the tie-break prefers bf16 where it exists); each sequence- and tensor-parallel degree is
    a family of its own (another layout of the GPUs)."""
    precision = "16-bit mixed" if c.precision in SIXTEEN_BIT_MIXED else c.precision
    return (c.optimizer, precision, c.checkpointing, engine_of(c.sharding), c.offload, c.sequence_shards, c.tensor_shards)


def pick(cands: list[Candidate], band: float = TIE_BAND) -> Candidate:
    """The plan to offer first among ``cands``: of those within ``band`` of the fastest, one whose
    speed rests on no assumed rate, then one with room (not ``thin``), the simplest, then the
    fastest, then the lowest peak."""
    fastest = max(c.tokens_per_second for c in cands)
    ties = [c for c in cands if c.tokens_per_second >= fastest * (1 - band)]
    return min(ties, key=lambda c: (c.rests > 0, c.thin, complexity(c.config), -c.tokens_per_second, c.peak))


def order(cands: list[Candidate], band: float = TIE_BAND, limit: int | None = None) -> list[Candidate]:
    """Best family representatives first, each chosen and ordered by ``pick``."""
    families: dict[tuple, list[Candidate]] = {}
    for c in cands:
        families.setdefault(c.family, []).append(c)
    left = [pick(members, band) for members in families.values()]
    out: list[Candidate] = []
    while left and (limit is None or len(out) < limit):
        best = pick(left, band)
        out.append(best)
        left.remove(best)
    return out


def levels(cands: Iterable[Candidate]) -> dict[tuple[float, ...], list[Candidate]]:
    """Candidates by numerics key, least quality risk first."""
    out: dict[tuple[float, ...], list[Candidate]] = {}
    for c in cands:
        out.setdefault(c.numerics, []).append(c)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Ranking:
    plans: list[Candidate]  # best first, distinct families
    exact_fits: bool
    trade_offs: list[Candidate]  # approximations faster than the winner beyond the band (least risk first)
    least: Candidate | None  # the ladder's winner: the best plan of the least approximation that fits


def allowed_levels(cands: list[Candidate], policy: NumericsPolicy) -> set[tuple[float, ...]]:
    """The numerics levels ``policy`` lets a plan come from, given what fits: any; exact only; or
    (ladder) exact when an exact plan fits, else the least approximation that fits."""
    keys = {c.numerics for c in cands}
    if policy == NumericsPolicy.ANY:
        return keys
    if policy == NumericsPolicy.EXACT or () in keys:
        return {()}
    return {min(keys)} if keys else set()


def rank(cands: list[Candidate], policy: NumericsPolicy, limit: int, band: float = TIE_BAND) -> Ranking:
    """The plans to offer (those of the levels ``policy`` allows, ``order``ed) and, beside the
    winner, what approximations would buy."""
    by_level = levels(cands)
    allowed = allowed_levels(cands, policy)
    plans = order([c for c in cands if c.numerics in allowed], band, limit)
    least = pick(next(iter(by_level.values())), band) if by_level else None
    return Ranking(plans, () in by_level, _trade_offs(plans[0] if plans else None, by_level, band), least)


def _trade_offs(winner: Candidate | None, by_level: dict, band: float) -> list[Candidate]:
    """What approximations would buy beside the winner: the least-risk level whose best plan is
    faster beyond the band, and the fastest plan of all (when it is another one)."""
    if winner is None:
        return []
    gain = winner.tokens_per_second * (1 + band)
    faster = []
    for key, members in by_level.items():
        beyond = [c for c in members if c.tokens_per_second > gain]
        if key > winner.numerics and beyond:
            faster.append(pick(beyond, band))
    if not faster:
        return []
    least = faster[0]
    fastest = max(faster, key=lambda c: c.tokens_per_second)
    return [least] if fastest is least else [least, fastest]


def searched(outcome, records: Iterable | None = None) -> list[Candidate]:
    """Candidates of a search's records (planner/engine/search.py ``Record``): its fitting ones
    unless ``records`` says which."""
    return [Candidate(r, outcome.config(r), r.tokens_per_second, r.peak, r.rests)
            for r in (outcome.fitting if records is None else records)]


def distinct(cands: Iterable[Candidate]) -> list[Candidate]:
    """The first candidate of each family, in the given order (no near-copies)."""
    seen: dict[tuple, Candidate] = {}
    for c in cands:
        seen.setdefault(c.family, c)
    return list(seen.values())
