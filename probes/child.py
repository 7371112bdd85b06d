"""Run a probe in a fresh child process: JSON in on stdin, JSON out on stdout, a hard timeout.

A probe may crash inside torch or a CUDA library, hang in a collective, or run out of memory; none
of that may take the planner down or outlive its timeout. The child runs in its own session
(process group), so on timeout the whole group — the child and anything it started (DeepSpeed's
compile workers, data loader workers) — gets SIGTERM and, after a grace period, SIGKILL.

The child prints its answer with ``answer``: one line of JSON after ``RESULT_PREFIX``; anything
else it prints (library chatter, DeepSpeed's log lines) is ignored.
"""

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RESULT_PREFIX = "@planner-probe-result "
#: Seconds between SIGTERM and SIGKILL when a child overruns its timeout.
KILL_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class ChildOutcome:
    status: str  # "ok" (the child answered), "crashed" (no answer), "timeout"
    value: object = None  # the decoded answer when ok
    returncode: int | None = None
    stderr_tail: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        if self.status == "timeout":
            return f"timed out after {self.seconds:g} s (process group killed)"
        how = (f"killed by signal {-self.returncode}" if self.returncode is not None and self.returncode < 0
               else f"exit {self.returncode}")
        return f"the probe process died ({how}): {self.stderr_tail}"


def run_child(module: str, payload: str, timeout: float, env: dict[str, str] | None = None) -> ChildOutcome:
    """``python -m module`` with ``payload`` on stdin; at most ``timeout`` seconds (then the process
    group is killed, and the outcome says so)."""
    import time

    start = time.perf_counter()
    # -P: not the working directory; PYTHONPATH: the tree this process imported planner from. The child
    # runs the same code as its parent (an installed package stays installed, a checkout a checkout).
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-P", "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": path, **(env or {})})
    try:
        out, err = proc.communicate(payload, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return ChildOutcome("timeout", seconds=timeout)
    finally:
        if proc.poll() is None:  # an exception while waiting (KeyboardInterrupt): never leave it behind
            _kill_group(proc)
    seconds = time.perf_counter() - start
    answer = next((line[len(RESULT_PREFIX):] for line in reversed(out.splitlines()) if line.startswith(RESULT_PREFIX)),
                  None)
    tail = err[-2000:].strip()
    if answer is None:
        return ChildOutcome("crashed", returncode=proc.returncode, stderr_tail=tail, seconds=seconds)
    try:
        value = json.loads(answer)
    except json.JSONDecodeError:
        return ChildOutcome("crashed", returncode=proc.returncode, stderr_tail=tail, seconds=seconds)
    return ChildOutcome("ok", value=value, returncode=proc.returncode, stderr_tail=tail, seconds=seconds)


def answer(value: object) -> None:
    """In the child: print the answer the parent reads."""
    sys.stdout.write(f"\n{RESULT_PREFIX}{json.dumps(value)}\n")
    sys.stdout.flush()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, SIGKILL to whatever is left after the grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=KILL_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pass
    proc.wait()
