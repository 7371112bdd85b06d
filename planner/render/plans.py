"""``planner suggest`` on screen: the verdict and the winner in one line, what was assumed, what
approximations would buy, the top plans, the winner in detail, what to run next.

The top plans are a table when it fits the width (a technique that is the same in every plan moves
to an 'all plans' line above it); otherwise two lines per plan."""

from rich.console import Console
from rich.table import Table

from planner.core.formatting import gib
from planner.core.units import GIB
from planner.render.breakdown import (
    config_line,
    peak_cell,
    peak_words,
    plan_words,
    reasons,
    render_breakdown,
    target_line,
    tokens,
)
from planner.render.layout import fits, heading, line, paragraph, table, verdict
from planner.render.next_steps import Asked, suggest_next
from planner.strategies import TECHNIQUES, value_words

MFU_NOTE = "MFU: model FLOPs over the GPU's 16-bit dense peak (bf16; fp16 where it has none), for every plan"


def render_suggest(result, console: Console, asked: Asked | None = None) -> None:
    """The whole screen: ``suggestion`` and what to run next."""
    suggestion(result, console, asked)
    suggest_next(result, asked, console)


def suggestion(result, console: Console, asked: Asked | None = None) -> None:
    """Everything but the next steps (``planner suggest --probe`` adds its measurements between)."""
    if result.fits:
        best = result.plans[0]
        verdict(console, "A PLAN FITS", f"{plan_words(best)}, {tokens(best)}, {peak_words(best)}", good=True)
        target_line(best, console)
    else:
        verdict(console, "NOTHING FITS", _nothing_words(result, asked), good=False)
    paragraph(console, "assumptions", list(getattr(result, "assumptions", [])))
    if result.fits:
        _trade_offs(result, console)
        _training(result, console)
    _adapter_option(result, console)
    _exact_host(result, console)
    reasons(result.reasons, console)
    if result.fits:
        _top(result, console)
        heading(console, "The winner (#1) in detail")
        config_line(result.plans[0], console)
        render_breakdown(result.plans[0], console)
    console.print()
    skipped = f", skipped {result.dominated:,} (a simpler twin decides them)" if result.dominated else ""
    line(console, f"considered {result.considered:,}, evaluated {result.evaluated:,}{skipped}; rejected: "
                  + (", ".join(f"{k} {v:,}" for k, v in result.rejected.items()) or "none"))


def _nothing_words(result, asked: Asked | None) -> str:
    """The hardware where a plan fits, else the least GPU memory a plan needs (or how far the nearest
    miss is)."""
    words = f"none of {result.considered:,} candidates fits" + (f" on {asked.gpus}" if asked else "")
    fixes = [_fix_words(s) for s in getattr(result, "hardware_suggestions", [])]
    if fixes:
        return words + "; a plan fits " + ", or ".join(fixes)
    needs = getattr(result, "needs_bytes", None)
    if needs:
        usable = result.nearest[0].usable_bytes if result.nearest else None
        return words + f"; a plan needs at least {gib(needs)} per GPU" + (f", {gib(usable)} usable" if usable else "")
    if result.nearest:
        near = result.nearest[0]
        short = -near.headroom_bytes
        host_short = near.host_short_bytes
        if short > 0:
            words += f"; the nearest is {gib(short)} short per GPU"
        elif host_short > 0:
            words += f"; the nearest is {gib(host_short)} of host RAM short"
    return words


def _fix_words(s) -> str:
    """'on 8xH100-SXM-80', 'with 1,024 GB host RAM per node', or both."""
    host = getattr(s, "host_memory_gb", None)
    parts = [] if host and s.change == "more host RAM" else [f"on {s.gpus}"]
    if host:
        parts.append(f"with {host:,.0f} GB host RAM per node")
    return " ".join(parts)


def _trade_offs(result, console: Console) -> None:
    """One line per faster plan that changes numerics, beside the winner."""
    policy = getattr(getattr(result, "numerics", None), "value", None)
    hint = "; changes numerics: --numerics any" if policy and policy != "any" else ""
    for t in getattr(result, "trade_offs", []):
        line(console, f"approximations would give {100 * t.gain:+.0f} % ({tokens(t.plan)}): "
                      f"{'; '.join(t.approximations)}{hint}")


