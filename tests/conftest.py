import os

# Never the hub: every test runs offline (the planner itself never calls it either).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("DS_BUILD_OPS", "0")
# Never a developer's own calibration store: tests that need one point PLANNER_CALIBRATION at a tmp file.
os.environ["PLANNER_CALIBRATION"] = "off"

import pytest  # noqa: E402

from planner.catalog.gpus import parse_gpus  # noqa: E402
from planner.catalog.models import resolve_model  # noqa: E402
from planner.engine.estimate import estimate_config  # noqa: E402
from strategies import TrainingConfig  # noqa: E402


def run(model: str, gpus: str, host_memory_gb: float | None = None, margin: float = 0.0,
        inter_node_gbps: float | None = None, **config):
    """Estimate one configuration from strings, the way the CLI resolves them."""
    hardware = parse_gpus(gpus, host_memory_gb, inter_node_gbps)
    return estimate_config(resolve_model(model), hardware, TrainingConfig(**config), margin)


@pytest.fixture
def estimate_of():
    return run
