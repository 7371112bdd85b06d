"""Rich rendering of an EstimateResult: the ledger as a table, phases, host RAM, verdict."""

from rich.console import Console
from rich.table import Table

from planner.estimate import EstimateResult
from planner.formatting import count, gib, share
from planner.ledger import Location

PHASE_WORDS = {
    "forward": "end of forward / start of backward",
    "backward": "end of backward",
    "step": "optimizer step",
}


def render_estimate(r: EstimateResult, console: Console) -> None:
    m, hw, c = r.model, r.hardware, r.config
    active = f", {count(m.num_active_parameters)} active" if m.num_active_parameters != m.num_parameters else ""
    console.print(
        f"[bold]{m.id}[/] ({m.family}, {count(m.num_parameters)} params{active}) on "
        f"[bold]{_gpus(r)}[/] ({gib(hw.gpu_memory_bytes)} per GPU)"
    )
    console.print(
        f"optimizer {c.optimizer} | precision {c.precision} | checkpointing {c.checkpointing} | sharding {c.sharding} | "
        f"offload {c.offload} | loss {c.loss} | attention {c.attention} | micro-batch {c.micro_batch_size} x "
        f"accum {c.grad_accum} x seq {c.seq_len}"
    )
    table = Table(title=f"Memory per GPU at the {r.peak_phase} peak ({PHASE_WORDS[r.peak_phase]})", title_justify="left")
    table.add_column("term")
    table.add_column("GiB", justify="right")
    table.add_column("of GPU", justify="right")
    table.add_column("how")
    for row in r.ledger:
        if row.location == Location.GPU and r.peak_phase in row.phases:
            table.add_row(row.label, f"{row.bytes / 2**30:,.2f}", share(row.bytes, hw.gpu_memory_bytes), row.note)
    table.add_section()
    table.add_row("[bold]peak[/]", f"[bold]{r.memory['peak'] / 2**30:,.2f}[/]", share(r.memory["peak"], hw.gpu_memory_bytes), "")
    console.print(table)
    console.print("phases: " + " | ".join(f"{p} {gib(b)}" for p, b in r.phase_peaks.items()))
    host_rows = [row for row in r.ledger if row.location == Location.HOST]
    h = r.host_memory
    console.print(
        f"host RAM per node: {gib(h['peak'])} of {gib(h['capacity'])} "
        f"(offloaded {gib(h['offloaded'])}, paged spill {gib(h['paged_spill'])}, "
        f"processes {gib(h['process_runtime'])}, model load {gib(h['model_loading'])})"
    )
    for row in host_rows:
        console.print(f"  on host, per GPU: {row.label}: {gib(row.bytes)}")
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    verdict = "[bold green]FITS[/]" if r.fits else ("[bold red]INFEASIBLE[/]" if not r.feasible else "[bold red]DOES NOT FIT[/]")
    console.print(verdict)
    for reason in r.reasons:
        console.print(f"  {reason}")


def _gpus(r: EstimateResult) -> str:
    hw = r.hardware
    nodes = f"{hw.nodes}x" if hw.nodes > 1 else ""
    return f"{nodes}{hw.gpus_per_node}x{hw.gpu}"


def console_for_stdout() -> Console:
    """Wide enough for the ledger table when stdout is not a terminal (pipes, CI logs)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    return console
