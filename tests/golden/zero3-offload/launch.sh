#!/usr/bin/env bash
# Launch meta-llama/Llama-3.1-70B on 8xH100-SXM-80: adamw, bf16-mixed, checkpointing full, sharding zero3, offload optimizer, loss standard, attention sdpa, adapter none,
# micro-batch 1 x accumulation 1 x 8 GPU(s), seq 2048. Written by planner 0.1.0; see PLAN.md.
#
#   MODEL=path/to/model DATA=path/to/train.jsonl ./launch.sh [--max-steps N ...]
#     (python -m planner.launch --help lists the options; DATA=sample: a smoke test)
#   TRAIN_SCRIPT=your_script.py ./launch.sh [its arguments]
#     (your script reads training_args.json; runtime.json is what it must apply itself)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -n "${TRAIN_SCRIPT:-}" ]]; then
  ENTRY=("$TRAIN_SCRIPT")
else
  ENTRY=(-m planner.launch --job-dir "$HERE"
         --model "${MODEL:?set MODEL to your model folder (or a Hugging Face id in the local cache)}"
         --data "${DATA:?set DATA to your training data (JSONL with a text field), or sample for a smoke test}")
fi
MAIN_PORT="${MAIN_PORT:-29500}"
export PLANNER_JOB_DIR="$HERE" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
exec accelerate launch --config_file "$HERE/accelerate_config.yaml" \
  --main_process_port "$MAIN_PORT" \
  --deepspeed_config_file "$HERE/deepspeed_config.json" \
  "${ENTRY[@]}" "$@"
