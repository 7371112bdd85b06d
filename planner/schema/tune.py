"""``planner tune``'s request and result, and what one probe of one plan reports."""

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from planner.core.record import Record
from planner.schema.estimate import EstimateResult
from planner.schema.suggest import SuggestRequest


class ProbeOutcome(Record):
    """What one probe of one plan found (the fidelities: probes/tune_probes.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fidelity: str  # analytic | traced | measured: what produced the values
    status: str  # ok | oom | error | timeout | refused
    peak_bytes: int | None = None  # per GPU, comparable with the analytic peak
    step_seconds: float | None = None  # the step tokens/s is computed from (measured: + modelled communication)
    message: str = ""


Probe = Callable[[EstimateResult], ProbeOutcome]


class TuneRequest(SuggestRequest):
    fidelity: Literal["auto", "analytic", "traced", "measured"] = "auto"  # auto: measured with a GPU, else traced
    band: float = Field(0.15, ge=0, le=10)  # the model's relative error on throughput (early stop)
    probes: int = Field(20, ge=0, le=100_000)  # probe budget over the whole study (--trials; 0: report the study)
    timeout: float | None = Field(None, gt=0)  # seconds for this invocation
    probe_timeout: float = Field(900.0, gt=0)
    storage: str | None = None  # an Optuna RDB storage (database) URL; default: a SQLite file next to the output
    study_name: str | None = None
    out: Path | None = None
    enqueue: int = Field(5, ge=0, le=1000)  # analytic top candidates probed first
    heartbeat_seconds: int = Field(30, ge=1)  # a dead worker's trial is retried after 2x this


class TrialRow(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int
    state: str
    config: dict
    fidelity: str
    status: str
    probed: bool
    predicted_peak_bytes: int | None
    predicted_tokens_per_second: float | None
    peak_bytes: int | None
    tokens_per_second: float | None
    message: str
    feasible: bool  # every constraint met (memory within the GPU)


class TuneResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    study_name: str
    storage: str
    fidelity: str
    probes: int  # probes spent over the whole study
    stopped: str  # why it stopped
    best: TrialRow | None
    best_plan: EstimateResult | None
    trials: list[TrialRow]
    notes: list[str]

    @property
    def fits(self) -> bool:
        return self.best is not None
