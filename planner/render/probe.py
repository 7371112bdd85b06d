"""Rendering probe results: the traced comparison (``planner probe``), the measured one
(``--fidelity measured``) and ``planner suggest --probe``'s measured plans. Results are read by
their attributes (the probes' own types live with the probes)."""

from rich.markup import escape

from planner.render.layout import heading
from planner.render.layout import table as plain_table
from planner.render.next_steps import suggest_next
from planner.render.plans import suggestion
from planner.strategies import summary


def render_probe(r, console) -> None:
    c = r.comparison
    depth = f", {c.layers} layers" if c.layers else ""
    console.print(f"[bold]{c.model}[/] traced on CPU fake tensors{depth}, world size {c.world_size}: "
                  f"{c.trace_seconds:.1f} s")
    table = plain_table(("term", "left"), ("analytic (MiB)", "right"), ("probe (MiB)", "right"), ("probe is", "left"),
                        ("error", "right"), ("agrees", "left"), wrap=("term", "probe is"))
    for t in c.terms:
        table.add_row(t.term, f"{t.analytic / 2**20:,.1f}", f"{t.traced / 2**20:,.1f}", t.source, f"{t.error:+.1%}",
                      ("exact" if t.agrees else "[red]differs[/]") if t.exact else
                      ("yes" if t.agrees else "[red]no[/]"))
    console.print(table)
    for note in c.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    if r.explanation:
        console.print("alive at the traced peak (bytes | category | op | module | shape | dtype | phase):")
        for line in r.explanation:
            console.print(line, highlight=False)
    console.print("[bold green]AGREE[/]" if r.agrees else "[bold red]DISAGREE[/] (states exact, the rest within 5 %)")


def render_measured(r, console) -> None:
    depth = (f", extrapolated from {', '.join(map(str, r.extrapolated_from))} layers"
             if r.extrapolated_from else f", {r.layers} layers" if r.layers else "")
    console.print(f"[bold]{r.model}[/] measured on {r.device or r.device_gpu} for {r.gpus}{depth}: {r.status}"
                  + (f" at {r.where}" if r.where else ""), highlight=False)
    table = plain_table(("figure", "left"), ("analytic", "right"), ("measured", "right"), ("error", "right"),
                        wrap=("figure",))
    gib = 2**30

    def row(name: str, predicted: float | None, measured: float | None, unit: float, fmt: str, error=None):
        table.add_row(name, "-" if predicted is None else fmt.format(predicted / unit),
                      "-" if measured is None else fmt.format(measured / unit), "" if error is None else f"{error:+.1%}")

    row("peak GPU memory (GiB)", r.predicted_peak_bytes, r.measured_peak_bytes, gib, "{:,.2f}", r.memory_error)
    row("allocated peak (GiB)", r.predicted_allocated_bytes, r.measured_allocated_bytes, gib, "{:,.2f}")
    row("reserved peak (GiB)", None, r.measured_reserved_bytes, gib, "{:,.2f}")
    row("step (s)", r.predicted_step_seconds, r.measured_step_seconds, 1, "{:.4f}", r.time_error)
    row("tokens/s (this GPU)", None, r.tokens_per_second, 1, "{:,.0f}")
    row("MFU", None, r.mfu, 0.01, "{:.1f} %")
    console.print(table)
    m = r.measurement
    if m.alloc_retries:
        console.print(f"allocator retries: {m.alloc_retries} (cudaMalloc failed and the cache was flushed: "
                      "the step ran near the memory limit)", highlight=False)
    if r.message:
        console.print(f"message: {escape(r.message)}", highlight=False)
    for note in r.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    if r.stored:
        console.print(f"stored in {r.stored} (planner calibrate fits the cost model's corrections from it)",
                      highlight=False)
    console.print(("[bold green]" if r.agrees else "[bold red]") + r.verdict + "[/]")


def render_probed(r, console, asked=None) -> None:
    suggestion(r.suggestion, console, asked)
    heading(console, f"measured on {r.probes[0].device if r.probes else '-'} "
                     "(sharded plans: one rank, communication modelled and left out of both rates)")
    table = plain_table(("rank", "right"), ("config", "left"), ("peak GiB\nanalytic", "right"), ("\nmeasured", "right"),
                        ("tokens/s/GPU\nanalytic", "right"), ("\nmeasured", "right"), ("verdict", "left"),
                        wrap=("config", "verdict"))
    for i, p in enumerate(r.probes, 1):
        c = p.config
        label = f"{summary(c, 'compact', ' ')} mbs {c.micro_batch_size}x{c.grad_accum}"
        analytic_rate = c.micro_batch_size * c.grad_accum * c.seq_len / p.predicted_step_seconds
        table.add_row(str(i), label, f"{p.predicted_peak_bytes / 2**30:.2f}",
                      "-" if p.measured_peak_bytes is None else f"{p.measured_peak_bytes / 2**30:.2f}",
                      f"{analytic_rate:,.0f}", "-" if p.tokens_per_second is None else f"{p.tokens_per_second:,.0f}",
                      p.verdict)
    console.print(table)
    for i, p in enumerate(r.probes, 1):
        if p.status != "ok":
            console.print(f"plan {i}: {p.status}" + (f" at {p.where}" if p.where else "") + f": {escape(p.message)}",
                          highlight=False)
    if r.best_rank:
        console.print(f"[bold]fastest measured: plan {r.best_rank}[/]")
    else:
        console.print("[bold red]no probed plan ran[/]")
    suggest_next(r.suggestion, asked, console)
