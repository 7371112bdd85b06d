"""One function run in a forked child while the parent goes on: ``suggest`` searches the adapter
line's plans beside the main search, on the machine's second core.

The child is a plain ``os.fork`` (no thread, no executor: the parent may fork its own search
workers afterwards) that sends its pickled result (or exception) back through a pipe and leaves
with ``os._exit`` (no atexit handler, no flush of the parent's buffers). Where fork is not
available or there is one core, the function runs in the parent when its result is asked for.
Either way the result is the function's own: the child only moves the work to another core (a
child that dies or sends nothing readable has its work done again in the parent).
"""

import os
import pickle
import signal
import traceback
from collections.abc import Callable
from typing import Any


class Forked:
    """``fn(*args)``, started now in a child process; ``result()`` waits for it (and keeps it).
    ``in_child``: run first in the child only (e.g. to keep its searches to one process)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, in_child: Callable[[], None] | None = None) -> None:
        self._call, self._in_child = (fn, args), in_child
        self._pid: int | None = None
        self._read: int | None = None
        self._value: tuple[Any] | None = None  # (the result,) once known
        if (os.cpu_count() or 1) > 1 and hasattr(os, "fork"):
            self._start()

    def _start(self) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, leave
            os.close(read)
            code = 0
            try:
                fn, args = self._call
                try:
                    if self._in_child is not None:
                        self._in_child()
                    payload = pickle.dumps((True, fn(*args)))
                except BaseException as exc:  # sent to the parent, which raises it
                    payload = _pickled_error(exc)
                with os.fdopen(write, "wb") as out:
                    out.write(payload)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write)
        self._pid, self._read = pid, read

    def result(self) -> Any:
        if self._value is None:
            self._value = (self._wait(),)
        return self._value[0]

    def _wait(self) -> Any:
        if self._pid is None:
            fn, args = self._call
            return fn(*args)
        assert self._read is not None
        with os.fdopen(self._read, "rb") as inp:
            payload = inp.read()
        self._read = None
        os.waitpid(self._pid, 0)
        self._pid = None
        try:
            ok, value = pickle.loads(payload)
        except Exception:  # the child died (killed, out of memory) or its answer cannot be read:
            fn, args = self._call  # the work was only moved, so do it here
            return fn(*args)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop a child whose result is no longer wanted (an error in the parent)."""
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
            self._pid = None
        if self._read is not None:
            os.close(self._read)
            self._read = None


def _pickled_error(exc: BaseException) -> bytes:
    """``exc`` pickled for the parent; one that cannot be pickled, as a RuntimeError with its
    traceback."""
    try:
        return pickle.dumps((False, exc))
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return pickle.dumps((False, RuntimeError(f"in the forked search:\n{text}")))
