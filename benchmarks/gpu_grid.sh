#!/usr/bin/env bash
# On a lent GPU machine (the device tool runs it in the repository root, with gpu-bundle/ carried):
#   bash benchmarks/gpu_grid.sh PART   e.g. 1/3, then 2/3, 3/3 (each device command <= 10 minutes)
# Installs the bundle offline, runs that part of benchmarks/measured_grid.py, and leaves the CSV
# and the calibration store under $OUT; copy them into benchmarks/results/ and commit after each part
# (the next part resumes from them: a configuration already in the CSV is skipped).
set -euo pipefail
PART=${1:-1/1}
OUT=${OUT:-benchmarks/results}
python -m pip install -q --no-index --find-links gpu-bundle pydantic typer rich pyyaml optuna bitsandbytes torchao \
  deepspeed adam-mini nvidia-ml-py 2>&1 | tail -3
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_BUILD_OPS=0
GPU=$(python -c "from probes.device import local_device, catalog_gpu; d = local_device(); print(catalog_gpu(d.name, d.total_bytes))")
export PLANNER_CALIBRATION=$OUT/calibration-$GPU.sqlite
mkdir -p "$OUT"
for f in "$GPU.csv" "calibration-$GPU.sqlite"; do   # earlier parts, committed: resume from them
  if [ -f "benchmarks/results/$f" ] && [ ! -f "$OUT/$f" ]; then cp "benchmarks/results/$f" "$OUT/"; fi
done
python benchmarks/measured_grid.py --csv "$OUT/$GPU.csv" --part "$PART"
python -c "from planner.cli import main; main()" calibrate --dry-run || true
