#!/usr/bin/env bash
# The full test suite: every test CI runs, the tests marked `full` (tests/helpers.py FULL: each
# the slower twin of a CI test covering the same capability: every launch of
# tests/test_launch_live.py, the pairwise traced matrix, the real allocator at Qwen's own
# vocabulary, every combination of the parametrized matrices) and the property tests' full example
# counts. 41:33 on two cores (1,518 passed, 4 skipped; 2026-11-29, a day ~1.6x slower than
# usual); run it before a release or after a change to the probes, the launch or the activation rows.
#
#     bash benchmarks/full_suite.sh [pytest arguments]
# in an environment set up as .ci/run sets it up (the project's .venv by default; PY= names another).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PLANNER_FULL_SUITE=1 PLANNER_HYPOTHESIS=thorough HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$PY" -m pytest -q -n 2 --durations=30 "$@" tests
