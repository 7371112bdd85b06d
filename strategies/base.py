"""What every strategy shares: the planning context and the Strategy record.

A strategy owns one vocabulary field: its choices, when a choice is infeasible (reasons, never
an exception), warnings, its rows in the per-rank memory ledger, and its rows in the step-time
ledger (planner.core.timing), and its fragment of each emitted file (planner.core.emitted). Strategies run in registry
order (``strategies.REGISTRY``); later ones may adjust rows earlier ones wrote (sharding sets
shard divisors, offload moves rows to host).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from planner.core.emitted import EmitDraft
from planner.core.ledger import Ledger, LedgerDraft, PagedInfo
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.timing import TimeDraft
from planner.core.vocabulary import Sharding, TrainingConfig


class Engine(StrEnum):
    """Which software owns the training step, which decides the memory layout."""

    TORCH = "torch"  # plain PyTorch / DDP with torch autocast
    DEEPSPEED = "deepspeed"  # ZeRO stages 1-3
    FSDP = "fsdp"  # PyTorch FSDP2 (fully_shard)


def engine_of(sharding: Sharding) -> Engine:
    if sharding in (Sharding.ZERO1, Sharding.ZERO2, Sharding.ZERO3):
        return Engine.DEEPSPEED
    if sharding in (Sharding.FSDP, Sharding.FSDP_GRAD_OP, Sharding.FSDP_HYBRID):
        return Engine.FSDP
    return Engine.TORCH


@dataclass(frozen=True)
class PlanContext:
    model: ModelSpec
    hardware: HardwareSpec
    config: TrainingConfig

    @property
    def world_size(self) -> int:
        return self.hardware.num_gpus

    @cached_property
    def engine(self) -> Engine:
        return engine_of(self.config.sharding)


@dataclass
class Check:
    """What a strategy says about a configuration before any row is written.

    ``codes`` are short, stable reasons (the search counts rejections by them); ``infeasible``
    holds the full sentences a user reads, in the same order."""

    infeasible: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def reject(self, code: str, message: str) -> None:
        self.codes.append(code)
        self.infeasible.append(message)


def no_time(ctx: "PlanContext", ledger: Ledger, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """For strategies whose choice costs no step time of its own."""


def no_emit(ctx: "PlanContext", files: EmitDraft) -> None:
    """For strategies that add nothing to the emitted files."""


@dataclass(frozen=True)
class Strategy:
    field: str  # the TrainingConfig field this strategy owns
    choices: tuple[str, ...]
    check: Callable[[PlanContext, Check], None]
    apply: Callable[[PlanContext, LedgerDraft], None]
    time: Callable[[PlanContext, Ledger, PagedInfo | None, TimeDraft], None] = no_time
    emit: Callable[[PlanContext, EmitDraft], None] = no_emit
