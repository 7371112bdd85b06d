"""One plan in detail, as estimate, suggest (its winner) and check show it: the header, the
verdict's figures, the memory ledger at the peak and the time ledger.

Tables keep figures whole at any width: where the 'how' column does not fit beside the label, each
note moves under its label in the same cell (layout.fits decides)."""

from rich.console import Console, Group
from rich.padding import Padding
from rich.text import Text

from planner.core.formatting import count, gib, share
from planner.core.ledger import Location, resident
from planner.core.units import GIB
from planner.render.layout import fits, heading, line, paragraph, table
from planner.schema.estimate import EstimateResult
from planner.strategies import summary

PHASE_WORDS = {
    "forward": "end of forward / start of backward",
    "backward": "the decoder layers' backward",
    "backward_end": "the embeddings' backward, end of backward",
    "step": "optimizer step",
    "rollout": "GRPO's generation and scoring",
}


def peak_cell(r: EstimateResult) -> str:
    """The peak per GPU in GiB for a table cell: '22.8', or '35.2+paged' when the paged state fills the rest."""
    if r.peak_without_paged is not None:
        return f"{r.peak_without_paged / GIB:,.1f}+paged"
    return f"{r.memory['peak'] / GIB:,.1f}"


def peak_words(r: EstimateResult) -> str:
    """'22.8 of 40.0 GiB', or '35.2 GiB + paged state fills the rest of 40.0 GiB'."""
    total = f"{r.hardware.gpu_memory_bytes / GIB:,.1f} GiB"
    if r.peak_without_paged is not None:
        return f"{r.peak_without_paged / GIB:,.1f} GiB + paged state fills the rest of {total}"
    return f"{r.memory['peak'] / GIB:,.1f} of {total}"


def tokens(r: EstimateResult) -> str:
    return f"{r.time.tokens_per_second:,.0f} tokens/s"


def plan_words(r: EstimateResult) -> str:
    """The plan in one line: 'adamw, bf16-mixed, ckpt none, sharding fsdp, ..., mbs 4 x 2'."""
    c = r.config
    return f"{summary(c, 'compact', ', ')}, mbs {c.micro_batch_size} x {c.grad_accum}"


def fit_words(r: EstimateResult) -> str:
    """What a verdict rests on: the peak and the rate when it fits, the shortfall when not, the
    first reason when it cannot run."""
    if r.fits:
        return f"{peak_words(r)} per GPU, {tokens(r)}"
    if not r.feasible:
        return r.reasons[0] if r.reasons else ""
    if r.headroom_bytes < 0:
        return (f"needs {gib(r.memory['peak'])} per GPU, {gib(r.usable_bytes)} usable: "
                f"{gib(-r.headroom_bytes)} short")
    return f"host RAM needs {gib(r.host_memory['peak'])} per node, {gib(r.host_usable_bytes)} usable"


def target_line(r: EstimateResult, console: Console) -> None:
    m, hw = r.model, r.hardware
    active = f", {count(m.num_active_parameters)} active" if m.num_active_parameters != m.num_parameters else ""
    line(console, f"{m.id} ({m.family}, {count(m.num_parameters)} params{active}) on {hw.spec} "
                  f"({gib(hw.gpu_memory_bytes)} per GPU)")


def config_line(r: EstimateResult, console: Console) -> None:
    c = r.config
    line(console, f"{summary(c, 'named', ' | ')} | micro-batch {c.micro_batch_size} x accum {c.grad_accum} "
                  f"x seq {c.seq_len}")


def reasons(items: list[str], console: Console) -> None:
    for reason in items:
        line(console, reason, indent=4, first="  ")


def render_breakdown(r: EstimateResult, console: Console) -> None:
    """The memory ledger at the peak, phase totals, host RAM, the time ledger, warnings."""
    _memory_table(r, console)
    h = r.host_memory
    line(console, f"host RAM per node: {gib(h['peak'])} of {gib(r.host_usable_bytes)} usable ({gib(h['capacity'])} there) "
                  f"(offloaded {gib(h['offloaded'])}, paged spill {gib(h['paged_spill'])}, "
                  f"processes {gib(h['process_runtime'])}, model load {gib(h['model_loading'])})")
    for row in r.ledger:
        if row.location == Location.HOST:
            line(console, f"on host, per GPU: {row.label}: {gib(row.bytes)}", indent=2)
    _time_table(r, console)
    if r.hardware.calibration:
        line(console, f"calibration: {r.hardware.gpu}: {r.hardware.calibration}")
    for w in r.warnings:
        line(console, f"warning: {w}")


def _memory_table(r: EstimateResult, console: Console) -> None:
    gpu = r.hardware.gpu_memory_bytes
    rows = [(row.label, f"{row.bytes / GIB:,.2f}", share(row.bytes, gpu), row.note)
            for row in resident(r.ledger, r.peak_phase)]
    total = ("peak", f"{r.memory['peak'] / GIB:,.2f}", share(r.memory["peak"], gpu), "")
    heading(console, f"Memory per GPU at the {r.peak_phase} peak ({PHASE_WORDS[r.peak_phase]})")
    console.print(_ledger(console, (("GiB", "right"), ("of GPU", "right")), rows, total))
    paragraph(console, "phases", [f"{p} {gib(b)}" for p, b in r.phase_peaks.items()])
    paragraph(console, "the peak as each tool reads it", [
        f"torch max_memory_allocated {gib(r.allocated_peak_bytes)}", f"max_memory_reserved {gib(r.reserved_peak_bytes)}",
        f"device {gib(r.memory['peak'])} (nvidia-smi's memory used; the verdict's)"])


def _time_table(r: EstimateResult, console: Console) -> None:
    t = r.time
    heading(console, f"Step time: {t.step_seconds:,.3f} s per optimizer step, {t.tokens_per_second:,.0f} tokens/s "
                     f"({t.tokens_per_second_per_gpu:,.0f} per GPU), MFU {t.mfu:.1%} (of the {t.mfu_basis})")
    rows = [(row.label, f"{row.seconds:,.4f}", share(row.seconds, t.step_seconds), f"{row.raw_seconds:,.4f}", row.note)
            for row in t.rows]
    console.print(_ledger(console, (("s/step", "right"), ("share", "right"), ("no overlap", "right")), rows))


def _ledger(console: Console, figures: tuple[tuple[str, str], ...], rows, total=None):
    """A ledger table: term, figures, how. The 'how' column where it fits beside the terms,
    else each note under its term (dim); terms wrap at spaces, figures never."""
    wide = table(("term", "left"), *figures, ("how", "left"), wrap=("term", "how"))
    for label, *cells, note in rows:
        wide.add_row(label, *cells, note)
    if total:
        wide.add_section()
        wide.add_row(*total)
    if fits(console, wide):
        return wide
    narrow = table(("term", "left"), *figures, wrap=("term",))
    for label, *cells, note in rows:
        cell = Group(Text(label), Padding(Text(note, style="dim"), (0, 0, 0, 2))) if note else Text(label)
        narrow.add_row(cell, *cells)
    if total:
        narrow.add_section()
        narrow.add_row(*total[:-1])
    return narrow
