"""The console every screen and message prints through: rich's, with the text of each segment
made printable (planner/core/terminal.py), so nothing a user wrote acts on the terminal. Styling
is rich's own control output and passes as it is."""

from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from planner.core.terminal import printable


class SafeConsole(Console):
    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control:
                yield segment
            else:
                text = printable(segment.text)
                yield segment if text == segment.text else Segment(text, segment.style, segment.control)
