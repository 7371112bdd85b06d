"""Rich rendering of estimate and suggest results: ledgers as tables, phases, verdicts."""

from rich.console import Console
from rich.table import Table

from planner.core.formatting import count, gib, share
from planner.core.ledger import Location, resident
from planner.engine.estimate import EstimateResult
from strategies import TECHNIQUES, summary

PHASE_WORDS = {
    "forward": "end of forward / start of backward",
    "backward": "the decoder layers' backward",
    "backward_end": "the embeddings' backward, end of backward",
    "step": "optimizer step",
}


def console_for_stdout() -> Console:
    """Wide enough for the tables when stdout is not a terminal (pipes, CI logs)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=170)
    return console


def render_estimate(r: EstimateResult, console: Console) -> None:
    _header(r, console)
    render_breakdown(r, console)
    verdict = "[bold green]FITS[/]" if r.fits else ("[bold red]INFEASIBLE[/]" if not r.feasible else "[bold red]DOES NOT FIT[/]")
    console.print(verdict)
    for reason in r.reasons:
        console.print(f"  {reason}")


def render_breakdown(r: EstimateResult, console: Console) -> None:
    """The memory ledger at the peak, phase totals, host RAM, warnings and the time ledger."""
    _memory_table(r, console)
    h = r.host_memory
    console.print(
        f"host RAM per node: {gib(h['peak'])} of {gib(h['capacity'])} "
        f"(offloaded {gib(h['offloaded'])}, paged spill {gib(h['paged_spill'])}, "
        f"processes {gib(h['process_runtime'])}, model load {gib(h['model_loading'])})"
    )
    for row in r.ledger:
        if row.location == Location.HOST:
            console.print(f"  on host, per GPU: {row.label}: {gib(row.bytes)}")
    _time_table(r, console)
    if r.hardware.calibration:
        console.print(f"[cyan]calibration:[/] {r.hardware.gpu}: {r.hardware.calibration}", highlight=False)
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {w}")


def _header(r: EstimateResult, console: Console) -> None:
    m, hw, c = r.model, r.hardware, r.config
    active = f", {count(m.num_active_parameters)} active" if m.num_active_parameters != m.num_parameters else ""
    console.print(
        f"[bold]{m.id}[/] ({m.family}, {count(m.num_parameters)} params{active}) on "
        f"[bold]{r.hardware.spec}[/] ({gib(hw.gpu_memory_bytes)} per GPU)"
    )
    console.print(f"{summary(c, 'named', ' | ')} | micro-batch {c.micro_batch_size} x accum {c.grad_accum} x seq {c.seq_len}")


def _memory_table(r: EstimateResult, console: Console) -> None:
    hw = r.hardware
    table = Table(title=f"Memory per GPU at the {r.peak_phase} peak ({PHASE_WORDS[r.peak_phase]})", title_justify="left")
    for name, justify in (("term", "left"), ("GiB", "right"), ("of GPU", "right"), ("how", "left")):
        table.add_column(name, justify=justify)
    for row in resident(r.ledger, r.peak_phase):
        table.add_row(row.label, f"{row.bytes / 2**30:,.2f}", share(row.bytes, hw.gpu_memory_bytes), row.note)
    table.add_section()
    table.add_row("[bold]peak[/]", f"[bold]{r.memory['peak'] / 2**30:,.2f}[/]", share(r.memory["peak"], hw.gpu_memory_bytes), "")
    console.print(table)
    console.print("phases: " + " | ".join(f"{p} {gib(b)}" for p, b in r.phase_peaks.items()))


def _time_table(r: EstimateResult, console: Console) -> None:
    t = r.time
    table = Table(
        title=f"Step time: {t.step_seconds:,.3f} s per optimizer step, {t.tokens_per_second:,.0f} tokens/s "
        f"({t.tokens_per_second_per_gpu:,.0f} per GPU), MFU {t.mfu:.1%} (of the {t.mfu_basis})",
        title_justify="left",
    )
    for name, justify in (("term", "left"), ("s / step", "right"), ("share", "right"), ("before overlap", "right"), ("how", "left")):
        table.add_column(name, justify=justify)
    for row in t.rows:
        table.add_row(row.label, f"{row.seconds:,.4f}", share(row.seconds, t.step_seconds), f"{row.raw_seconds:,.4f}", row.note)
    console.print(table)


def render_suggest(result, console: Console) -> None:
    """The top plans, then the winner's memory and time breakdowns; or what would fit."""
    if result.plans:
        best = result.plans[0]
        _header_models(best, console)
        table = Table(title=f"Top {len(result.plans)} of {result.considered:,} candidates "
                      f"(global batch {result.global_batch_size} x {result.seq_len} tokens, {result.engine})",
                      title_justify="left")
        right = ("#", "peak/GPU GiB", "host GiB", "tokens/s", "MFU", "step s")
        for name in ("#", *(s.short for s in TECHNIQUES), "mbs x accum", *right[1:]):
            table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
        for i, p in enumerate(result.plans, 1):
            c = p.config
            table.add_row(
                str(i), *(str(getattr(c, s.field)) for s in TECHNIQUES), f"{c.micro_batch_size} x {c.grad_accum}",
                f"{p.memory['peak'] / 2**30:.1f}/{p.hardware.gpu_memory_bytes / 2**30:.1f}",
                f"{p.host_memory['peak'] / 2**30:.0f}", f"{p.time.tokens_per_second:,.0f}", f"{p.time.mfu:.1%}",
                f"{p.time.step_seconds:,.2f}",
            )
        console.print(table)
        console.print("MFU: model FLOPs over the GPU's dense peak in the plan's compute dtype (bf16 for fp8 plans)")
        console.print("[bold]The winner[/]")
        _header(best, console)
        render_breakdown(best, console)
    console.print(f"considered {result.considered:,}, evaluated {result.evaluated:,}; rejected: "
                  + (", ".join(f"{k} {v:,}" for k, v in result.rejected.items()) or "none"))
    console.print("[bold green]A PLAN FITS[/]" if result.fits else "[bold red]NOTHING FITS[/]")
    for reason in result.reasons:
        console.print(f"  {reason}")


