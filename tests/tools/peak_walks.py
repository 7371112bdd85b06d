"""Child of tests/test_tracker_peaks.py: trace requests with the active-module peaks and with torch's
own walk over every module, and report both (JSON on stdout).

    python tests/tools/peak_walks.py < requests.json

stdin: a JSON list of TraceRequest objects (one world size: the fake process group is per process).
The first trace in a process under FSDP2 holds a transient optimizer state in its first (unmeasured)
iteration that later traces do not: torch's whole-run peak (``_peak_mem_snap``) differs, the
probe's figures (its last iteration) do not. So the child traces the first request once before the
pairs, and every pair runs in a warm process. For each request, two traces in this process:
- ``walk_all`` (torch's MemTracker ``_update_peak_stats``, unchanged): the reference;
- the active-module index (probes/active_peaks.py), and after each of its updates torch's walk on
  the same state: if the index missed a module that torch would raise, torch's walk changes its
  ``local_peak``, and the op is counted in ``missed``.
Each trace reports the TraceResult (seconds left out), the tracker's peak snapshot, and every
tracked module's local peak and peak snapshots when the tracker exits (the modules are weak keys:
they leave ``memory_tracking`` when the trace drops the model).
"""

import json
import sys

from planner.probes import active_peaks, tracker
from planner.probes.traced import TraceRequest, run_trace

_walk = active_peaks.ActivePeaks._update_peak_stats


def _plain(snapshot: dict) -> dict:
    return {str(dev): {getattr(k, "value", k): v for k, v in per.items()} for dev, per in snapshot.items()}


def _modules(t) -> dict:
    return {stats.mod_fqn: {
        "local_peak": {str(d): v for d, v in stats.local_peak.items()},
        "snapshots": {getattr(s, "value", s): [_plain(x) for x in snaps] for s, snaps in stats.snapshots.items()},
    } for stats in t.memory_tracking.values()}


def _report(t, result) -> dict:
    return {"result": result.model_dump(exclude={"seconds"}), "peak": _plain(t._peak_mem_snap), "modules": t.modules}


def _exit(self, *args) -> None:
    if self._depth == 1:  # leaving the outermost context: the model is still alive
        self.modules = _modules(self)
    super(active_peaks.ActivePeaks, self).__exit__(*args)


def _checked(self, peak_state) -> None:
    """The index's update, then torch's walk over every module: it must find nothing left to raise."""
    _walk(self, peak_state)
    before = {id(s): dict(s.local_peak) for s in self.memory_tracking.values()}
    peak_before = dict(self._peak_mem)
    super(active_peaks.ActivePeaks, self)._update_peak_stats(peak_state)
    after = {id(s): dict(s.local_peak) for s in self.memory_tracking.values()}
    self.checked_ops = getattr(self, "checked_ops", 0) + 1
    if after != before or self._peak_mem != peak_before:
        self.missed = getattr(self, "missed", 0) + 1


def main() -> None:
    trackers: list = []
    init = tracker._StepTracking._init_step_tracking

    def recording_init(self, explain):
        init(self, explain)
        trackers.append(self)

    tracker._StepTracking._init_step_tracking = recording_init  # type: ignore[method-assign]
    active_peaks.ActivePeaks.__exit__ = _exit  # type: ignore[method-assign]
    out = []
    requests = [TraceRequest.model_validate(raw) for raw in json.loads(sys.stdin.read())]
    run_trace(requests[0])  # warm the process (above)
    for req in requests:
        active_peaks.ActivePeaks.walk_all = True
        result = run_trace(req)
        torch_walk = _report(trackers[-1], result)
        active_peaks.ActivePeaks.walk_all = False
        active_peaks.ActivePeaks._update_peak_stats = _checked  # type: ignore[method-assign]
        try:
            result = run_trace(req)
        finally:
            active_peaks.ActivePeaks._update_peak_stats = _walk  # type: ignore[method-assign]
        t = trackers[-1]
        indexed = _report(t, result) | {"checked_ops": getattr(t, "checked_ops", 0), "missed": getattr(t, "missed", 0)}
        out.append({"torch": torch_walk, "indexed": indexed})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
