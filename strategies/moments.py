"""Names shared by the strategies that write rows of one moment (planner.core.ledger.resident) or adjust
rows another strategy wrote (tags)."""

#: Alternative instants of the forward phase: the loss (strategies/loss.py, with the final norm's
#: saved tensors) or, under FSDP2 (strategies/fsdp_memory.py), moments of the layers' all-gathers
#: and the root unit gathered again when backward starts.
LOSS_MOMENT = "the loss"
FIRST_LAYER_GATHER = "the first layer's all-gather"
LAST_LAYER_GATHER, LAST_LAYER_FORWARD = "the last layer's all-gather", "the last layer's forward"
ROOT_REGATHER = "the root unit's all-gather for backward"

#: Tags of backward rows that strategies/checkpointing.py removes when the top layer's moment is
#: the larger: the gradients made before the first layer's backward (strategies/precision.py) and
#: the reduce-scatter input of the layer above (strategies/fsdp_memory.py).
GRADIENTS_BEFORE_FIRST_LAYER = "gradients_before_first_layer"
AFTER_TOP_LAYER = "after_top_layer"

#: Tags of an adapter's frozen base rows (strategies/adapter.py), which the optimizer step never
#: touches (strategies/optimizer.py): sharded like any parameter, or held whole on every rank
#: (QLoRA's quantization state under FSDP2: module attributes, not parameters), which
#: strategies/sharding.py leaves undivided.
FROZEN_BASE = "frozen_base"
FROZEN_EVERY_RANK = "frozen_every_rank"
FROZEN = (FROZEN_BASE, FROZEN_EVERY_RANK)
