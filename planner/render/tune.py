"""What ``planner tune`` shows: live progress, the predicted-vs-probed table, the PNG plot."""

import io

from rich.console import Console
from rich.markup import escape

from planner.core.units import GIB
from planner.render.layout import line
from planner.schema.tune import TrialRow, TuneResult
from planner.strategies import TECHNIQUES, summary


class Progress:
    """A live line on stderr: probes spent of the budget, the best so far, the fidelity."""

    def __init__(self, budget: int, fidelity: str, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.fidelity, self.best = fidelity, 0.0
        self.bar = Bar(TextColumn("[bold]tune[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=console, transient=False)
        self.task = self.bar.add_task(self._text(None), total=budget)

    def _text(self, row: TrialRow | None) -> str:
        last = "" if row is None else f" | trial {row.number}: {row.status or row.state}"
        return f"{self.fidelity}, best {self.best:,.0f} tokens/s{last}"

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def update(self, row: TrialRow, probes: int) -> None:
        if row.probed and row.status == "ok" and row.feasible and row.tokens_per_second:
            self.best = max(self.best, row.tokens_per_second)
        self.bar.update(self.task, completed=probes, description=self._text(row))


def render_tune(r: TuneResult, console: Console) -> None:
    console.print(f"study [bold]{r.study_name}[/] in {r.storage}", highlight=False)
    console.print(f"fidelity: {r.fidelity}; {r.probes} probes; stopped: {r.stopped}", highlight=False)
    for note in r.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    probed = [t for t in r.trials if t.probed]
    # one line per trial: what every probed trial shares goes above the table, as suggest's top plans
    varying = [x for x in TECHNIQUES if len({t.config.get(x.field) for t in probed}) > 1]
    if probed:
        first = probed[0].config
        line(console, "all probed trials: " + ", ".join(f"{x.short} {first.get(x.field)}" for x in TECHNIQUES
                                                        if x not in varying))
    fidelities = len({t.fidelity for t in probed}) > 1  # (one fidelity: the header says it)
    what = " ".join(x.short for x in varying) + " mbs" + (" fidelity" if fidelities else "")
    # a trial a line: its figures in fixed columns, then the values that differ between trials
    # (wrapped under themselves if they are long)
    console.print(f"{'':5} {'peak GiB':>11} {'k tokens/s':>13}", highlight=False)
    line(console, what, indent=33, first=f"{'trial':>5} {'pred/probed':>11} {'pred/probed':>13}  ")
    for t in probed:
        best = r.best is not None and t.number == r.best.number
        status = "" if t.status == "ok" and t.feasible else f" {t.status}" + ("" if t.feasible else " (over)")
        values = " ".join(str(t.config.get(x.field)) for x in varying) + f" {t.config.get('micro_batch_size')}"
        peak = f"{_gib(t.predicted_peak_bytes)}/{_gib(t.peak_bytes)}"
        # only a measured run times a step: a traced or analytic trial's speed is the model's own
        timed = t.fidelity == "measured"
        rate = f"{_krate(t.predicted_tokens_per_second)}/{_krate(t.tokens_per_second) if timed else '-'}"
        line(console, values + (f" {t.fidelity}" if fidelities else "") + status, indent=33,
             first=f"{('* ' if best else '') + str(t.number):>5} {peak:>11} {rate:>13}  ")
    if any(t.fidelity != "measured" for t in probed):
        line(console, "probed tokens/s: measured trials only; a traced trial measures memory (fake tensors), "
                      "its speed is the model's prediction")
    pruned = sum(1 for t in r.trials if not t.probed)
    console.print(f"{pruned} trials decided by the analytic model without a probe (predicted not to fit or infeasible)")
    if r.best_plan is not None and r.best is not None:
        c = r.best_plan.config
        speed = "measured" if r.best.fidelity == "measured" else "predicted"
        console.print(f"[bold green]best probed plan:[/] trial {r.best.number}: {r.best.tokens_per_second:,.0f} tokens/s "
                      f"({speed}; {r.best.fidelity} fidelity); {summary(c)}, micro-batch {c.micro_batch_size} x "
                      f"{c.grad_accum}", highlight=False)
    else:
        console.print("[bold red]no probed plan ran within the GPU's memory[/]")
    console.print(f"open the study: optuna-dashboard {r.storage}", highlight=False)


def plot(r: TuneResult) -> bytes | None:
    """predicted vs probed peak memory and throughput, one point per probed trial: a PNG's bytes
    (written with the plan's files, planner/emit/writer.py). None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [t for t in r.trials if t.probed and t.predicted_peak_bytes]
    fig, (mem, rate) = plt.subplots(1, 2, figsize=(11, 5))
    for axis, pairs, unit in (
        (mem, [((t.predicted_peak_bytes or 0) / GIB, t.peak_bytes / GIB, t) for t in rows if t.peak_bytes],
         "peak memory (GiB)"),
        (rate, [(t.predicted_tokens_per_second, t.tokens_per_second, t) for t in rows if t.tokens_per_second],
         "tokens/s"),
    ):
        if pairs:
            xs, ys, ts = zip(*pairs, strict=True)
            colours = ["tab:red" if t.status != "ok" or not t.feasible else "tab:blue" for t in ts]
            axis.scatter(xs, ys, c=colours)
            top, low = max(max(xs), max(ys)) * 1.05, min(min(xs), min(ys)) * 0.9
            axis.plot([low, top], [low, top], color="grey", linewidth=0.8, label="probed = predicted")
            axis.set_xlim(low, top)
            axis.set_ylim(low, top)
            axis.legend(loc="upper left")
        axis.set_xlabel(f"predicted {unit}")
        axis.set_ylabel(f"{r.fidelity} {unit}")
    mem.set_title("peak memory per GPU (red: over the GPU or failed)")
    rate.set_title("throughput")
    fig.suptitle(f"planner tune: {r.study_name}")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    plt.close(fig)
    return png.getvalue()


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GIB:.1f}"


def _krate(x: float | None) -> str:
    """Thousands of tokens/s, one decimal (the table's width)."""
    return "-" if not x else f"{x / 1000:,.1f}"
