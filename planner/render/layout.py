"""Screens that read at any width (80 columns and up): the console's width, tables that fit or give
way to another layout, wrapped paragraphs, and commands to copy.

The one rule every screen keeps: a number is never cut or wrapped. Rich wraps text at spaces only,
so a paragraph is safe; a table is shown only when its natural width fits (``fits``), its figure
columns never wrap (``figures``), and otherwise the caller picks a narrower layout.
"""

import os
from typing import Literal

from rich import box
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from planner.core import shell
from planner.core.errors import bounded
from planner.render.console import SafeConsole

DEFAULT_WIDTH = 100  # stdout is not a terminal and COLUMNS is not set (pipes, CI logs)
SEP = " · "
UNBOUNDED = 100_000
PARAGRAPH_CHARS = 2_000  # a screen's paragraph (a warning, a note) is a few hundred characters


def console_for_stdout() -> Console:
    """The terminal's width when stdout is one; else COLUMNS when set, else 100."""
    console = SafeConsole(highlight=False)
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "").strip()
    width = int(columns) if columns.isdigit() and int(columns) > 0 else DEFAULT_WIDTH
    return SafeConsole(highlight=False, width=width)


def table(*columns: tuple[str, str], wrap: tuple[str, ...] = ()) -> Table:
    """A plain table: a rule under the header, two spaces between columns, no frame. ``columns``:
    (header, "left" | "right"); only the headers named in ``wrap`` may wrap (at spaces), every
    other column keeps its cells whole."""
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    for name, justify in columns:
        side: Literal["left", "right"] = "right" if justify == "right" else "left"
        t.add_column(name, justify=side, no_wrap=name not in wrap, overflow="fold")
    return t


def natural_width(console: Console, renderable: RenderableType) -> int:
    """The width ``renderable`` takes with nothing wrapped (Measurement.get clamps to the options' maximum:
    measured against an unbounded one)."""
    return Measurement.get(console, console.options.update(width=UNBOUNDED), renderable).maximum


def fits(console: Console, renderable: RenderableType) -> bool:
    """Whether ``renderable`` shows at its natural width, nothing wrapped."""
    return natural_width(console, renderable) <= console.width


def line(console: Console, text: str | Text, indent: int = 0, style: str | None = None, first: str = "") -> None:
    """A paragraph wrapped at spaces (plain text, no markup); continuation lines start ``indent``
    spaces in, the first one with ``first`` (a hanging label such as '1. ') or the same indent.
    At most PARAGRAPH_CHARS characters: a warning that quotes a huge key or value is cut there."""
    body = text if isinstance(text, Text) else Text(bounded(text, PARAGRAPH_CHARS), style=style or "")
    lead = first or " " * indent
    for i, part in enumerate(body.wrap(console, max(console.width - max(indent, len(lead)), 20))):
        part.rstrip()
        console.print(Text(lead if i == 0 else " " * indent) + part, soft_wrap=True)


def heading(console: Console, text: str) -> None:
    console.print()
    line(console, text, style="bold")


def verdict(console: Console, word: str, rest: str, good: bool) -> None:
    """The first line of a screen: the verdict word, then what it rests on."""
    text = Text()
    text.append(word, style="bold green" if good else "bold red")
    if rest:
        text.append(": " + rest)
    line(console, text)


def paragraph(console: Console, label: str, items: list[str]) -> None:
    """'label: a · b · c' wrapped as one paragraph, continuation lines indented."""
    if items:
        line(console, f"{label}: " + SEP.join(items))


def command(console: Console, words: list[str], indent: int = 2) -> None:
    """A shell command to copy: kept on one line when it fits, else broken between options with
    ' \\' continuations (each option stays with its value)."""
    groups = _groups(words)
    width = max(console.width - indent - 2, 20)
    lines, current = [], ""
    for g in groups:
        if current and len(current) + 1 + len(g) > width:
            lines.append(current)
            current = "    " + g
        else:
            current = f"{current} {g}" if current else g
    lines.append(current)
    for i, text in enumerate(lines):
        console.print(Text(" " * indent + text + (" \\" if i < len(lines) - 1 else "")))


def _groups(words: list[str]) -> list[str]:
    """Quoted words, an option with its value as one group: ['--model x', '--out d']."""
    out: list[str] = []
    for w in words:
        quoted = w if w in (">", "&&", "|") else shell.quote(w)
        if out and out[-1].startswith("--") and " " not in out[-1] and not w.startswith("--") and w not in (">", "&&"):
            out[-1] += " " + quoted
        else:
            out.append(quoted)
    return out
