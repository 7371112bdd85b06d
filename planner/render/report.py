"""What the planning commands print: estimate, check, calibrate here; suggest in plans.py; the
catalogs in catalogs.py. Every screen starts with its verdict, then what it assumed, then the
details, and ends with what to run next (next_steps.py); it reads at 80 columns and up
(layout.py)."""

from dataclasses import replace

from rich.console import Console
from rich.text import Text

from planner.core.formatting import gib
from planner.render.breakdown import config_line, fit_words, reasons, render_breakdown, target_line
from planner.render.catalogs import render_gpus, render_models
from planner.render.layout import console_for_stdout, heading, line, paragraph, table, verdict
from planner.render.next_steps import Asked, check_next, estimate_next
from planner.render.plans import render_suggest
from planner.schema.estimate import EstimateResult

__all__ = ["Asked", "console_for_stdout", "render_breakdown", "render_calibrate", "render_check", "render_estimate",
           "render_gpus", "render_models", "render_suggest"]


def estimate_word(r: EstimateResult) -> str:
    return "FITS" if r.fits else ("INFEASIBLE" if not r.feasible else "DOES NOT FIT")


def render_estimate(r: EstimateResult, console: Console, asked: Asked | None = None) -> None:
    verdict(console, estimate_word(r), fit_words(r), good=r.fits)
    target_line(r, console)
    config_line(r, console)
    paragraph(console, "assumptions", r.assumptions)
    reasons(r.reasons if r.feasible else r.reasons[1:], console)  # infeasible: the first is the verdict's
    if r.feasible:
        render_breakdown(r, console)
    else:
        for w in r.warnings:
            line(console, f"warning: {w}")
    estimate_next(r, asked, console)


def render_check(result, console: Console, asked: Asked | None = None) -> None:
    """The verdict, the job as read (each value with its source), what to change, what next."""
    r = result.estimate
    if asked is not None and asked.model is None:  # (the recipe named it)
        asked = replace(asked, model=r.model.id)
    verdict(console, "FITS" if result.fits else "WILL NOT FIT", fit_words(r), good=result.fits)
    target_line(r, console)
    config_line(r, console)
    paragraph(console, "assumptions", r.assumptions)
    reasons(r.reasons, console)
    heading(console, "The job as read")
    t = table(("setting", "left"), ("value", "left"), ("from", "left"), wrap=("from",))
    # (plain Text: file names, keys and paths the user wrote are not markup)
    t.add_row("model", Text(r.model.id), Text(result.model_source))
    for name, where in result.sources.items():
        t.add_row(name.replace("_", "-"), Text(str(getattr(r.config, name))), Text(where))
    console.print(t)
    h = r.host_memory
    line(console, f"peak per GPU {gib(r.memory['peak'])} of {gib(r.usable_bytes)} usable "
                  f"({gib(r.hardware.gpu_memory_bytes)} on the GPU), at the {r.peak_phase} phase; "
                  f"host RAM per node {gib(h['peak'])} of {gib(r.host_usable_bytes)} usable; "
                  f"{r.time.tokens_per_second:,.0f} tokens/s")
    for w in result.warnings:
        line(console, f"warning: {w}")
    if result.changes:
        heading(console, "Changes that make it fit (exact first, then fastest)")
        for c in result.changes:
            line(console, f"{c.change}: {gib(r.memory['peak'])} -> {gib(c.peak_bytes)}, "
                          f"{c.tokens_per_second:,.0f} tokens/s", indent=4, first="  ")
    if result.faster:
        heading(console, f"Faster plans that also fit (exact first; now {r.time.tokens_per_second:,.0f} tokens/s)")
        for c in result.faster:
            line(console, f"{c.change}: {c.tokens_per_second:,.0f} tokens/s, peak {gib(c.peak_bytes)}", indent=4, first="  ")
    check_next(result, asked, console)


def render_calibrate(result, console: Console) -> None:
    """``planner calibrate``: per GPU, the fitted corrections beside the assumptions they replace,
    the analytic model's errors before / after / leave-one-out, and where they are now used."""
    from planner.cost import overheads

    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    for c in result.corrections:
        rep = c.report
        heading(console, f"{c.gpu}: fitted on {c.measurements} measured probes ({c.software})")
        fitted = table(("term", "left"), ("fitted", "right"), ("assumption before", "right"), ("from", "left"),
                       wrap=("term", "from"))
        fitted.add_row("CUDA context per process", "-" if c.context_bytes is None else gib(c.context_bytes),
                       gib(rep.get("context_assumed", overheads.CUDA_CONTEXT_BYTES)),
                       f"{rep.get('memory_rows', 0)} memory rows (driver-seen - reserved)")
        fitted.add_row("allocator reserve", pct(c.fragmentation_fraction), pct(overheads.FRAGMENTATION_FRACTION),
                       "(reserved - allocated) / allocated")
        for dtype in ("bf16", "fp16", "fp32", "fp8"):
            rows = rep.get(f"time_rows_{dtype}") or 0
            if dtype in c.flops_scale or rows:
                scale = c.flops_scale.get(dtype)
                fitted.add_row(f"achieved FLOP/s, {dtype}", "-" if scale is None else f"x {scale:.3f}",
                               "x 1 (efficiency.yaml)", f"{rows} timed rows")
        for engine, rows in sorted((rep.get("cpu_rows") or {}).items()):
            rate = c.cpu_optimizer_params_per_s.get(engine)
            fitted.add_row(f"CPU optimizer, {engine}", "-" if rate is None else f"{rate / 1e9:.2f}B params/s",
                           f"{overheads.CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE / 1e9:.2f}B params/s",
                           f"{rows} offload rows")
        page = c.host_rates.page_migration_bytes_per_s if c.host_rates else None
        if page is not None:
            fitted.add_row("paged state's migration", f"{page / 1e9:.1f} GB/s",
                           f"{overheads.PAGE_MIGRATION_LINK_FRACTION:.0%} of the host link",
                           "measured beside the GPU")
        console.print(fitted)
        heading(console, f"{c.gpu}: analytic error |predicted - measured| / measured, median / worst")
        errors = table(("quantity", "left"), ("rows", "right"), ("before", "right"), ("after (in sample)", "right"),
                       ("leave-one-out", "right"), wrap=("quantity",))
        for quantity, key, rows in (("peak memory per GPU", "memory", rep.get("memory_rows")),
                                    ("step time", "time", (rep.get("time_rows") or 0)
                                     + sum((rep.get("cpu_rows") or {}).values()))):
            errors.add_row(quantity, str(rows or 0), *(
                f"{pct(rep.get(f'{key}_median_error_{w}'))} / {pct(rep.get(f'{key}_worst_error_{w}'))}"
                for w in ("before", "after", "loo")))
        console.print(errors)
        if rep.get("time_rows_clamped"):
            line(console, f"warning: {rep['time_rows_clamped']} timed rows fell outside the searched FLOP/s "
                          "factors (1/20 to 20) and were clamped")
        if result.saved and result.in_use:
            line(console, f"saved to {result.store}: planner estimate / suggest / check now use them for {c.gpu}")
        elif result.saved:
            line(console, f"saved to {result.store}: planner estimate / suggest / check use them for {c.gpu} with "
                          f"--calibration {result.store} (or PLANNER_CALIBRATION={result.store})")
    if not result.corrections:
        line(console, f"nothing to fit: {result.measurements} measurements in {result.store}, none with status ok on a GPU")
    elif not result.saved:
        console.print("dry run: nothing saved")
