#!/usr/bin/env bash
# Launch meta-llama/Llama-3.1-8B on 8xH100-SXM-80: adamw, fp8-mixed, checkpointing full, sharding fsdp, offload none, loss standard, attention sdpa,
# micro-batch 1 x accumulation 1 x 8 GPU(s), seq 2048. Written by planner 0.1.0; see PLAN.md.
#
#   TRAIN_SCRIPT=path/to/train.py ./launch.sh [arguments for the script]
#   (examples/train_causal_lm.py takes --plan plan.json; a Trainer script can read training_args.json)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT="${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}"
MAIN_PORT="${MAIN_PORT:-29500}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
exec accelerate launch --config_file "$HERE/accelerate_config.yaml" \
  --main_process_port "$MAIN_PORT" \
  "$TRAIN_SCRIPT" "$@"
