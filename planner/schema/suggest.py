"""``planner suggest``'s request and result: the ranked plans, what approximations would buy, and
when nothing fits, the hardware that would do."""

from pydantic import ConfigDict, Field

from planner.core.launch_contract import Launcher
from planner.core.numerics import NumericsPolicy
from planner.core.record import Record
from planner.core.vocabulary import MAX_SEQ_LEN
from planner.schema.estimate import EstimateResult
from planner.schema.target import DataShape, PlanTarget
from planner.strategies.request_fields import TechniqueLists


class SuggestRequest(PlanTarget, DataShape, TechniqueLists):
    """What a user asks ``planner suggest``. An empty list leaves that technique to the search."""

    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)  # default: min(2048, the model's positions)
    global_batch_size: int | None = Field(None, ge=1, le=MAX_SEQ_LEN)
    micro_batch_size: list[int] = []
    exact_optimizer: bool = False
    launcher: Launcher = Launcher.PLANNER  # trainer: only plans the standard files express alone
    numerics: NumericsPolicy = NumericsPolicy.LADDER  # planner/core/numerics.py
    tokens: float | None = Field(None, gt=0, le=1e16)  # tokens to train on: the winner's time (and cost)
    price_per_gpu_hour: float | None = Field(None, gt=0, le=1e6)  # currency units per GPU-hour, for the cost
    top: int = Field(5, ge=1, le=1000)
    engine: str = "auto"
    trials: int = Field(400, ge=1, le=1_000_000)
    seed: int = 0


class TradeOff(Record):
    """A faster plan that changes numerics, beside the winner."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    approximations: list[str]  # "precision fp8-mixed: fp8 matmuls", least risk first
    gain: float  # tokens/s over the winner's, minus 1
    plan: EstimateResult


class AdapterOption(Record):
    """``suggest`` without --adapter: what LoRA or QLoRA would give when full fine-tuning does not
    fit or is far slower (a different training method, so never the answer itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    adapter: str  # lora or qlora
    tokens_per_second: float
    peak_bytes: int
    gain: float | None  # tokens/s over the winner's, minus 1 (None: nothing full fits)
    summary: str  # the adapter plan's techniques, one line


class HostOption(Record):
    """``suggest`` when no exact plan fits with the host RAM asked (or assumed): the host RAM per
    node at which one does, and the plan that would win there (planner/engine/exact_host.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    host_memory_gb: int  # --host-memory-gb with which the fastest exact plan fits (per node, decimal GB)
    least_host_memory_gb: int  # the least with which any exact plan fits
    tokens_per_second: float
    peak_bytes: int  # per GPU
    host_peak_bytes: int  # per node
    summary: str  # the exact plan's techniques, one line


class TrainingTime(Record):
    """``--tokens``: how long the winner takes to train on them, and what it costs."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    tokens: float
    hours: float  # wall clock
    gpu_hours: float
    cost: float | None  # gpu_hours x --price-per-gpu-hour


class HardwareSuggestion(Record):
    """A change of hardware with which a plan fits, and the fastest plan there."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    change: str  # "more host RAM" | "more GPUs" | "larger GPU"
    gpus: str  # a --gpus spec
    plan: EstimateResult  # the fastest plan there
    host_memory_gb: float | None = None  # --host-memory-gb (per node) the fix needs; None: as asked or default


class SuggestResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    plans: list[EstimateResult]  # best first
    considered: int
    rejected: dict[str, int]
    evaluated: int
    engine: str
    global_batch_size: int
    dominated: int = 0  # candidates skipped: a simpler twin, no larger and as fast, decides them (engine/search.py)
    seq_len: int
    fits: bool
    nearest: list[EstimateResult]  # when nothing fits: the closest misses
    hardware_suggestions: list[HardwareSuggestion]
    reasons: list[str]
    numerics: NumericsPolicy = NumericsPolicy.LADDER
    exact_fits: bool = False  # an exact plan fits (planner/core/numerics.py)
    trade_offs: list[TradeOff] = []  # what approximations would buy beside the winner
    assumptions: list[str] = []  # what the answer assumed, and from where (planner/engine/assumptions.py)
    training: TrainingTime | None = None  # --tokens
    needs_bytes: int | None = None  # nothing fits: the least GPU memory a candidate needs here (planner/engine/nothing_fits.py)
    adapter_option: AdapterOption | None = None  # full fine-tuning only was searched: what an adapter would give
    exact_host: HostOption | None = None  # no exact plan fits: the host RAM at which one would
