"""Module peaks of torch's MemTracker, updated for the active modules only.

After every op torch's MemTracker (and FSDPMemTracker) calls ``_update_peak_stats``, which walks
*every* module it has seen (``memory_tracking``, a WeakIdKeyDictionary over modules) and keeps the
running peak of those whose name is in ``ModTracker.parents`` (the modules the op runs inside).
That walk is O(modules) per op, so a trace costs O(depth²): at Qwen2.5-0.5B's 24 layers (about 270
modules, 44,600 ops over two steps) it was 71 % of the trace. Each lookup is dear too: a
WeakIdRef call asks the module ``hasattr(_fix_weakref)``, which goes through ``nn.Module.__getattr__``.

``ActivePeaks`` keeps the same figures with an index ``name -> [module stats]``: per op it visits
the buckets of the names in ``parents`` (a handful: the nesting depth) and applies torch's rule to
each, unchanged (torch 2.13, mem_tracker.py ``_update_peak_stats``):

- per active module with a peak snapshot open for this state (``PEAK_FW`` / ``PEAK_BW`` in
  ``snapshots``), per device: if the device's current total exceeds the module's ``local_peak``,
  the total becomes ``local_peak`` and a copy of the device's snapshot replaces the last peak
  snapshot's entry for that device;
- per device: if the current total exceeds the tracker's ``_peak_mem``, it becomes the peak and a
  copy of the device's snapshot becomes ``_peak_mem_snap``'s entry.

The index is exact because it follows every way torch changes what the walk would see:
- a module's stats are added by ``memory_tracking[module] = stats`` (MemTracker's pre-forward hook,
  FSDPMemTracker's pre-forward wrapper): ``_IndexedTracking.__setitem__`` indexes them;
- ``reset_mod_stats`` clears ``memory_tracking``: ``_IndexedTracking.clear`` clears the index;
- a module's name changes only in MemTracker's pre-forward hook (``mod_stats.mod_fqn = mod_name``,
  a module called again in one iteration): ``_pre_fw_hook`` re-files its stats under the name they
  have after the hook (no op is dispatched inside the hook, so no peak update sees a stale name);
- a module that dies leaves ``memory_tracking`` (a weak key) but not the index: its stats may still
  be updated, and nothing can read them (only the dead entry held them), so no figure changes.

tests/test_tracker_peaks.py checks the rule against torch's own walk (``ActivePeaks.walk_all``): every
module's peaks and snapshots, the tracker's peak and the probe's phase peaks, op for op equal.
"""

from copy import deepcopy
from typing import TYPE_CHECKING, Any

from torch.utils.weak import WeakIdKeyDictionary

_TOTAL_KEY = "Total"  # torch's key for a device's total in a snapshot (mem_tracker._TOTAL_KEY)


class _IndexedTracking(WeakIdKeyDictionary):
    """torch's ``memory_tracking`` (module -> stats) that also files the stats by ``mod_fqn``.

    torch writes it only with ``memory_tracking[module] = stats`` and ``clear()`` (mem_tracker.py,
    fsdp2_mem_tracker.py): those two keep the index."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: dict[str, list[Any]] = {}  # mod_fqn -> the stats filed under it
        self._filed_as: dict[int, str] = {}  # id(stats) -> the name it is filed under (the index holds it)

    def __setitem__(self, key, value) -> None:
        old = self.get(key)
        if old is not None:
            self._unfile(old)
        super().__setitem__(key, value)
        self._file(value)

    def clear(self) -> None:
        super().clear()
        self.by_name.clear()
        self._filed_as.clear()

    def refile(self, stats) -> None:
        """File ``stats`` under its current ``mod_fqn`` if it was filed under another name."""
        if self._filed_as.get(id(stats)) != stats.mod_fqn:
            self._unfile(stats)
            self._file(stats)

    def _file(self, stats) -> None:
        self.by_name.setdefault(stats.mod_fqn, []).append(stats)
        self._filed_as[id(stats)] = stats.mod_fqn

    def _unfile(self, stats) -> None:
        name = self._filed_as.pop(id(stats), None)
        bucket = self.by_name.get(name, []) if name is not None else []
        if any(s is stats for s in bucket):
            bucket[:] = [s for s in bucket if s is not stats]


if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker

    class _Tracker(MemTracker):
        """What type checkers see the mixin over: the tracker it mixes into."""

else:
    _Tracker = object


class ActivePeaks(_Tracker):
    """Mixin over MemTracker or FSDPMemTracker: ``_update_peak_stats`` over the active modules only.

    Call ``_init_active_peaks`` after the tracker's ``__init__`` (it replaces ``memory_tracking``,
    still empty then, with the indexed one)."""

    #: False: torch's own walk over every module (the reference the tests compare with)
    walk_all = False
    memory_tracking: Any  # torch's module -> stats, an _IndexedTracking once _init_active_peaks ran

    def _init_active_peaks(self) -> None:
        if len(self.memory_tracking):
            raise RuntimeError("ActivePeaks must index memory_tracking before any module is tracked")
        self.memory_tracking = _IndexedTracking()

    def _pre_fw_hook(self, module, inputs) -> None:
        super()._pre_fw_hook(module, inputs)
        stats = self.memory_tracking.get(module)
        if stats is not None:  # a second call in one iteration renames it (torch: mod_fqn = known fqn)
            self.memory_tracking.refile(stats)

    def _update_peak_stats(self, peak_state) -> None:
        if self.walk_all:
            super()._update_peak_stats(peak_state)
            return
        curr_snap = self._curr_mem_snap
        parents = self._mod_tracker.parents
        by_name = self.memory_tracking.by_name
        for name in parents:
            for mod_stats in by_name.get(name, ()):
                if peak_state not in mod_stats.snapshots:
                    continue
                for dev, dev_snap in curr_snap.items():
                    if mod_stats.local_peak.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                        mod_stats.local_peak[dev] = dev_snap[_TOTAL_KEY]
                        mod_stats.snapshots[peak_state][-1][dev] = deepcopy(dev_snap)
        for dev, dev_snap in curr_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = deepcopy(dev_snap)
