"""What every command plans for: a model on some GPUs, with the memory to keep free."""

from pathlib import Path

from pydantic import ConfigDict, Field

from planner.catalog.gpus import parse_gpus
from planner.core.lengths import Batching
from planner.core.record import Record
from planner.core.specs import HardwareSpec
from planner.core.vocabulary import MAX_SEQ_LEN, PADDED_METHODS
from planner.cost import overheads


class Target(Record):
    """What every command plans for: a model on some GPUs, and how much memory to keep free
    (``model`` None: a job's recipe names it, planner check)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    gpus: str
    host_memory_gb: float | None = None  # per node, decimal GB
    inter_node_gbps: float | None = None  # per node, Gbit/s
    page_migration_gb_s: float | None = None  # paged state, GB/s (None: measured beside the GPU, else assumed)
    cpu_optimizer_gparams_s: float | None = None  # CPU optimizer, 1e9 params/s/node (None: measured, else assumed)
    margin: float = Field(overheads.DEFAULT_MARGIN, ge=0.0, lt=1.0)  # fraction of GPU memory to keep free
    calibration: Path | None = None  # the calibration store whose corrections apply (None: assumptions only)

    def hardware(self, gpus: str | None = None) -> HardwareSpec:
        """The target's GPUs (or ``gpus``, another --gpus spec) with its host, network and calibration."""
        return parse_gpus(gpus or self.gpus, self.host_memory_gb, self.inter_node_gbps, self.calibration,
                          page_migration_gb_s=self.page_migration_gb_s, cpu_optimizer_gparams_s=self.cpu_optimizer_gparams_s)


class PlanTarget(Target):
    """A target whose model is named."""

    model: str


class DataShape(Record):
    """How the run batches its samples, and their token counts (planner/core/lengths.py).
    ``batching`` None: packed, or padded where ``lengths`` are given (samples of their own
    lengths are what padding batches)."""

    batching: Batching | None = None
    lengths: Path | None = None  # the samples' token counts (planner/engine/lengths_file.py)
    #: a plan's own micro-batch shape, as its plan.json holds it (no flag sets them: derived from
    #: ``lengths``; given, they stand for the lengths that made them)
    kernel_seq_len: float | None = Field(None, gt=0, le=MAX_SEQ_LEN)
    attention_seq_len: float | None = Field(None, gt=0, le=MAX_SEQ_LEN)
    real_seq_len: float | None = Field(None, gt=0, le=MAX_SEQ_LEN)

    @property
    def batching_used(self) -> Batching:
        """The batching asked for; else padded where lengths are given or the method pads
        (``PADDED_METHODS``: a request's method, or every method it names), else packed."""
        if self.batching is not None:
            return self.batching
        method = getattr(self, "method", None)
        named = [str(m) for m in (method if isinstance(method, list) else [method]) if m is not None]
        if named and all(m in PADDED_METHODS for m in named):
            return Batching.PADDED
        return Batching.PACKED if self.lengths is None else Batching.PADDED
