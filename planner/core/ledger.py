"""The memory ledger: every tensor class a training step holds, one row each.

Strategies write rows (bytes per element, element count, a shard divisor, a location and the
step phases in which the row is resident); ``Ledger.peak`` sums the GPU rows of each phase and
takes the largest. The breakdown a user sees is the ledger itself.

Phases of one optimizer step (activations and gradients are never all resident at once):
- ``forward``: end of forward / start of backward, up to the last decoder layer's backward. All
  saved activations and the loss's largest moment are alive; gradients are not
  (``zero_grad(set_to_none=True)``) unless accumulated over micro-batches.
- ``backward``: the decoder layers' backward, at the first layer. Every gradient but the input
  embedding's (made last) exists; of the activations only that layer's (recomputed or kept) and
  its backward temporaries remain. The memory between the forward endpoint and this one is
  linear in the layer index, so its maximum is at one of them.
- ``backward_end``: the embeddings' backward. Every gradient exists; a tied embedding's gradient
  meets the head's, and sharded engines reduce the root unit's gradients.
- ``step``: the optimizer step: gradients, states and the step's own temporaries.
- ``rollout`` (GRPO only): generating completions and scoring them between two optimizer steps:
  the persistent rows, the generation engine (vLLM's share of the GPU, or transformers' KV cache)
  and the no-grad forwards' transients; no activations, no gradients.
"""

from dataclasses import dataclass, field, replace
from enum import StrEnum
from math import ceil

from pydantic import ConfigDict

from planner.core.record import Record


class Phase(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"
    BACKWARD_END = "backward_end"
    STEP = "step"
    #: GRPO's generation and scoring between two optimizer steps (strategies/generation.py):
    #: the persistent rows (``ALL_PHASES``) and the rollout's own; no activations, no gradients
    ROLLOUT = "rollout"


ALL_PHASES = frozenset(Phase)
PHASES = tuple(Phase)  # in order, for the hot loops (iterating the enum class is slower)


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
    "generation_engine",
)


def resident(rows, phase: Phase, location: Location = Location.GPU) -> list:
    """The rows at ``location`` resident at ``phase``'s peak: the rows of no moment, plus those of the
    phase's largest moment. A row's ``moment`` names one of alternative instants within its phases
    (e.g. the loss, or the last layer's forward): rows of different moments never coexist."""
    here = [r for r in rows if r.location == location and phase in r.phases]
    moments: dict[str, int] = {}
    for r in here:
        if r.moment:
            moments[r.moment] = moments.get(r.moment, 0) + r.bytes
    largest = max(moments, key=lambda k: moments[k]) if moments else ""
    return [r for r in here if r.moment in ("", largest)]  # in ledger order


def phase_sum(rows, phase: Phase, location: Location) -> int:
    """Bytes at ``location`` at ``phase``'s peak (drafts and final rows alike)."""
    return sum(r.bytes for r in resident(rows, phase, location))


def peak_phase(rows, location: Location = Location.GPU) -> Phase:
    """The phase with the most bytes at ``location``; ties go to the earliest, so reports are stable."""
    return max(Phase, key=lambda p: (phase_sum(rows, p, location), -list(Phase).index(p)))


def terms_at(rows, phase: Phase, location: Location = Location.GPU) -> dict[str, int]:
    """Bytes per term resident at ``phase``'s peak; the values sum to ``phase_sum(rows, phase, location)``."""
    out = dict.fromkeys(TERMS, 0)
    for r in resident(rows, phase, location):
        out[r.term] += r.bytes
    return out


