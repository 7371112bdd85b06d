"""Run a function in a child forked from this process: JSON out through a pipe, a hard timeout.

A fresh ``python -m`` child (probes/child.py) imports torch, transformers and planner again:
several seconds a probe, minutes over a validation run's cases. A forked child starts with what
this process imported already. The rules that make that safe:
- this process must not have started CUDA (a forked child cannot use a context its parent made):
  ``run_forked`` refuses when ``torch.cuda.is_initialized()``; the child starts its own;
- the child runs in its own session (process group), so on timeout the child and anything it
  started get SIGTERM and, after a grace period, SIGKILL, as probes/child.py does;
- the child leaves with ``os._exit``: none of this process's exit handlers run twice.

The answer is the function's return value as JSON; an exception in the child is an answer with
the exception's text (``ChildOutcome.status == "crashed"``), a child that dies without answering
(a segfault inside a CUDA library) is "crashed" with its exit status.
"""

import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from planner.probes.child import KILL_GRACE_SECONDS, ChildOutcome


def run_forked(fn: Callable[[str], object], payload: str, timeout: float) -> ChildOutcome:
    """``fn(payload)`` in a forked child; at most ``timeout`` seconds (then its group is killed)."""
    return collect(start_forked(fn, payload), time.perf_counter() + timeout)


@dataclass
class Forked:
    """A running forked child: its pid, the pipe's read end, when it started."""

    pid: int
    pipe: int
    start: float


def start_forked(fn: Callable[[str], object], payload: str) -> Forked:
    """Fork a child that runs ``fn(payload)`` and writes its answer to a pipe; ``collect`` it.
    Several may run at once (forked one after another from the main thread)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("run_forked: this process started CUDA; a forked child could not use the GPU")
    start = time.perf_counter()
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        os.setsid()
        code = 0
        try:
            data = json.dumps({"value": fn(payload)})
        except BaseException as e:  # the parent reads the failure as an outcome
            data, code = json.dumps({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}), 1
        try:
            with os.fdopen(write_end, "w") as pipe:
                pipe.write(data)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    return Forked(pid, read_end, start)


def collect(child: Forked, deadline: float) -> ChildOutcome:
    """The child's answer, waiting until ``deadline`` (perf_counter seconds), then killing it."""
    chunks = []
    try:
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                _kill_group(child.pid)
                return ChildOutcome("timeout", seconds=time.perf_counter() - child.start)
            ready, _, _ = select.select([child.pipe], [], [], remaining)
            if ready:
                chunk = os.read(child.pipe, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    except BaseException:  # KeyboardInterrupt while waiting: never leave the child behind
        _kill_group(child.pid)
        raise
    finally:
        os.close(child.pipe)
    status = _wait(child.pid, max(1.0, deadline - time.perf_counter()))
    seconds = time.perf_counter() - child.start
    try:
        answer = json.loads(b"".join(chunks).decode())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return ChildOutcome("crashed", returncode=status, stderr_tail="the child died without answering",
                            seconds=seconds)
    if "error" in answer:
        return ChildOutcome("crashed", returncode=status, stderr_tail=answer["error"] + "\n" + answer["trace"],
                            seconds=seconds)
    return ChildOutcome("ok", value=answer["value"], returncode=status, seconds=seconds)


def _wait(pid: int, timeout: float) -> int | None:
    """The child's exit status (negative: killed by that signal), killing it if it lingers."""
    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    _kill_group(pid)
    return None


def _kill_group(pid: int) -> None:
    """SIGTERM to the child's process group, SIGKILL to the group after the grace period (the
    child itself too, should it not have made its group yet), and the child reaped."""
    reaped = False
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.perf_counter() + (KILL_GRACE_SECONDS if sig == signal.SIGTERM else 0)
        while not reaped and time.perf_counter() < end:
            reaped = _reap(pid)
            time.sleep(0.05)
    if not reaped:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _reap(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True
