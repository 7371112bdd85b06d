"""Session setup for every test: offline, no calibration store of the developer's, one PATH, no C++
build, the hypothesis profile (helpers.py holds what tests import)."""

import importlib.util
import os
import sys
from pathlib import Path

# Never the hub: every test runs offline (the planner itself never calls it either).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("DS_BUILD_OPS", "0")
# Never a developer's own calibration store: tests that need one point PLANNER_CALIBRATION at a tmp file.
os.environ["PLANNER_CALIBRATION"] = "off"

# One PATH for every test and every process a test starts (accelerate launch, DeepSpeed, the probes'
# children): the environment's own tools first. A torch C++ extension built with one ninja is
# rebuilt when another ninja finds it, so two PATHs cost a build each time they alternate.
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

# No C++ build in any test: every Python process a test starts loads tests/tools/no_cpp_build's
# sitecustomize (it keeps DeepSpeed from JIT-compiling its CPU shared-memory op), and so does this one.
NO_CPP_BUILD = Path(__file__).parent / "tools" / "no_cpp_build"
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(NO_CPP_BUILD), os.environ.get("PYTHONPATH")) if p)
_hook = importlib.util.spec_from_file_location("planner_tests_no_cpp_build", NO_CPP_BUILD / "sitecustomize.py")
_hook.loader.exec_module(importlib.util.module_from_spec(_hook))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from helpers import FULL_SUITE, HYPOTHESIS_PROFILE, TINY_TRL  # noqa: E402

settings.register_profile("ci", deadline=None, suppress_health_check=list(HealthCheck))
settings.register_profile("thorough", deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_collection_modifyitems(config, items):
    """Outside the full suite, the tests marked ``full`` are deselected (helpers.FULL). The tests
    marked ``heavy`` (tens of seconds each) run first, so that two workers end together rather than
    one waiting while the other runs a long test collected last (the order of the rest is kept)."""
    full = [] if FULL_SUITE else [item for item in items if item.get_closest_marker("full") is not None]
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if item.get_closest_marker("full") is None]
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


def pytest_report_header(config):
    return ("suite: full (PLANNER_FULL_SUITE=1)" if FULL_SUITE
            else "suite: CI's covering subset; benchmarks/full_suite.sh runs the tests marked full too")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """The fp32 model folder of ``TINY_TRL`` (helpers.py), which TRL's trainers load in the CPU tests."""
    from planner.launch.model_folder import make_model_folder

    return make_model_folder(TINY_TRL, tmp_path_factory.mktemp("tiny"), dtype="float32")
