"""Full depth from two truncated depths: a big model on one GPU, measured at real width.

A decoder's layers are identical, so every per-step figure is affine in the depth L within a
phase: value(L) = fixed + L x per_layer, where fixed holds the embeddings, the head and loss, the
context, and per_layer one layer's states, activations and time. Two depths d1 < d2 give

    per_layer = (v2 - v1) / (d2 - d1)        fixed = v1 - d1 x per_layer

and value(L) follows. Memory is extrapolated per phase (forward, backward, step) and the peak is
the largest phase at depth L, because the phase that peaks may change with depth (the loss's
logits dominate a shallow model, the layers a deep one). Unit: as the input (bytes, seconds).
Assumption: the two depths exercise the same code paths as full depth (both above one layer,
models without alternating layer kinds between the two depths: Gemma-2 alternates sliding and
global attention, so measure it at even depths), and the moment that peaks inside each phase is
the same at those depths as at full depth. That can fail: Llama-3.2-1B with full checkpointing
peaks in the forward phase at one moment up to ~6 layers and at another (the bf16 weight copies
of every layer alive) beyond, so 2 and 4 layers read its forward phase at 16 layers 6.9 % low.
A third, shallower depth checks it: the line through the two deepest must pass within
``LINEARITY_TOLERANCE`` of the third in every phase, else the result says which phase bends.
"""

import statistics
from typing import Any

from planner.probes.measured import MeasureResult

#: Largest relative miss of the third depth by the line through the two deepest, per phase,
#: before the result warns that memory is not affine in depth over the measured range.
LINEARITY_TOLERANCE = 0.01


def affine(d1: int, v1: float, d2: int, v2: float, depth: int) -> float:
    """value(depth) on the line through (d1, v1) and (d2, v2)."""
    if d1 == d2:
        raise ValueError("two different depths are needed")
    per_layer = (v2 - v1) / (d2 - d1)
    return v1 + (depth - d1) * per_layer


def extrapolate(shallow: MeasureResult, d1: int, deep: MeasureResult, d2: int, depth: int) -> MeasureResult:
    """The figures of a ``depth``-layer run from runs at ``d1`` and ``d2`` layers. A failed run
    (oom, error, timeout, refused) is returned as it is: nothing is extrapolated from it."""
    for run in (shallow, deep):
        if run.status != "ok":
            return run

    def line(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else affine(d1, a, d2, b, depth)

    phases = {p: round(affine(d1, shallow.phase_peaks[p], d2, deep.phase_peaks[p], depth))
              for p in deep.phase_peaks if p in shallow.phase_peaks}
    allocated = max(phases.values()) if phases else line(shallow.max_allocated_bytes, deep.max_allocated_bytes)
    reserved = line(shallow.max_reserved_bytes, deep.max_reserved_bytes)
    # quantiles pair with quantiles: the i-th fastest step of each depth
    steps = [line(a, b) for a, b in zip(sorted(shallow.step_seconds), sorted(deep.step_seconds), strict=False)]
    context = deep.context_bytes
    note = (f"extrapolated to {depth} layers from measured runs at {d1} and {d2} layers "
            f"(median step {statistics.median(shallow.step_seconds):.4f} s and "
            f"{statistics.median(deep.step_seconds):.4f} s)")
    return deep.model_copy(update={
        "phase_peaks": phases, "max_allocated_bytes": _int(allocated), "max_reserved_bytes": _int(reserved),
        "driver_used_bytes": _int(None if reserved is None or context is None else reserved + context),
        "step_seconds": steps, "notes": [*deep.notes, note],
        "alloc_retries": _sum(shallow.alloc_retries, deep.alloc_retries), "num_ooms": _sum(shallow.num_ooms, deep.num_ooms),
        "seconds": shallow.seconds + deep.seconds,
    })


def _int(x: float | None) -> int | None:
    return None if x is None else round(x)


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _off_the_line(check: dict, d1: int, shallow: tuple[int, dict], deep: tuple[int, dict]) -> list[str]:
    """The phases of the ``d1``-layer check that miss the line through the two deeper runs' phase
    peaks by more than LINEARITY_TOLERANCE, as "phase +x.x%"."""
    (d2, a), (d3, b) = shallow, deep
    bent = []
    for phase, value in check.items():
        if phase in a and phase in b and value:
            miss = (affine(d2, a[phase], d3, b[phase], d1) - value) / value
            if abs(miss) > LINEARITY_TOLERANCE:
                bent.append(f"{phase} {miss:+.1%}")
    return bent


def extrapolate_runs(runs: list[tuple[int, MeasureResult]], depth: int) -> MeasureResult:
    """Extrapolate from two depths, or from the two deepest of three with the shallowest as a
    check of linearity (a note names each phase the line misses by more than
    LINEARITY_TOLERANCE)."""
    runs = sorted(runs, key=lambda r: r[0])
    (d2, shallow), (d3, deep) = runs[-2:]
    out = extrapolate(shallow, d2, deep, d3, depth)
    if len(runs) < 3 or out.status != "ok" or runs[0][1].status != "ok":
        return out
    d1, check = runs[0]
    bent = _off_the_line(check.phase_peaks, d1, (d2, shallow.phase_peaks), (d3, deep.phase_peaks))
    note = (f"linearity check at {d1} layers: " + (", ".join(bent) + " off the line through "
            f"{d2} and {d3} layers: the extrapolation of those phases is unreliable" if bent else "every phase on the line"))
    return out.model_copy(update={"notes": [*out.notes, note], "seconds": out.seconds + check.seconds})


def extrapolate_trace(runs: list[tuple[int, Any]], depth: int):
    """A TraceResult (probes/traced.py) at ``depth`` layers from traces at two or three depths, as
    ``extrapolate_runs`` does for measured runs: every phase peak and the parameters, gradients and
    optimizer states along the line through the two deepest; the shallowest, if given, checks that
    each phase is on that line (a note names a phase that misses it by more than
    LINEARITY_TOLERANCE). Returns (result, bent phases as "phase +x.x%")."""
    runs = sorted(runs, key=lambda r: r[0])
    (d2, a), (d3, b) = runs[-2:]

    def line(x: float, y: float) -> int:
        return round(affine(d2, x, d3, y, depth))

    phases = {p: line(a.phase_peaks[p], b.phase_peaks[p]) for p in b.phase_peaks if p in a.phase_peaks}
    peak_phase = max(phases, key=lambda k: phases[k])
    bent = _off_the_line(runs[0][1].phase_peaks, runs[0][0], (d2, a.phase_peaks), (d3, b.phase_peaks)) \
        if len(runs) > 2 else []
    note = (f"extrapolated to {depth} layers from traces at {d2} and {d3} layers"
            + (f"; linearity check at {runs[0][0]} layers: " + (", ".join(bent) or "every phase on the line")
               if len(runs) > 2 else ""))
    result = b.model_copy(update={
        "peak_bytes": phases[peak_phase], "peak_phase": peak_phase, "phase_peaks": phases,
        "parameters_bytes": line(a.parameters_bytes, b.parameters_bytes),
        "gradients_bytes": line(a.gradients_bytes, b.gradients_bytes),
        "optimizer_state_bytes": line(a.optimizer_state_bytes, b.optimizer_state_bytes),
        "baseline_bytes": line(a.baseline_bytes, b.baseline_bytes), "at_peak": {}, "phase_snapshots": {},
        "seconds": sum(r.seconds for _, r in runs), "notes": [*b.notes, note]})
    return result, bent
