"""The step tracker: torch's MemTracker with the planner's phases, and in-place gradient accumulation.

``StepTracker`` (and ``FsdpStepTracker``, over torch's FSDPMemTracker) add to torch's tracker:

- phase peaks, in the ledger's phases (planner/core/ledger.py): ``forward`` runs until backward
  reaches the last decoder layer (its backward, or its recomputation under checkpointing; the loss
  and the head's backward belong to forward), ``backward``
  from there, ``backward_end`` from the embeddings' backward (``embedding_dense_backward``, after
  every decoder layer's), ``step`` is the optimizer; the tracker keeps each phase's peak total and
  categories;
- in-place gradient accumulation. When two gradients meet in one autograd input buffer (a residual
  stream, tied embeddings) the engine adds them in place if it holds the only reference
  (``can_accumulate_inplace`` in torch/csrc/autograd/input_buffer.cpp) but never for tensor
  subclasses, and FakeTensor is one. A fake trace would therefore count one extra gradient-sized
  tensor at every such add. The tracker counts such an add as in place: an ``aten.add.Tensor`` of
  two same-shape, same-dtype, dense tensors made during backward with grad mode off (outside
  activation recomputation, which runs with grad mode on). tests/test_traced.py checks this
  against a real-tensor run of the same model, which takes the in-place path;
- an explanation of the peak: the live tensors with the op and module that made them;
- the per-op module peaks over the active modules only (probes/active_peaks.py: torch walks every
  module it has seen after every op, O(depth²) per trace; the figures are the same).
"""

import re
from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from planner.probes.active_peaks import ActivePeaks

_ADD = torch.ops.aten.add.Tensor
_EMBEDDING_BACKWARD = torch.ops.aten.embedding_dense_backward.default  # the embeddings' backward: made last
_LAYER = re.compile(r"\.(layers|h)\.\d+")  # a decoder layer's module path (model.layers.N, transformer.h.N)


if TYPE_CHECKING:

    class _Tracker(MemTracker):
        """What type checkers see the mixin over: the tracker it mixes into."""

else:
    _Tracker = object


class _StepTracking(_Tracker):
    """Mixin over MemTracker or FSDPMemTracker (both call ``_update_peak_stats`` after every op)."""

    def _init_step_tracking(self, explain: bool) -> None:
        self.phase = "forward"
        self._await_layer = False
        self.measuring = True
        self.phase_peaks: dict[str, int] = {}
        self.phase_snapshots: dict[str, dict[str, int]] = {}
        self.explain = explain
        self.peak_live: list[tuple] = []
        self._origin: dict[int, tuple] = {}
        self._op_name = "-"
        self._discount = 0
        self.inplace_adds = 0

    def start_backward(self) -> None:
        """Backward begins: the phase stays ``forward`` (the ledger's "end of forward / start of
        backward": the loss and head backward) until backward reaches a decoder layer."""
        self._await_layer = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # backward reaches the top layer: its backward, or (checkpointing) its recomputation, which runs
        # the layer's forward from inside backward
        if self._await_layer and any(_LAYER.search(p) for p in self._mod_tracker.parents):
            self._await_layer, self.phase = False, "backward"
        elif func is _EMBEDDING_BACKWARD and self.phase == "backward":
            self.phase = "backward_end"
        # Only plain facts about the call are kept: holding its tensors would change what is alive.
        self._op_name = str(func)
        self._discount = self._inplace_discount(func, args, kwargs)
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._discount = 0

    def _inplace_discount(self, func, args, kwargs) -> int:
        """Bytes an in-place accumulation would not allocate, if this op is an autograd-buffer add."""
        if func is not _ADD or kwargs or len(args) != 2 or torch.is_grad_enabled() or not self._mod_tracker.is_bw:
            return 0
        a, b = args
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return 0
        if a.shape != b.shape or a.dtype != b.dtype or a._base is not None or b._base is not None:
            return 0
        if not (a.is_contiguous() and b.is_contiguous()):
            return 0
        return a.untyped_storage().nbytes()

    def _update_peak_stats(self, peak_state) -> None:
        discount = self._discount
        snap = self._curr_mem_snap
        dev = next(iter(snap), None)
        if discount and dev is not None:
            self.inplace_adds += self.measuring  # those of the measured iteration
            total_key = next(k for k in snap[dev] if not isinstance(k, self._ref_class))
            temp = next(k for k in snap[dev] if isinstance(k, self._ref_class) and k.value == "Temp")
            snap[dev][total_key] -= discount
            snap[dev][temp] -= discount
            self._record(snap)
            super()._update_peak_stats(peak_state)
            snap[dev][total_key] += discount
            snap[dev][temp] += discount
            return
        self._record(snap)
        super()._update_peak_stats(peak_state)

    def _record(self, snap) -> None:
        if not self.measuring:
            return
        total = 0
        cats: Counter = Counter()
        for per_dev in snap.values():
            for key, value in per_dev.items():
                if isinstance(key, self._ref_class):
                    cats[key.value] += value
                else:
                    total += value
        if total > self.phase_peaks.get(self.phase, -1):
            self.phase_peaks[self.phase] = total
            self.phase_snapshots[self.phase] = dict(cats)
            if self.explain and total >= max(self.phase_peaks.values()):
                self._explain_now()

    def _track(self, reftype, t: torch.Tensor) -> None:
        if self.explain:
            from torch.distributed._tools.common_utils import get_untyped_storages

            fresh = [st for st in get_untyped_storages(t) if st not in self._WINFO]
            super()._track(reftype, t)
            mods = [m for m in self._mod_tracker.parents if m != "Global"]
            origin = (self._op_name, max(mods, key=len) if mods else "-", tuple(t.shape),
                      str(t.dtype).removeprefix("torch."), self.phase)
            for st in fresh:
                winfo = self._WINFO.get(st, (None, None))[0]
                if winfo is not None:
                    self._origin[id(winfo)] = origin
            return
        super()._track(reftype, t)

    def _explain_now(self) -> None:
        self.peak_live = [(w.mem_consumed, w.reftype.value) + self._origin.get(id(w), ("-", "-", (), "-", "-"))
                          for w, _ in self._WINFO.values()]

    def explanation(self, top: int = 20) -> list[str]:
        """The largest groups of tensors alive at the step's peak (bytes, category, op, module, shape, dtype, phase)."""
        groups: Counter = Counter()
        for nbytes, *key in self.peak_live:
            groups[tuple(key)] += nbytes
        return [f"{n:>15,}  {' | '.join(map(str, k))}" for k, n in groups.most_common(top)]


class StepTracker(_StepTracking, ActivePeaks, MemTracker):
    def __init__(self, explain: bool = False) -> None:
        super().__init__()
        self._init_active_peaks()
        self._init_step_tracking(explain)


def fsdp_step_tracker(model, optimizer, explain: bool = False):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class FsdpStepTracker(_StepTracking, ActivePeaks, FSDPMemTracker):
        pass

    tracker = FsdpStepTracker(model, optimizer)
    tracker._init_active_peaks()
    tracker._init_step_tracking(explain)
    return tracker
