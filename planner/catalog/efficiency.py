"""Achieved fractions of peak per GPU (data/efficiency.yaml): the step-time model's rates.

Architecture defaults with per-GPU overrides, times the table's ``stack`` factor (what the stack
planner launches reaches of the stacks the fractions were fitted on); ``planner calibrate`` scales
the gemm and attention fractions per GPU from measured probes (planner/catalog/calibration.py
``apply``).
"""

from functools import cache

from pydantic import ConfigDict, Field

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


class _Stack(Record):
    model_config = ConfigDict(extra="forbid")
    flops_scale: float = Field(gt=0, le=1)
    source: str


class _File(Record):
    model_config = ConfigDict(extra="forbid")
    stack: _Stack
    architectures: dict[str, Efficiency]
    gpus: dict[str, _Override] = {}


@cache
def _table() -> _File:
    return _File.model_validate(read_mapping(DATA_DIR / "efficiency.yaml", "efficiency table"))


def stack_flops_scale() -> float:
    """What the stack planner launches reaches of the compute rates the table's fractions were
    fitted on (data/efficiency.yaml ``stack``; its source says where it was measured)."""
    return _table().stack.flops_scale


def efficiency(gpu_id: str, architecture: str) -> Efficiency:
    """The GPU's achieved fractions: its architecture's, its own overrides, then the stack factor on
    the compute fractions (gemm per dtype, attention)."""
    table = _table()
    base = table.architectures.get(architecture) or table.architectures[FALLBACK_ARCHITECTURE]
    override = table.gpus.get(gpu_id)
    if override is not None:
        fields = {k: v for k, v in override.model_dump().items() if v is not None}
        fields["source"] = f"{override.source} (otherwise: {base.source})"
        base = base.model_copy(update=fields)
    scale = stack_flops_scale()
    return base.model_copy(update={"gemm": {k: v * scale for k, v in base.gemm.items()},
                                   "attention": base.attention * scale,
                                   "source": f"{base.source} Times {scale} for the stack planner launches: "
                                             f"{table.stack.source}"})
