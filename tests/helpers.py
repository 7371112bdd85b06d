"""What tests share: estimating a configuration from strings, and hypothesis example counts."""

import os

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.engine.estimate import estimate_config
from strategies import TrainingConfig

#: Hypothesis: the ``ci`` profile (default) runs each property test with an eighth of its examples
#: (at least 50); PLANNER_HYPOTHESIS=thorough runs them all. A test states its thorough count
#: through ``examples(n)``.
HYPOTHESIS_PROFILE = os.environ.get("PLANNER_HYPOTHESIS", "ci")


def examples(thorough: int, ci: int | None = None) -> int:
    """Examples for a property test: ``thorough`` under the thorough profile; in CI ``ci``, else an
    eighth of it (at least 50)."""
    if HYPOTHESIS_PROFILE == "thorough":
        return thorough
    return ci if ci is not None else min(thorough, max(50, thorough // 8))


def run(model: str, gpus: str, host_memory_gb: float | None = None, margin: float = 0.0,
        inter_node_gbps: float | None = None, **config):
    """Estimate one configuration from strings, the way the CLI resolves them."""
    hardware = parse_gpus(gpus, host_memory_gb, inter_node_gbps)
    return estimate_config(resolve_model(model), hardware, TrainingConfig(**config), margin)
