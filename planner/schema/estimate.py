"""``planner estimate``'s request and result: one configuration, its ledger, its time, its verdict."""

from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, Field, field_validator

from planner.catalog.gpus import parse_gpus
from planner.core.ledger import LedgerRow, PagedInfo, Phase, allocated_peak, reserved_peak
from planner.core.record import Record
from planner.core.specs import HardwareSpec
from planner.core.timing import StepTime
from planner.core.vocabulary import MAX_BATCH, MAX_SEQ_LEN
from planner.cost.overheads import usable_host_bytes
from planner.schema.target import DataShape, PlanTarget
from planner.strategies import TrainingConfig
from planner.strategies.request_fields import TechniqueChoices


class EstimateRequest(PlanTarget, DataShape, TechniqueChoices):
    """What a user asks ``planner estimate``: one value per technique (None: its default, which
    may depend on the GPUs: sharding none on one GPU, ddp on several) and the workload."""

    micro_batch_size: int = Field(1, ge=1, le=MAX_BATCH)
    grad_accum: int = Field(1, ge=1, le=MAX_BATCH)
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)  # default: min(2048, the model's positions)


class ModelInfo(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    family: str
    source: str
    num_parameters: int
    num_trainable_parameters: int  # what the plan trains: every parameter, or an adapter's
    num_active_parameters: int
    num_layers: int
    hidden_size: int
    vocab_size: int


class HardwareInfo(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str
    gpu_name: str
    # (bounds: a plan file is read back by emit and check, which divide by these)
    num_gpus: int = Field(ge=1)
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    gpu_memory_bytes: int = Field(gt=0)
    host_memory_bytes_per_node: int = Field(gt=0)
    inter_node_bytes_per_s: float = Field(gt=0)
    # --page-migration-gb-s, --cpu-optimizer-gparams-s (None: measured beside the GPU, else assumed)
    page_migration_bytes_per_s: float | None = Field(None, gt=0)
    cpu_optimizer_params_per_s: float | None = Field(None, gt=0)
    calibration: str | None = None  # the measured corrections in use (planner calibrate); None: assumptions
    gpu_file: str | None = None  # a user GPU file's path (GpuSpec.file); None: a catalog GPU
    gpu_definition: dict | None = None  # that file's content as planned (GpuSpec.definition)

    @property
    def spec(self) -> str:
        """The --gpus spelling of this hardware: 8xH100-SXM-80, 2x8xH100-SXM-80, 4x/path/to/gpu.yaml."""
        return (f"{self.nodes}x" if self.nodes > 1 else "") + f"{self.gpus_per_node}x{self.gpu_file or self.gpu}"

    def parse(self, gpus: str | None = None, calibration: Path | None = None) -> HardwareSpec:
        """This hardware again (a user GPU from the definition the plan holds, not from its file),
        or ``gpus`` instead of its GPUs, with its host RAM and network."""
        return parse_gpus(gpus or self.spec, self.host_memory_bytes_per_node / 1e9, self.inter_node_bytes_per_s * 8 / 1e9,
                          calibration, definition=None if gpus else self.gpu_definition,
                          page_migration_gb_s=self.page_migration_bytes_per_s / 1e9 if self.page_migration_bytes_per_s else None,
                          cpu_optimizer_gparams_s=self.cpu_optimizer_params_per_s / 1e9 if self.cpu_optimizer_params_per_s
                          else None)


class EstimateResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelInfo
    hardware: HardwareInfo
    config: TrainingConfig
    memory: dict[str, int]  # bytes per GPU at the peak phase, each term, plus "peak"
    peak_phase: Phase
    phase_peaks: dict[Phase, int]
    usable_bytes: int = Field(ge=0)  # GPU memory less the safety margin
    headroom_bytes: int  # usable - peak (negative: short by that much)
    host_memory: dict[str, int]  # bytes per node: peak, capacity, usable, and the terms
    paged: PagedInfo | None
    ledger: list[LedgerRow]
    time: StepTime
    feasible: bool
    fits: bool
    reasons: list[str]
    warnings: list[str]
    assumptions: list[str] = []  # what planner estimate assumed (planner/engine/assumptions.py)

    @field_validator("memory", "host_memory")
    @classmethod
    def _has_peak(cls, terms: dict[str, int], info) -> dict[str, int]:
        """Every plan's memory holds its "peak", and its host memory what is usable or the capacity
        it follows from (a plan file read back is checked for them)."""
        if "peak" not in terms:
            raise ValueError('holds no "peak"')
        if info.field_name == "host_memory" and not ({"usable", "capacity"} & terms.keys()):
            raise ValueError('holds neither "usable" nor "capacity"')
        return terms

    @property
    def host_usable_bytes(self) -> int:
        """Host RAM per node a plan may use (a plan file written before "usable" was recorded: its
        capacity's usable share, planner/cost/overheads.py)."""
        h = self.host_memory
        return h["usable"] if "usable" in h else usable_host_bytes(h["capacity"])

    @property
    def host_short_bytes(self) -> int:
        """Host RAM per node the plan lacks (0: it fits)."""
        return max(0, self.host_memory["peak"] - self.host_usable_bytes)

    @property
    def allocated_peak_bytes(self) -> int:
        """The peak as ``torch.cuda.max_memory_allocated`` reads it (planner/core/ledger.py)."""
        return allocated_peak(self.ledger, self.paged)

    @property
    def reserved_peak_bytes(self) -> int:
        """The peak as ``torch.cuda.max_memory_reserved`` reads it (planner/core/ledger.py); the
        verdict's peak (``memory["peak"]``) is the device's, as nvidia-smi shows it."""
        return reserved_peak(self.ledger, self.paged)

    @property
    def peak_without_paged(self) -> int | None:
        """Bytes per GPU at the peak without the paged optimizer state, when that state spills to
        host RAM (it then fills whatever GPU memory the other terms leave, so the peak is simply the
        usable memory and this is the figure that says more); None when nothing spills."""
        if self.paged is None or not self.paged.spilled_bytes:
            return None
        return self.memory["peak"] - self.paged.resident_bytes


@dataclass(frozen=True)
class Alternative:
    """A one-step change to a configuration that lowers its peak, re-estimated
    (planner/engine/alternatives.py ``memory_savers``)."""

    change: str  # "checkpointing none -> full"
    result: EstimateResult