def _header_models(r: EstimateResult, console: Console) -> None:
    m = r.model
    console.print(f"[bold]{m.id}[/] ({m.family}, {count(m.num_parameters)} params) on [bold]{r.hardware.spec}[/]")


def render_check(result, console: Console) -> None:
    """The job as read (each value with its source), the estimate, the verdict, what to change."""
    r = result.estimate
    _header(r, console)
    table = Table(title="The job as read", title_justify="left")
    table.add_column("setting")
    table.add_column("value")
    table.add_column("from")
    for name, where in result.sources.items():
        table.add_row(name.replace("_", "-"), str(getattr(r.config, name)), where)
    console.print(table)
    h = r.host_memory
    console.print(f"peak per GPU {gib(r.memory['peak'])} of {gib(r.usable_bytes)} usable ({gib(r.hardware.gpu_memory_bytes)} "
                  f"on the GPU), at the {r.peak_phase} phase; host RAM per node {gib(h['peak'])} of {gib(h['capacity'])}")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print("[bold green]FITS[/]" if result.fits else "[bold red]WILL NOT FIT[/]")
    for reason in r.reasons:
        console.print(f"  {reason}")
    if result.changes:
        console.print("Changes that make it fit (fastest first):")
        for c in result.changes:
            console.print(f"  {c.change}: {gib(r.memory['peak'])} -> {gib(c.peak_bytes)}, {c.tokens_per_second:,.0f} tokens/s")
    if result.faster:
        console.print(f"Faster plans that also fit (now {r.time.tokens_per_second:,.0f} tokens/s):")
        for c in result.faster:
            console.print(f"  {c.change}: {c.tokens_per_second:,.0f} tokens/s, peak {gib(c.peak_bytes)}")


