#!/usr/bin/env bash
# One `planner tune` worker per GPU of this machine, all on one study: each worker sees one GPU
# (CUDA_VISIBLE_DEVICES) and measures one rank of the target plan there; a plan probed once is
# never probed again, and the study stops at --trials probes in all. A worker that dies mid-probe
# leaves a trial whose heartbeat stops: another worker (or the next run of this script) retries it.
#
#   MODEL=meta-llama/Llama-3.1-8B TARGET=8xH100-80 bash examples/tune_one_node.sh
#
# STORAGE: a SQLite file serves the workers of one machine (the default here); across machines
# use a PostgreSQL server every worker reaches (examples/tune_workers.sbatch;
# pip install 'llm-train-planner[tune-postgres]' for its driver).
set -euo pipefail
: "${MODEL:?set MODEL}" "${TARGET:?set TARGET}"
STORAGE="${STORAGE:-sqlite:///$PWD/planner-tune.db}"
STUDY="${STUDY:-tune-$(basename "$MODEL")-$TARGET}"
GPUS="${GPUS:-$(nvidia-smi --list-gpus | wc -l)}"
for gpu in $(seq 0 $((GPUS - 1))); do
  CUDA_VISIBLE_DEVICES=$gpu planner tune --model "$MODEL" --gpus "$TARGET" --fidelity "${FIDELITY:-measured}" \
    --trials "${TRIALS:-24}" --storage "$STORAGE" --study-name "$STUDY" --heartbeat-seconds 60 --json \
    > "tune-gpu$gpu.json" &
done
wait
planner tune --model "$MODEL" --gpus "$TARGET" --fidelity "${FIDELITY:-measured}" --storage "$STORAGE" --study-name "$STUDY" \
  --trials 0 --out best/   # the best plan's files, no new probe
