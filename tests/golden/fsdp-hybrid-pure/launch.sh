#!/usr/bin/env bash
# Launch google/gemma-2-9b on 2x8xH100-SXM-80: adamw, bf16-pure, checkpointing none, sharding fsdp-hybrid, offload none, loss standard, attention eager,
# micro-batch 1 x accumulation 1 x 16 GPU(s), seq 2048. Written by planner 0.1.0; see PLAN.md.
#
#   TRAIN_SCRIPT=path/to/train.py ./launch.sh [arguments for the script]
#   (examples/train_causal_lm.py takes --plan plan.json; a Trainer script can read training_args.json)
#   Run it on each of the 2 machines with MACHINE_RANK=0..1 and MAIN_ADDR set to
#   the address of machine 0 (MAIN_PORT defaults to 29500).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TRAIN_SCRIPT="${TRAIN_SCRIPT:?set TRAIN_SCRIPT to your training script}"
MACHINE_RANK="${MACHINE_RANK:?set MACHINE_RANK to the rank of this machine}"
MAIN_ADDR="${MAIN_ADDR:?set MAIN_ADDR to the address of machine rank 0}"
MAIN_PORT="${MAIN_PORT:-29500}"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
exec accelerate launch --config_file "$HERE/accelerate_config.yaml" \
  --machine_rank "$MACHINE_RANK" --main_process_ip "$MAIN_ADDR" --main_process_port "$MAIN_PORT" \
  "$TRAIN_SCRIPT" "$@"
