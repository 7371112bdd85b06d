"""``planner calibrate``'s request and result."""

from pathlib import Path

from pydantic import ConfigDict

from planner.catalog.calibration import Corrections
from planner.core.record import Record


class CalibrateRequest(Record):
    """What ``planner calibrate`` is asked: which store, which device GPU, whether to save."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: Path | None  # the store (None: no store: an error that says so)
    gpu: str | None = None  # only measurements taken on this GPU (catalog id or alias)
    dry_run: bool = False
    default_store: Path | None = None  # the store estimate / suggest / check use by default (for the result's in_use)


class CalibrateResult(Record):
    """What ``planner calibrate --json`` prints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str
    measurements: int  # rows read (of --gpu only, when given)
    ok_measurements: int  # of them, with status ok on a GPU: what the fit uses
    corrections: list[Corrections]
    saved: bool
    in_use: bool  # the store is the one planner estimate / suggest / check read by default

    @property
    def fitted(self) -> bool:
        return bool(self.corrections)