def _adapter_option(result, console: Console) -> None:
    """One line: what LoRA / QLoRA would give where full fine-tuning does not fit or is far slower."""
    a = getattr(result, "adapter_option", None)
    if a is None:
        return
    than = "full fine-tuning does not fit" if a.gain is None else f"{100 * a.gain:+.0f} % over full fine-tuning"
    line(console, f"--adapter {a.adapter} would give {a.tokens_per_second:,.0f} tokens/s at {gib(a.peak_bytes)} "
                  f"({than}; a different method: it trains adapters on the frozen model)")


def _exact_host(result, console: Console) -> None:
    """One line when host RAM decides the numerics: with how much an exact plan fits, and how fast."""
    h = getattr(result, "exact_host", None)
    if h is None:
        return
    than = f" ({100 * (h.tokens_per_second / result.plans[0].time.tokens_per_second - 1):+.0f} %)" if result.fits else ""
    least = (f" (any exact plan needs >= {h.least_host_memory_gb:,} GB)"
             if h.least_host_memory_gb < h.host_memory_gb else "")
    line(console, f"host RAM decides the numerics: the fastest exact plan fits with >= {h.host_memory_gb:,} GB "
                  f"per node{least} (--host-memory-gb {h.host_memory_gb}): {h.summary}, "
                  f"{h.tokens_per_second:,.0f} tokens/s{than}, {gib(h.peak_bytes)} per GPU, "
                  f"host RAM {gib(h.host_peak_bytes)}")


def _training(result, console: Console) -> None:
    """--tokens: wall clock, GPU-hours and (with a price) the cost."""
    t = getattr(result, "training", None)
    if t is None:
        return
    gpus = result.plans[0].hardware.num_gpus
    days = f" ({t.hours / 24:,.1f} days)" if t.hours >= 48 else ""
    cost = f", {t.cost:,.2f} at {t.cost / t.gpu_hours:,.2f}/GPU-hour" if t.cost is not None and t.gpu_hours else ""
    line(console, f"{_tokens_count(t.tokens)} tokens: {t.hours:,.1f} h{days} on {gpus} GPU{'s' if gpus > 1 else ''} "
                  f"({t.gpu_hours:,.1f} GPU-hours{cost})")


def _tokens_count(n: float) -> str:
    """2e9 -> '2.0e9'."""
    mantissa, exponent = f"{n:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _top(result, console: Console) -> None:
    plans = result.plans
    heading(console, f"Top {len(plans)} of {result.considered:,} candidates (global batch {result.global_batch_size} "
                     f"x {result.seq_len} tokens, {result.engine})")
    varying = [s for s in TECHNIQUES if len({value_words(s, p.config) for p in plans}) > 1]
    same = [s for s in TECHNIQUES if s not in varying]
    first = plans[0].config
    line(console, "all plans: " + ", ".join(f"{s.short} {value_words(s, first)}" for s in same)
         + ("; " if same else "") + f"{plans[0].hardware.gpu_memory_bytes / GIB:,.1f} GiB per GPU")
    grid = _table(plans, varying)
    if fits(console, grid):
        console.print(grid)
    else:
        _two_lines(plans, varying, console)
    line(console, MFU_NOTE)


def _table(plans, varying) -> Table:
    right = ("mbs x accum", "peak GiB", "host GiB", "tokens/s", "MFU", "step s")
    t = table(("#", "right"), *((s.short, "left") for s in varying), *((name, "right") for name in right))
    for i, p in enumerate(plans, 1):
        c = p.config
        t.add_row(str(i), *(value_words(s, c) for s in varying), f"{c.micro_batch_size} x {c.grad_accum}",
                  peak_cell(p), f"{p.host_memory['peak'] / GIB:,.0f}", f"{p.time.tokens_per_second:,.0f}",
                  f"{p.time.mfu:.1%}", f"{p.time.step_seconds:,.2f}")
    return t


def _two_lines(plans, varying, console: Console) -> None:
    """Narrow screens: per plan its figures, then what sets it apart; both wrap at spaces."""
    width = len(str(len(plans))) + 2
    for i, p in enumerate(plans, 1):
        c = p.config
        figures = (f"{tokens(p)} · peak {peak_cell(p)} GiB · host {p.host_memory['peak'] / GIB:,.0f} GiB · "
                   f"MFU {p.time.mfu:.1%} · {p.time.step_seconds:,.2f} s/step")
        apart = ", ".join([*(f"{s.short} {value_words(s, c)}" for s in varying),
                           f"mbs {c.micro_batch_size} x {c.grad_accum}"])
        line(console, figures, indent=width, first=f"{i}.".rjust(width - 1) + " ")
        line(console, apart, indent=width, style="dim")