_TERM_SET = frozenset(TERMS)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one tensor class lives and how many ranks share it, resolved once per plan (the sharding
    strategy decides the divisor, offload the location: strategies.PlanLayout.placement) and applied
    by whoever writes a row of the class, so no row is rewritten after it is written.

    ``shard``: ranks sharing one copy; a row holds 1/shard of its bytes, rounded up.
    ``chunks``: FSDP2's padded dim-0 chunks, ((elements of a whole tensor set, rank 0's elements of
    that set), ...): a row whose bytes are a whole multiple of a set's elements holds rank 0's
    chunks of it (``fully_shard`` gives rank 0 ceil(dim0 / N) rows of every tensor), any other
    row an even 1/shard.
    ``location``: GPU, or HOST where offload keeps the class in pinned host memory (a row written
    for unified memory stays there unless the class is offloaded)."""

    shard: int = 1
    location: Location = Location.GPU
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def replicated(self) -> "Placement":
        """The class's location with every rank holding the whole row (per-tensor scalars, QLoRA's
        quantization state: module attributes, not parameters)."""
        return replace(self, shard=1, chunks=())

    def split(self, elements: float, bytes_per_element: float) -> tuple[float, float, int]:
        """(elements, bytes per element, shard divisor) of a row of this class on one rank."""
        total = elements * bytes_per_element
        whole = next(((count, rank0) for count, rank0 in self.chunks if total % count == 0), None)
        if whole is not None:
            return whole[1], total // whole[0], 1
        return elements, bytes_per_element, self.shard

    def gpu_bytes(self, elements: float, bytes_per_element: float) -> int:
        """Bytes on this rank's GPU of a row of this class (0 when the class lives elsewhere)."""
        if self.location != Location.GPU:
            return 0
        elements, bytes_per_element, shard = self.split(elements, bytes_per_element)
        return ceil(elements * bytes_per_element / shard)


ON_GPU = Placement()


@dataclass(slots=True)
class RowDraft:
    """A row as a strategy writes it (its ``shard`` and ``location`` from its class's Placement)."""

    term: str
    label: str
    elements: float
    bytes_per_element: float
    phases: frozenset[Phase] = ALL_PHASES
    location: Location = Location.GPU
    shard: int = 1
    note: str = ""
    tag: str = ""  # what the row holds, for readers beyond its term (an adapter's frozen base)
    moment: str = ""  # one of alternative instants within its phases (see ``resident``)
    #: bytes on one rank: ceil(elements x bytes per element / shard), computed once (rows are final
    #: as written; the peaks read it tens of times per candidate)
    bytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.bytes = ceil(self.elements * self.bytes_per_element / self.shard)


@dataclass
class LedgerDraft:
    rows: list[RowDraft] = field(default_factory=list)

    def add(self, term: str, label: str, elements: float, bytes_per_element: float, place: Placement | None = None,
            **kw) -> RowDraft:
        """A row, final as written; ``place``: its tensor class's placement (sharded, offloaded)."""
        if term not in _TERM_SET:
            raise ValueError(f"unknown ledger term {term!r}")
        if place is not None:
            elements, bytes_per_element, kw["shard"] = place.split(elements, bytes_per_element)
            if place.location != Location.GPU:
                kw["location"] = place.location
        row = RowDraft(term, label, elements, bytes_per_element, **kw)
        if row.bytes > 0:
            self.rows.append(row)
        return row

    def of(self, *terms: str) -> list[RowDraft]:
        return [r for r in self.rows if r.term in terms]

    def peak_bytes(self, location: Location = Location.GPU) -> int:
        """The largest ``phase_sum`` at ``location``, in one walk over the rows."""
        base = dict.fromkeys(PHASES, 0)
        moments: dict[Phase, dict[str, int]] = {p: {} for p in PHASES}
        for r in self.rows:
            if r.location != location:
                continue
            for p in r.phases:
                if r.moment:
                    moments[p][r.moment] = moments[p].get(r.moment, 0) + r.bytes
                else:
                    base[p] += r.bytes
        return max(base[p] + max(moments[p].values(), default=0) for p in PHASES)

    def remove(self, rows: list[RowDraft]) -> None:
        self.rows = [r for r in self.rows if all(r is not x for x in rows)]


class LedgerRow(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    term: str
    label: str
    bytes: int  # per GPU (per rank, for host rows)
    location: Location
    phases: list[Phase]
    note: str
    moment: str = ""  # one of alternative instants within its phases (planner.core.ledger.resident)


class Ledger(Record):
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
                moment=r.moment,
            )
            for r in draft.rows
        ]
        return cls(rows=rows)


