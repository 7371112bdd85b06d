"""The GPU validation's records: one CSV row and one JSON line per case (skipped ones too), the
summary table printed last, and the figure.

Errors are (predicted - measured) / measured. ``memory_error`` compares the peak as the driver
sees it (CUDA context + the allocator's reserved peak + the driver's own reservation) with the
analytic peak; ``allocated_error`` compares torch's allocated peak with the analytic peak less
context, allocator reserve and resident paged state (the part a trace also sees). A step time is
compared only where it says something about the plan (``time_status``): fp8 runs eager here
while the launch compiles, and a paged state that would spill on the emulated card does not
spill on the bigger one. For the same reason such a run's driver peak holds every page the
plan's card would evict (``memory_status``): it is shown, never counted in the medians.
"""

import csv
import json
import statistics
from pathlib import Path

from planner.probes.gpu_readings import READINGS

MEMORY_BAND, TIME_BAND = 0.10, 0.15
TIMED = ("timed", "communication modelled")
COLUMNS = ["key", "tier", "model", "gpus", "emulated", "depth", "optimizer", "precision", "checkpointing", "sharding",
           "offload", "adapter", "loss", "micro_batch_size", "seq_len", "status", "verdict", "where",
           "predicted_fits", "predicted_peak_gib", "measured_peak_gib", "memory_error", "memory_status",
           "predicted_allocated_gib", "measured_allocated_gib", "allocated_error", "measured_reserved_gib",
           "predicted_paged_gib", "predicted_paged_resident_gib", "predicted_paged_spilled_gib",
           *[f"peak_{r}_gib" for r in READINGS], *[f"start_{r}_gib" for r in READINGS],
           "built_reserved_gib", "context_gib", "allocator_limit_gib", "allocator_conf", "alloc_retries",
           "predicted_step_s", "measured_step_s", "time_error", "time_status", "tokens_per_s", "mfu",
           "expected_s", "seconds", "device", "torch", "message"]


def emulated_spill(case, plan) -> bool:
    """A paged state predicted to spill on the emulated card: the bigger card holds every page
    (the driver evicts only under pressure), so neither the step time nor the driver peak is the
    plan's."""
    return bool(case.emulated and plan.paged and plan.paged.spilled_bytes)


def untimed(case, plan) -> str:
    """Why the plan's step time cannot be measured here ("" when it can): fp8 runs eager where
    the launch compiles; an emulated spill (``emulated_spill``)."""
    if plan.config.precision == "fp8-mixed":
        return "eager: the launch compiles"
    if emulated_spill(case, plan):
        return "spill not measured"
    return ""


def memory_status(case, plan) -> str:
    """Whether the driver peak measures the plan's: "" when it does, else why not."""
    if getattr(case, "allocator_conf", None) is not None:
        return "other allocator: not the plan's"
    return "spill held: not the plan's card" if emulated_spill(case, plan) else ""


def time_status(case, plan, comparison) -> str:
    """Whether a run's step time measures the plan's: timed | communication modelled | why not
    (``untimed``, or a CPU run) | - (no time)."""
    if comparison is None or comparison.status != "ok" or comparison.measured_step_seconds is None:
        return "-"
    if comparison.device_gpu == "cpu":
        return "cpu: not the plan's GPU"
    return untimed(case, plan) or ("communication modelled" if comparison.modelled_communication_seconds else "timed")


def csv_row(case, model: str, plan, comparison, status: str, message: str, seconds: float, expected: float) -> dict:
    c = plan.config if plan is not None else None
    row = {"key": case.key, "tier": case.tier, "model": model, "gpus": plan.hardware.spec if plan else case.gpus,
           "emulated": case.emulated, "status": status, "message": message[:300], "seconds": _f(seconds),
           "expected_s": _f(expected)}
    if c is not None:
        row |= {k: getattr(c, k) for k in ("optimizer", "precision", "checkpointing", "sharding", "offload", "adapter",
                                           "loss", "micro_batch_size", "seq_len")}
        row["predicted_fits"] = plan.fits
        if plan.paged:
            row |= {"predicted_paged_gib": _g(plan.paged.state_bytes),
                    "predicted_paged_resident_gib": _g(plan.paged.resident_bytes),
                    "predicted_paged_spilled_gib": _g(plan.paged.spilled_bytes)}
    if comparison is None:
        return {k: str(v) for k, v in row.items()}
    m = comparison.measurement
    peak, start = m.readings.get("peak") or m.readings.get("end") or {}, m.readings.get("start") or {}
    row |= {"depth": ("extrapolated " + "/".join(map(str, comparison.extrapolated_from))
                      if comparison.extrapolated_from else "full"),
            "verdict": comparison.verdict, "where": comparison.where,
            "predicted_peak_gib": _g(comparison.predicted_peak_bytes),
            "measured_peak_gib": _g(comparison.measured_peak_bytes), "memory_error": _f(comparison.memory_error),
            "memory_status": memory_status(case, plan),
            "predicted_allocated_gib": _g(comparison.predicted_allocated_bytes),
            "measured_allocated_gib": _g(comparison.measured_allocated_bytes),
            "allocated_error": _f(relative_error(comparison.predicted_allocated_bytes, comparison.measured_allocated_bytes)),
            "measured_reserved_gib": _g(comparison.measured_reserved_bytes),
            **{f"peak_{r}_gib": _g(peak.get(r)) for r in READINGS},
            **{f"start_{r}_gib": _g(start.get(r)) for r in READINGS},
            "built_reserved_gib": _g((m.readings.get("built") or {}).get("reserved")),
            "context_gib": _g(m.context_bytes), "allocator_limit_gib": _g(m.allocator_limit_bytes),
            "allocator_conf": m.allocator_conf, "alloc_retries": m.alloc_retries,
            "predicted_step_s": _f(comparison.predicted_step_seconds),
            "measured_step_s": _f(comparison.measured_step_seconds), "time_error": _f(comparison.time_error),
            "time_status": time_status(case, plan, comparison), "tokens_per_s": _f(comparison.tokens_per_second),
            "mfu": _f(comparison.mfu), "device": comparison.device, "torch": m.versions.get("torch")}
    return {k: "" if v is None else str(v) for k, v in row.items()}


