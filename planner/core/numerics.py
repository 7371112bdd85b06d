"""Numerics: which choices change the training math, and the ladder of how much.

Exact choices compute what fp32-master AdamW computes under bf16/fp16 autocast, up to the
rounding of a different kernel or summation order: sharding (DDP, ZeRO, FSDP), offload, paging,
activation checkpointing, fused or eager attention, a chunked or fused loss, fp32 or fp16-mixed
(with dynamic loss scaling) instead of bf16-mixed. Approximations change what is computed or
stored; different methods change the learning algorithm (hyperparameters do not carry over).

The ladder is data: each approximation is a ``Rung`` (its place by ``risk``, least quality risk
first; what it changes in a phrase; the evidence for its place), declared by the strategy whose
choices sit on it (``Strategy.numerics``). ``strategies.LADDER`` is every rung of the registry in
order; help text and docs are generated from it.

A plan's numerics key is its rungs' risks, largest first: () is exact; comparing keys orders plans
from least to most quality risk (the largest rung decides, then the next, then how many).
"""

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Rung:
    """One rung of the numerics ladder."""

    name: str  # a stable identifier
    risk: float  # the place on the ladder: 0 exact, larger = more quality risk
    words: str  # what it changes, in a phrase a user reads
    source: str = ""  # the evidence for its place
    named_only: bool = False  # a different method: never chosen for the user, only when named


EXACT = Rung("exact", 0.0, "exact numerics")


class NumericsPolicy(StrEnum):
    """``--numerics``: exact plans only; the ladder (exact when one fits, else the least
    approximation that fits: the default); or any plan, ranked by speed."""

    EXACT = "exact"
    LADDER = "ladder"
    ANY = "any"


def numerics_key(rungs: list[Rung]) -> tuple[float, ...]:
    """The ordering key of a plan's approximations: its rungs' risks, largest first (() when exact)."""
    return tuple(sorted((r.risk for r in rungs if r.risk > 0), reverse=True))


def ladder_phrase(ladder: tuple[Rung, ...], short: bool = False) -> str:
    """The approximations of the ladder in one line, least risk first: "8-bit optimizer states <
    fp8 matmuls < ..." (``short``: the rungs' names); different methods are not on it."""
    return " < ".join(r.name if short else r.words for r in ladder if not r.named_only)
