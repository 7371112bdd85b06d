"""The command line (thin): options become one request, one function plans, one renderer prints.

``main`` answers ``planner --version`` without importing the commands (typer, rich, the
catalogs, the strategies); ``app`` is imported when first asked for.
"""

import atexit
import os
import sys
import threading


def main() -> None:
    """The ``planner`` command."""
    if sys.argv[1:] == ["--version"]:
        from planner.cli.version import version

        sys.stdout.write(f"planner {version()}\n")
        return
    # pydantic looks for plugins on the first model it builds by reading every installed
    # distribution's entry points (~12 ms for this venv's 79, more with more packages); planner's
    # models use none. A value the user set is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from planner.cli.commands import main as run

    try:
        run()
    except SystemExit as done:
        _exit_now(done.code)
    _exit_now(0)


def _exit_now(code: object) -> None:
    """End the process with ``code`` (as ``sys.exit`` reads it) without the interpreter's
    teardown: freeing the ~50,000 objects of the imported modules costs ~0.13 s of the 0.5 s a
    planning command may take (docs/architecture.md). What a normal exit does that matters still
    happens: the exit handlers run (``atexit``, and ``weakref.finalize`` such as temporary
    folders) and both streams are flushed. Where another non-daemon thread still runs, the
    normal exit waits for it, and so does this: it raises ``SystemExit`` instead."""
    if threading.active_count() > 1:
        raise SystemExit(code)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        sys.stderr.write(f"{code}\n")
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120
    os._exit(status)


def __getattr__(name: str):
    if name == "app":
        from planner.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
