"""Achieved fractions of peak per GPU (data/efficiency.yaml): the step-time model's rates.

Architecture defaults with per-GPU overrides; ``planner calibrate`` scales the gemm and attention
fractions per GPU from measured probes (planner/catalog/calibration.py ``apply``).
"""

from functools import cache

from pydantic import ConfigDict

from planner.catalog import DATA_DIR
from planner.catalog.files import read_mapping
from planner.core.record import Record
from planner.core.specs import Efficiency

#: Used for a user GPU file whose architecture is not listed: conservative Ampere-like rates.
FALLBACK_ARCHITECTURE = "ampere"


class _Override(Record):
    model_config = ConfigDict(extra="forbid")
    gemm: dict[str, float] | None = None
    attention: float | None = None
    memory_bandwidth: float | None = None
    saturation_tokens: float | None = None
    source: str


class _File(Record):
    model_config = ConfigDict(extra="forbid")
    architectures: dict[str, Efficiency]
    gpus: dict[str, _Override] = {}


@cache
def _table() -> _File:
    return _File.model_validate(read_mapping(DATA_DIR / "efficiency.yaml", "efficiency table"))


def efficiency(gpu_id: str, architecture: str) -> Efficiency:
    table = _table()
    base = table.architectures.get(architecture) or table.architectures[FALLBACK_ARCHITECTURE]
    override = table.gpus.get(gpu_id)
    if override is None:
        return base
    fields = {k: v for k, v in override.model_dump().items() if v is not None}
    fields["source"] = f"{override.source} (otherwise: {base.source})"
    return base.model_copy(update=fields)
