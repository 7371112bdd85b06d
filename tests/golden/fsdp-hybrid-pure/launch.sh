#!/usr/bin/env bash
# Launch google/gemma-2-9b on 2x8xH100-SXM-80: adamw, bf16-pure, checkpointing none, sharding fsdp-hybrid, offload none, loss standard, attention eager, adapter none,
# micro-batch 1 x accumulation 1 x 16 GPU(s), seq 2048. Written by planner 0.1.0; see PLAN.md.
#
#   MODEL=path/to/model DATA=path/to/train.jsonl ./launch.sh [--max-steps N ...]
#     (python -m planner.launch --help lists the options; DATA=sample: a smoke test)
#   TRAIN_SCRIPT=your_script.py ./launch.sh [its arguments]
#     (your script reads training_args.json; runtime.json is what it must apply itself)
#   Run it on each of the 2 machines with MACHINE_RANK=0..1 and MAIN_ADDR set to
#   the address of machine 0 (MAIN_PORT defaults to 29500).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -n "${TRAIN_SCRIPT:-}" ]]; then
  ENTRY=("$TRAIN_SCRIPT")
else
  ENTRY=(-m planner.launch --job-dir "$HERE"
         --model "${MODEL:?set MODEL to your model folder (or a Hugging Face id in the local cache)}"
         --data "${DATA:?set DATA to your training data (JSONL with a text field), or sample for a smoke test}")
fi
MACHINE_RANK="${MACHINE_RANK:?set MACHINE_RANK to the rank of this machine}"
MAIN_ADDR="${MAIN_ADDR:?set MAIN_ADDR to the address of machine rank 0}"
MAIN_PORT="${MAIN_PORT:-29500}"
export PLANNER_JOB_DIR="$HERE" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
exec accelerate launch --config_file "$HERE/accelerate_config.yaml" \
  --machine_rank "$MACHINE_RANK" --main_process_ip "$MAIN_ADDR" --main_process_port "$MAIN_PORT" \
  "${ENTRY[@]}" "$@"
