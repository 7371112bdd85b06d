"""The step-time ledger: what one optimizer step spends its seconds on, every term shown.

Strategies add rows (compute per micro-batch, communication with the compute it can hide
under, host transfers, the optimizer step); ``assemble`` resolves overlap and sums the step:

    step = accum * (per pass: max(compute, kernel launches) + exposed per-micro-batch communication)
           + per-step terms (optimizer step, exposed end-of-step communication, CPU step, ...)

Overlap: a communication row names the pass that hides it (the forward or the backward of the
same micro-batch, as long as the longer of its compute and its launches); of that window
``OVERLAP_EFFICIENCY`` is usable, and what does not fit is exposed. Source for overlap in
DDP/ZeRO/FSDP: Li et al. 2020 "PyTorch Distributed" (bucketed all-reduce during backward);
Zhao et al. 2023 "PyTorch FSDP" (prefetch).
"""

from dataclasses import dataclass, field
from enum import StrEnum

from pydantic import ConfigDict

from planner.core.record import Record

#: Fraction of a compute window that communication can hide under: kernels of both compete for
#: SMs and memory bandwidth. Assumption (FSDP paper, Fig. 8, shows near-full but not full overlap).
OVERLAP_EFFICIENCY = 0.8

TIME_TERMS: tuple[str, ...] = (
    "matmul",
    "attention",
    "elementwise",
    "recompute",
    "loss",
    "dispatch",
    "communication",
    "offload",
    "cpu_optimizer_step",
    "optimizer_step",
    "paged_migration",
    "generation",
)


#: Terms whose rate is a property of the host, not of the GPU's datasheet: assumed
#: (planner/cost/overheads.py) unless a flag sets it (--page-migration-gb-s,
#: --cpu-optimizer-gparams-s) or it was measured beside the GPU (GpuSpec.host_rates): paged
#: optimizer state migrating over the host link, and the optimizer step on the CPU.
ASSUMED_RATE_TERMS = ("paged_migration", "cpu_optimizer_step")


def assumed_share(draft: "TimeDraft", step: float, terms: tuple[str, ...] = ASSUMED_RATE_TERMS) -> float:
    """The fraction of a ``step`` seconds long spent in rows of ``terms`` (those of
    ``ASSUMED_RATE_TERMS`` whose rate is assumed for this plan; serial rows, once per step:
    exposed whole)."""
    spent = sum(r.seconds for r in draft.rows if r.term in terms and not r.per_micro_batch)
    return spent / step if step else 0.0


class Window(StrEnum):
    NONE = "none"  # not hidden: runs alone
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass(slots=True)
class TimeRowDraft:
    term: str
    label: str
    seconds: float
    per_micro_batch: bool  # repeats grad_accum times per step
    window: Window = Window.NONE  # communication and transfers: what can hide it
    compute_pass: Window = Window.NONE  # compute rows: which pass (defines the windows)
    note: str = ""


@dataclass
class TimeDraft:
    rows: list[TimeRowDraft] = field(default_factory=list)
    cpu_dispatch_seconds: float = 0.0  # per micro-batch host-side launch time (a floor)
    dispatch_backward_seconds: float = 0.0  # the part of it launched during the backward pass
    dispatch_parts: list[str] = field(default_factory=list)  # host work in the floor beyond the launches

    def dispatch(self, forward: float, backward: float, what: str = "") -> None:
        """Host-side launch time per micro-batch, seconds, in the forward and the backward pass;
        ``what``: the host work it is, where it is more than eager PyTorch's kernel launches."""
        self.cpu_dispatch_seconds += forward + backward
        self.dispatch_backward_seconds += backward
        if what:
            self.dispatch_parts.append(what)

    def compute(self, term: str, label: str, seconds: float, compute_pass: Window, note: str = "") -> None:
        self._add(TimeRowDraft(term, label, seconds, True, Window.NONE, compute_pass, note))

    def overlapped(self, term: str, label: str, seconds: float, window: Window, per_micro_batch: bool, note: str = "") -> None:
        self._add(TimeRowDraft(term, label, seconds, per_micro_batch, window, Window.NONE, note))

    def serial(self, term: str, label: str, seconds: float, per_micro_batch: bool = False, note: str = "") -> None:
        self._add(TimeRowDraft(term, label, seconds, per_micro_batch, Window.NONE, Window.NONE, note))

    def _add(self, row: TimeRowDraft) -> None:
        if row.term not in TIME_TERMS:
            raise ValueError(f"unknown time term {row.term!r}")
        if row.seconds > 0:
            self.rows.append(row)

    def pass_seconds(self, compute_pass: Window) -> float:
        return sum(r.seconds for r in self.rows if r.compute_pass == compute_pass)