def render_models(console: Console) -> None:
    """The model catalog: id, family, parameters."""
    from planner.catalog.models import catalog, resolve_model
    from planner.cost.params import total_parameters

    for mid in sorted(catalog(), key=str.lower):
        spec = resolve_model(mid)
        console.print(f"{mid:55s} {spec.family:8s} {count(total_parameters(spec)):>9s}")


def render_gpus(console: Console) -> None:
    """The GPU catalog: id, memory, 16-bit and fp8 peaks, link, aliases."""
    from planner.catalog.gpus import catalog

    for gid, f in sorted(catalog().items()):
        bf16 = f.dense_tflops.get("bf16")
        fp8 = f.dense_tflops.get("fp8")
        console.print(
            f"{gid:14s} {f.memory_mib / 1024:7.1f} GiB  bf16 {bf16 or '-':>7} TFLOP/s  fp8 {fp8 or '-':>7}  "
            f"{f.gpu_link.kind}  aliases: {', '.join(f.aliases)}"
        )


def render_calibrate(result, console: Console) -> None:
    """``planner calibrate``: per GPU, the fitted corrections beside the assumptions they replace,
    the analytic model's errors before / after / leave-one-out, and where they are now used."""
    from planner.cost import runtime as R

    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    for c in result.corrections:
        rep = c.report
        table = Table(title=f"{c.gpu}: fitted on {c.measurements} measured probes ({c.software})", title_justify="left")
        for name in ("term", "fitted", "assumption before", "from"):
            table.add_column(name)
        table.add_row("CUDA context per process", "-" if c.context_bytes is None else gib(c.context_bytes),
                      gib(R.CUDA_CONTEXT_BYTES), f"{rep.get('memory_rows', 0)} memory rows (driver-seen - reserved)")
        table.add_row("allocator reserve", pct(c.fragmentation_fraction), pct(R.FRAGMENTATION_FRACTION),
                      "(reserved - allocated) / allocated")
        for dtype in ("bf16", "fp16", "fp32", "fp8"):
            rows = rep.get(f"time_rows_{dtype}") or 0
            if dtype in c.flops_scale or rows:
                scale = c.flops_scale.get(dtype)
                table.add_row(f"achieved FLOP/s, {dtype}", "-" if scale is None else f"x {scale:.3f}", "x 1 (efficiency.yaml)",
                              f"{rows} timed rows")
        console.print(table)
        errors = Table(title=f"{c.gpu}: analytic error |predicted - measured| / measured, median / worst",
                       title_justify="left")
        for name in ("quantity", "rows", "before", "after (in sample)", "leave-one-out"):
            errors.add_column(name, justify="left" if name == "quantity" else "right")
        for quantity, key, rows in (("peak memory per GPU", "memory", rep.get("memory_rows")),
                                    ("step time", "time", rep.get("time_rows"))):
            errors.add_row(quantity, str(rows or 0), *(
                f"{pct(rep.get(f'{key}_median_error_{w}'))} / {pct(rep.get(f'{key}_worst_error_{w}'))}"
                for w in ("before", "after", "loo")))
        console.print(errors)
        if rep.get("time_rows_clamped"):
            console.print(f"[yellow]warning:[/] {rep['time_rows_clamped']} timed rows fell outside the searched FLOP/s "
                          "factors (1/20 to 20) and were clamped")
        if result.saved and result.in_use:
            console.print(f"saved to {result.store}: planner estimate / suggest / check now use them for {c.gpu}")
        elif result.saved:
            console.print(f"saved to {result.store}: planner estimate / suggest / check use them for {c.gpu} with "
                          f"--calibration {result.store} (or PLANNER_CALIBRATION={result.store})")
    if not result.corrections:
        console.print(f"nothing to fit: {result.measurements} measurements in {result.store}, none with status ok on a GPU")
    elif not result.saved:
        console.print("dry run: nothing saved")
