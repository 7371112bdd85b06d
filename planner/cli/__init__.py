"""The command line (thin): options become one request, one function plans, one renderer prints.

``main`` answers ``planner --version`` without importing the commands (typer, rich, the
catalogs, the strategies); ``app`` is imported when first asked for.
"""

import sys


def main() -> None:
    """The ``planner`` command."""
    if sys.argv[1:] == ["--version"]:
        from planner.cli.version import version

        sys.stdout.write(f"planner {version()}\n")
        return
    from planner.cli.commands import main as run

    run()


def __getattr__(name: str):
    if name == "app":
        from planner.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
