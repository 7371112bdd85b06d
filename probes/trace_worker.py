"""One trace child reused over many traces (``planner tune --fidelity traced``'s trials).

A traced probe in a fresh child (probes/traced.py ``trace``) spends about 4 s of start-up on 2 CPU
cores: starting Python and importing torch, transformers, torch's memory tracker and the planner
(the model is built per trace either way). A tune spends one probe per trial, so ``TraceWorker``
keeps one child alive and sends it one request at a time: JSON lines in on stdin, one answer line
(``probes.child.RESULT_PREFIX`` + JSON) out on stdout.

What a reused child keeps from one trace to the next, and why the bytes are the same as a fresh
child's: every patch a trace makes is undone when it ends (``run_trace``'s ExitStack), the tracker
and the model are per trace, and ``trace_many`` already runs a batch of requests in one child. One
process-wide fact is not per trace: the fake process group of sharded plans has one world size per
process (probes/model_setup.py ``fake_process_group``), so the worker restarts its child when a
sharded or Ulysses request needs another world size (``traced.fake_world``).
tests/test_trace_worker.py checks a reused child's results equal fresh children's.

Failures stay per trial, as ``trace``'s: a request the child answers with an error is raised as
ProbeFailedError; a child that dies, or overruns the timeout (its process group killed, as
probes/child.py does), is raised as ProbeFailedError too, and the next request starts a new child.
The child exits when its stdin closes (after the trace it is running, if any), so it outlives the
planner by one trace at most, as a fresh child does.
"""

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from planner.core.errors import ProbeFailedError
from planner.probes.child import RESULT_PREFIX, _kill_group
from planner.probes.traced import TraceRequest, TraceResult, fake_world

_EOF = None  # the reader's mark: the child's stdout closed


class TraceWorker:
    """A persistent ``python -m probes.trace_worker`` child; ``trace`` is ``probes.traced.trace``'s contract."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._stderr: IO[bytes] | None = None
        self._world: int | None = None  # the fake process group's world size in the child (None: none yet)
        self.started = 0  # children started so far (a test reads it)
        self._lock = threading.Lock()  # one request at a time in the child

    def trace(self, req: TraceRequest, timeout: float = 600) -> TraceResult:
        with self._lock:
            return self._trace(req, timeout)

    def _trace(self, req: TraceRequest, timeout: float) -> TraceResult:
        world = fake_world(req)
        if world is not None and self._world not in (None, world):
            self.close()
        proc = self._ensure()
        if world is not None:
            self._world = world
        try:
            assert proc.stdin is not None
            proc.stdin.write(req.model_dump_json() + "\n")
            proc.stdin.flush()
        except OSError:  # the child died before it read the request (BrokenPipeError is one)
            tail = self._tail()
            self._lost()
            raise ProbeFailedError(f"traced probe failed: the probe process died ({tail})") from None
        try:
            line = self._answer(timeout)
        except queue.Empty:
            self.close()
            raise ProbeFailedError(f"traced probe timed out after {timeout:g} s") from None
        if line is _EOF:
            tail = self._tail()
            self._lost()
            raise ProbeFailedError(f"traced probe failed: the probe process died ({tail})")
        value = json.loads(line[len(RESULT_PREFIX):])
        if isinstance(value, str):
            raise ProbeFailedError(f"traced probe failed: {value}")
        return TraceResult.model_validate(value)

    def start(self) -> None:
        """Start the child now (it imports torch and transformers while the caller prepares the
        first request); ``trace`` starts it otherwise."""
        with self._lock:
            self._ensure()

    def close(self) -> None:
        """Stop the child (its process group) now; the next ``trace`` starts a new one."""
        if self._proc is not None:
            if self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()
                except OSError:
                    pass
            _kill_group(self._proc)
        self._lost()

    def _ensure(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._lost()
        # as probes/child.py run_child: the planner's own tree first on the path, its own session
        path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")) if p)
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._proc = subprocess.Popen([sys.executable, "-P", "-m", "planner.probes.trace_worker"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True, start_new_session=True,
                                      env={**os.environ, "PYTHONPATH": path})
        self._lines = queue.Queue()
        threading.Thread(target=_read, args=(self._proc.stdout, self._lines), daemon=True).start()
        self.started += 1
        return self._proc

    def _answer(self, timeout: float) -> str | None:
        """The child's next answer line (``_EOF`` if it died); queue.Empty after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._lines.get(timeout=max(deadline - time.monotonic(), 0))
            if line is _EOF or line.startswith(RESULT_PREFIX):
                return line

    def _tail(self) -> str:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _kill_group(self._proc)
        code = self._proc.returncode if self._proc is not None else None
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit {code}"
        if self._stderr is None:
            return how
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(self._stderr.tell() - 2000, 0))
        return f"{how}: {self._stderr.read().decode(errors='replace').strip()}"

    def _lost(self) -> None:
        self._proc, self._world = None, None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> "TraceWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read(stream, lines: queue.Queue) -> None:
    """The parent's reader thread: every stdout line of the child, then ``_EOF``."""
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(_EOF)


def main() -> None:
    """In the child: one request per stdin line, one answer line each (a result, or the error's text)."""
    from planner.probes.child import answer
    from planner.probes.traced import preload, run_trace

    preload()  # while the parent prepares the first request
    for raw in sys.stdin:
        if not raw.strip():
            continue
        try:
            value: object = run_trace(TraceRequest.model_validate_json(raw)).model_dump()
        except Exception as exc:  # one bad request must not lose the worker
            value = f"{type(exc).__name__}: {str(exc)[:1500]}"
        answer(value)


if __name__ == "__main__":
    main()