class Records:
    """probes.csv and probes.jsonl under ``out``, appended and flushed as each case ends."""

    def __init__(self, out: Path) -> None:
        self.csv_path, self.jsonl_path = out / "probes.csv", out / "probes.jsonl"
        self.rows: list[dict] = []
        with self.csv_path.open("w", newline="") as f:
            csv.DictWriter(f, COLUMNS).writeheader()

    def add(self, row: dict, record: dict) -> None:
        self.rows.append(row)
        with self.csv_path.open("a", newline="") as f:
            csv.DictWriter(f, COLUMNS).writerow(row)
        with self.jsonl_path.open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")


def summary(rows: list[dict], launches: list[dict]) -> list[str]:
    """The lines printed last: one per case, the median and worst errors, the surprises."""
    lines = [f"{'case':34s} {'status':8s} {'mem err':>8s} {'alloc':>7s} {'time err':>8s}  verdict"]
    for r in rows:
        time_err = _pct(r.get("time_error")) if r.get("time_status") in TIMED else (
            "(" + r["time_status"].split(":")[0][:6] + ")" if r.get("time_status", "-") != "-" else "-")
        mem_err = f"({r['memory_status'][:6]})" if r.get("memory_status") else _pct(r.get("memory_error"))
        lines.append(f"{r['key'][:34]:34s} {r['status'][:8]:8s} {mem_err:>8s} "
                     f"{_pct(r.get('allocated_error')):>7s} {time_err:>8s}  {r.get('verdict') or r.get('message', '')[:40]}")
    lines += errors_summary(rows)
    surprises = [r["key"] for r in rows if r["status"] == "oom" and r.get("predicted_fits") == "True"
                 and "inconclusive" not in (r.get("verdict") or "")]
    lines.append(f"predicted to fit but OOM: {len(surprises)}" + (f" {surprises}" if surprises else ""))
    for launch in launches:
        lines.append(f"launch {launch.get('name', '?')}: rc {launch.get('rc')}, {launch.get('wall_seconds')} s, "
                     f"{launch.get('steps_per_second')} steps/s, polled peak {_gib(launch.get('polled_peak_gib'))} vs "
                     f"plan {_gib(launch.get('predicted_peak_gib'))}; {launch.get('live_verdict') or launch.get('error', '')}")
    return lines


def errors_summary(rows: list[dict]) -> list[str]:
    ok = [r for r in rows if r["status"] == "ok"]
    out = []
    for column, label, subset in (("memory_error", "peak memory (driver)", [r for r in ok if not r.get("memory_status")]),
                                  ("allocated_error", "allocated peak", ok),
                                  ("time_error", "step time", [r for r in ok if r.get("time_status") in TIMED])):
        values = [float(r[column]) for r in subset if r.get(column)]
        if values:
            worst = max(values, key=abs)
            out.append(f"{label}: median |error| {statistics.median(abs(v) for v in values):.1%}, worst {worst:+.1%} "
                       f"over {len(values)} runs")
    return out


def figure(rows: list[dict], path: Path) -> str:
    """validation.png: predicted vs measured peak (+-10 % band, OOMs marked) and step time
    (+-15 %); returns "" or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no figure: {e}"
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (pred, meas, band, label) in zip(axes, (
            ("predicted_peak_gib", "measured_peak_gib", MEMORY_BAND, "peak memory, GiB"),
            ("predicted_step_s", "measured_step_s", TIME_BAND, "step time, s"))):
        pts = [(float(r[pred]), float(r[meas]), r) for r in rows if r.get(pred) and r.get(meas)
               and (label.startswith("peak") or r.get("time_status") in TIMED)]
        if not pts:
            ax.set_title(f"{label}: no runs")
            continue
        hi = max(max(p, m) for p, m, _ in pts) * 1.1
        xs = [0, hi]
        ax.plot(xs, xs, "k-", lw=0.8)
        ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], alpha=0.15,
                        label=f"+-{band:.0%}")
        for p, m, r in pts:
            ax.scatter(m, p, marker="x" if r["status"] == "oom" else "o", color="red" if r["status"] == "oom" else "C0")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(label)
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return ""


def relative_error(predicted, measured) -> float | None:
    """(predicted - measured) / measured; None without both."""
    return None if predicted is None or not measured else (predicted - measured) / measured


def _g(x) -> str:
    return "" if x is None else f"{x / 2**30:.3f}"


def _f(x) -> str:
    return "" if x is None else f"{x:.5g}"


def _pct(x) -> str:
    return "-" if x in (None, "") else f"{float(x):+.1%}"


def _gib(x) -> str:
    return "-" if x is None else f"{x:.1f} GiB"