class PagedInfo(Record):
    """Paged optimizer state (CUDA unified memory), per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    state_bytes: int
    resident_bytes: int  # on the GPU, in the room the other terms leave
    spilled_bytes: int  # in host RAM, migrated on demand


#: Ledger terms that are not tensors torch allocates: the CUDA context and NCCL's buffers, the
#: caching allocator's reserve and the engines' stream pools (reserved, not allocated), and a
#: colocated vLLM engine's share of the GPU (one budget vLLM fills itself: no fragmentation of
#: the training's allocations applies to it).
NOT_ALLOCATED = ("cuda_context", "allocator_reserve", "generation_engine")
#: Ledger terms outside torch's caching allocator: what the driver shows beyond its reserved peak.
NOT_RESERVED = ("cuda_context",)


class GpuPeaks:
    """The GPU peak and the peak without the ``outside`` terms (before paged state), over rows
    added in batches: per phase the rows of no moment plus those of its largest moment
    (``resident``). An evaluation adds its floor's rows, reads the floor, then adds the rest: each
    row is walked once (the hot path of every evaluation)."""

    __slots__ = ("outside", "base", "base_allocated", "moments", "moments_allocated", "everywhere",
                 "everywhere_allocated")

    def __init__(self, outside: tuple[str, ...] = NOT_ALLOCATED) -> None:
        self.outside = outside
        self.base, self.base_allocated = dict.fromkeys(PHASES, 0), dict.fromkeys(PHASES, 0)
        self.moments: dict[Phase, dict[str, int]] = {p: {} for p in PHASES}
        self.moments_allocated: dict[Phase, dict[str, int]] = {p: {} for p in PHASES}
        self.everywhere = self.everywhere_allocated = 0  # rows of no moment in every phase: most of them

    def add(self, rows) -> "GpuPeaks":
        outside, moments, moments_allocated = self.outside, self.moments, self.moments_allocated
        base, base_allocated = self.base, self.base_allocated
        for r in rows:
            if r.location != Location.GPU:
                continue
            n, allocated = r.bytes, r.term not in outside
            if not r.moment and r.phases is ALL_PHASES:
                self.everywhere += n
                if allocated:
                    self.everywhere_allocated += n
                continue
            for p in r.phases:
                if r.moment:
                    moments[p][r.moment] = moments[p].get(r.moment, 0) + n
                    if allocated:
                        moments_allocated[p][r.moment] = moments_allocated[p].get(r.moment, 0) + n
                else:
                    base[p] += n
                    if allocated:
                        base_allocated[p] += n
        return self

    @property
    def peaks(self) -> tuple[int, int]:
        """(the GPU peak, the peak without the ``outside`` terms) of the rows added so far."""
        return (self.everywhere + max(self.base[p] + max(self.moments[p].values(), default=0) for p in PHASES),
                self.everywhere_allocated + max(self.base_allocated[p] + max(self.moments_allocated[p].values(),
                                                                             default=0) for p in PHASES))


def gpu_peaks(rows, outside: tuple[str, ...] = NOT_ALLOCATED) -> tuple[int, int]:
    """(the GPU peak, the peak without the ``outside`` terms, before paged state) in one pass over
    the rows (``GpuPeaks``); by default the second is torch's allocated peak (``allocated_peak``).
    The GPU peak equals ``LedgerDraft.peak_bytes()``."""
    return GpuPeaks(outside).add(rows).peaks


def allocated_peak(rows, paged: PagedInfo | None = None) -> int:
    """torch's allocated peak (``torch.cuda.max_memory_allocated``), bytes: the largest phase of the
    GPU rows less the ``NOT_ALLOCATED`` terms, each phase with only the rows it holds (a stream pool
    lives in its own phases), less paged state placed on the GPU (CUDA managed memory, outside the
    allocator; resident in every phase)."""
    return gpu_peaks(rows)[1] - (paged.resident_bytes if paged else 0)


def reserved_peak(rows, paged: PagedInfo | None = None) -> int:
    """torch's reserved peak (``torch.cuda.max_memory_reserved``), bytes: the largest phase of the
    GPU rows less the ``NOT_RESERVED`` terms (the CUDA context, the driver's reservation and NCCL's
    buffers, which the calibration measures as the driver's figure less torch's reserved one), less
    paged state on the GPU (managed memory, outside the allocator). The GPU peak beyond it is what
    a monitor adds: nvidia-smi's used memory."""
    return gpu_peaks(rows, NOT_RESERVED)[1] - (paged.resident_bytes if paged else 0)
