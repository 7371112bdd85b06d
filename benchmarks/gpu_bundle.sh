#!/usr/bin/env bash
# Wheels a lent GPU machine needs to run the measured probes and benchmarks/measured_grid.py
# (it has Python 3.12 with torch, accelerate and transformers, and no package registry).
#   bash benchmarks/gpu_bundle.sh [OUTDIR=gpu-bundle]   (run on this machine; needs `wheel` in $PY)
# Then carry OUTDIR to the device (it is git-ignored) and run benchmarks/gpu_grid.sh there.
set -euo pipefail
OUT=${1:-gpu-bundle}
PY=${PY:-.venv/bin/python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=$PY bash "$HERE/../shared/tools/make-gpu-bundle.sh" "$OUT" --slim-bnb
# the planner's own dependencies the shared bundle does not hold, and the measured extra's
# (exact pins: see make-gpu-bundle.sh on why)
$PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$OUT" \
  typer==0.20.0 click==8.3.1 shellingham==1.5.4 rich==14.2.0 markdown-it-py==4.0.0 mdurl==0.1.2 pygments==2.19.2 \
  pyyaml==6.0.3 adam-mini==1.1.1 nvidia-ml-py==13.580.82
du -sh "$OUT"
