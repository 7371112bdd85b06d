"""The memory ledger: every tensor class a training step holds, one row each.

Strategies write rows (bytes per element, element count, a shard divisor, a location and the
step phases in which the row is resident); ``Ledger.peak`` sums the GPU rows of each phase and
takes the largest. The breakdown a user sees is the ledger itself.

Phases of one optimizer step (activations and gradients are never all resident at once):
- ``forward``: end of forward / start of backward. All saved activations and the loss' logits
  are alive; gradients are not (``zero_grad(set_to_none=True)``) unless accumulated over
  micro-batches.
- ``backward``: end of backward. Every gradient exists; of the activations only the first
  layer's (and its recomputation and backward temporaries) remain. The memory between the two
  endpoints is linear in the layer index, so its maximum is at one of them.
- ``step``: the optimizer step: gradients, states and the step's own temporaries.
"""

from dataclasses import dataclass, field
from enum import StrEnum
from math import ceil

from pydantic import BaseModel, ConfigDict


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"


ALL_PHASES = frozenset(Phase)


class Location(StrEnum):
    GPU = "gpu"
    HOST = "host"  # pinned host RAM (offload)
    UNIFIED = "unified"  # CUDA managed memory (paged optimizers): on the GPU while it fits


#: The stable term names of ``memory`` in the JSON output, in display order.
TERMS: tuple[str, ...] = (
    "weights",
    "master_weights",
    "gradients",
    "optimizer_states",
    "optimizer_step_temporaries",
    "autocast_weight_copies",
    "gathered_parameters",
    "communication_buffers",
    "activations",
    "logits",
    "cuda_context",
    "allocator_reserve",
)


def phase_sum(rows, phase: Phase, location: Location) -> int:
    """Bytes of the rows at ``location`` resident in ``phase`` (drafts and final rows alike)."""
    return sum(r.bytes for r in rows if r.location == location and phase in r.phases)


def peak_phase(rows, location: Location = Location.GPU) -> Phase:
    """The phase with the most bytes at ``location``; ties go to the earliest, so reports are stable."""
    return max(Phase, key=lambda p: (phase_sum(rows, p, location), -list(Phase).index(p)))


def terms_at(rows, phase: Phase, location: Location = Location.GPU) -> dict[str, int]:
    """Bytes per term resident in ``phase``; the values sum to ``phase_sum(rows, phase, location)``."""
    out = dict.fromkeys(TERMS, 0)
    for r in rows:
        if r.location == location and phase in r.phases:
            out[r.term] += r.bytes
    return out


_TERM_SET = frozenset(TERMS)


@dataclass(slots=True)
class RowDraft:
    """A row while strategies still adjust it (sharding sets ``shard``, offload ``location``)."""

    term: str
    label: str
    elements: float
    bytes_per_element: float
    phases: frozenset[Phase] = ALL_PHASES
    location: Location = Location.GPU
    shard: int = 1
    note: str = ""
    tag: str = ""  # an internal handle for strategies that adjust rows written by others

    @property
    def bytes(self) -> int:
        return ceil(self.elements * self.bytes_per_element / self.shard)


@dataclass
class LedgerDraft:
    rows: list[RowDraft] = field(default_factory=list)

    def add(self, term: str, label: str, elements: float, bytes_per_element: float, **kw) -> RowDraft:
        if term not in _TERM_SET:
            raise ValueError(f"unknown ledger term {term!r}")
        row = RowDraft(term, label, elements, bytes_per_element, **kw)
        if row.bytes > 0:
            self.rows.append(row)
        return row

    def of(self, *terms: str) -> list[RowDraft]:
        return [r for r in self.rows if r.term in terms]

    def tagged(self, tag: str) -> list[RowDraft]:
        return [r for r in self.rows if r.tag == tag]

    def peak_bytes(self, location: Location = Location.GPU) -> int:
        totals = dict.fromkeys(Phase, 0)
        for r in self.rows:
            if r.location == location:
                b = r.bytes
                for p in r.phases:
                    totals[p] += b
        return max(totals.values())

    def remove(self, rows: list[RowDraft]) -> None:
        self.rows = [r for r in self.rows if all(r is not x for x in rows)]


class LedgerRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    term: str
    label: str
    bytes: int  # per GPU (per rank, for host rows)
    location: Location
    phases: list[Phase]
    note: str


class Ledger(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rows: list[LedgerRow]

    @classmethod
    def from_draft(cls, draft: LedgerDraft) -> "Ledger":
        rows = [
            LedgerRow(
                term=r.term,
                label=r.label,
                bytes=r.bytes,
                location=r.location,
                phases=sorted(r.phases, key=list(Phase).index),
                note=r.note,
            )
            for r in draft.rows
        ]
        return cls(rows=rows)


class PagedInfo(BaseModel):
    """Paged optimizer state (CUDA unified memory), per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    state_bytes: int
    resident_bytes: int  # on the GPU, in the room the other terms leave
    spilled_bytes: int  # in host RAM, migrated on demand