class TimeRow(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    term: str
    label: str
    seconds: float  # per optimizer step, exposed (what the step waits for)
    raw_seconds: float  # per optimizer step, before overlap
    note: str


class StepTime(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    step_seconds: float
    tokens_per_second: float  # all GPUs
    tokens_per_second_per_gpu: float
    mfu: float  # model FLOPs / (GPUs x the dense peak of mfu_basis); recomputation is not model FLOPs
    mfu_basis: str = ""  # the peak MFU divides by: "bf16 dense peak, 989 TFLOP/s per GPU"
    model_flops_per_token: float
    terms: dict[str, float]  # exposed seconds per term per step; they sum to step_seconds
    rows: list[TimeRow]


def resolve(draft: TimeDraft, grad_accum: int) -> list[tuple[TimeRowDraft, float, float]]:
    """(row, exposed seconds per step, raw seconds per step), overlap and the dispatch floor applied.

    Each pass (forward, backward) lasts the longer of its compute and its kernel launches
    (``TimeDraft.dispatch``): where the host launches slower than the GPU runs, the GPU idles for
    the difference (the "dispatch" row). Communication runs on its own stream through the whole
    pass, so its window is that length, and only what outlasts the window's usable share is
    exposed. A pass's time is max(compute, launches) + exposed communication: it never falls as
    its compute or its launches grow."""
    launched = {Window.FORWARD: draft.cpu_dispatch_seconds - draft.dispatch_backward_seconds,
                Window.BACKWARD: draft.dispatch_backward_seconds}
    computed = {w: draft.pass_seconds(w) for w in launched}
    windows = {w: OVERLAP_EFFICIENCY * max(computed[w], launched[w]) for w in launched}
    share: dict[int, float] = {}
    for per_mb in (True, False):
        for w, capacity in windows.items():
            group = [r for r in draft.rows if r.window == w and r.per_micro_batch == per_mb]
            total = sum(r.seconds for r in group)
            for r in group:
                share[id(r)] = max(0.0, total - capacity) / total
    out = []
    for r in draft.rows:
        repeat = grad_accum if r.per_micro_batch else 1
        out.append((r, r.seconds * share.get(id(r), 1.0) * repeat, r.seconds * repeat))
    idle = sum(max(0.0, launched[w] - computed[w]) for w in launched)
    if idle > 0:
        floor = TimeRowDraft("dispatch", "host-side kernel launch (GPU idle)", draft.cpu_dispatch_seconds, True,
                             note=" and ".join(["eager PyTorch dispatch", *draft.dispatch_parts])
                             + " outpace the GPU work")
        out.append((floor, idle * grad_accum, draft.cpu_dispatch_seconds * grad_accum))
    return out


def step_seconds(draft: TimeDraft, grad_accum: int) -> float:
    return sum(exposed for _, exposed, _ in resolve(draft, grad_accum))


def assemble(
    draft: TimeDraft, grad_accum: int, tokens_per_step: float, num_gpus: int, model_flops_per_token: float,
    peak_flops_per_gpu: float, peak_dtype: str = "bf16",
) -> StepTime:
    rows = [
        TimeRow(term=r.term, label=r.label, seconds=exposed, raw_seconds=raw, note=r.note)
        for r, exposed, raw in resolve(draft, grad_accum)
    ]
    step = sum(r.seconds for r in rows)
    terms = dict.fromkeys(TIME_TERMS, 0.0)
    for r in rows:
        terms[r.term] += r.seconds
    per_gpu = tokens_per_step / step / num_gpus
    return StepTime(
        step_seconds=step,
        tokens_per_second=tokens_per_step / step,
        tokens_per_second_per_gpu=per_gpu,
        mfu=model_flops_per_token * per_gpu / peak_flops_per_gpu,
        mfu_basis=f"{peak_dtype} dense peak, {peak_flops_per_gpu / 1e12:,.0f} TFLOP/s per GPU",
        model_flops_per_token=model_flops_per_token,
        terms=terms,
        rows=rows,
    )
