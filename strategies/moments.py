"""Names shared by the strategies that write rows of one moment (planner.core.ledger.resident), and the
tags that say what a row holds beyond its term."""

#: Alternative instants of the forward phase: the loss (strategies/loss.py, with the final norm's
#: saved tensors) or, under FSDP2 (strategies/fsdp_memory.py), moments of the layers' all-gathers
#: and the root unit gathered again when backward starts.
LOSS_MOMENT = "the loss"
FIRST_LAYER_GATHER = "the first layer's all-gather"
LAST_LAYER_GATHER, LAST_LAYER_FORWARD = "the last layer's all-gather", "the last layer's forward"
ROOT_REGATHER = "the root unit's all-gather for backward"

#: Tags of an adapter's frozen base rows (strategies/adapter.py), which the optimizer step never
#: touches (strategies/optimizer.py): sharded like any parameter, or held whole on every rank
#: (QLoRA's quantization state under FSDP2: module attributes, not parameters).
FROZEN_BASE = "frozen_base"
FROZEN_EVERY_RANK = "frozen_every_rank"
FROZEN = (FROZEN_BASE, FROZEN_EVERY_RANK)
