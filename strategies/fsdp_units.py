"""FSDP2's units outside the decoder layers, and when each holds its parameters unsharded: the one
rule strategies/fsdp_memory.py, strategies/loss.py and strategies/precision.py read.

Two layouts (every decoder layer is a unit of its own in both):
- **accelerate's** (the plans planner emits; planner/runtime/sharding.py ``apply_fsdp``): one root
  unit holds the embeddings, the final norm and the head, resharded after forward: unsharded
  through the forward, gathered again when backward starts, reduce-scattered when backward ends
  (the head's gradient waits for it).
- **transformers'** (a tensor-parallel plan, loaded with ``DistributedConfig``: transformers
  ``apply_fully_sharded_data_parallelism`` over ``PreTrainedConfig.base_model_fsdp_plan`` and the
  model's ``_fsdp_plan``): the embeddings a unit resharded after forward; the final norm and the
  head one unit kept unsharded (``keep_full_weight``: reshard_after_forward=False) from their
  forward through their backward, whose end reduce-scatters the head's gradient before the layers'
  backward; tied, the embeddings take the head's place in that kept unit
  (``_resolve_tied_embed_lm_head_plan``), so it is unsharded from the embeddings' forward to their
  backward; the root unit holds no parameter.
Elements are per rank (the model a rank holds: a tensor-parallel rank's shares). Checked against
FSDP2 traced under a fake process group, accelerate's layout in tests/test_traced.py and
transformers' in tests/test_tensor_parallel.py.
"""

from dataclasses import dataclass
from functools import cache

from planner.cost import params
from planner.cost.params import Part
from planner.strategies.base import PlanContext
from planner.strategies.fsdp_schedule import Instant, gathered_layers


@dataclass(frozen=True)
class OuterUnits:
    """Elements outside the decoder layers unsharded at each point of a step (gathered dtype)."""

    forward_held: int  # through the whole forward
    first_gather_output: int  # the all-gather output still held at the first layer's all-gather
    loss_held: int  # beside ``forward_held`` at the loss's moments and backward's start
    regather_output: int  # the all-gather output of backward's start (the root gathered again)
    loss_forward_output: int | None  # the all-gather output held at the loss's forward (None: the last layer's)
    loss_backward_prefetch: bool  # the top layer gathered ahead at the loss's backward moments
    backward_held: int  # through the layers' backward
    head_gradient_waits: bool  # the head's unsharded gradient is held until the end of backward
    early_gradients: int  # the head unit's sharded gradients, made before the top layer's backward
    first_layer_prefetch: int  # the all-gather output prefetched at the first layer's backward
    last_unit: int  # the unit whose backward ends the step's backward (the embeddings')
    last_kept: bool  # that unit stays unsharded through its reduce-scatter (reshard_after_forward=False)
    words: str  # what the forward's held unit is


@cache
def _split(m) -> tuple[int, int]:
    """(the embeddings' unit, the kept unit) of transformers' layout: untied, the token table and
    (final norm, head); tied, nothing and (token table, final norm)."""
    root = params.root_parameters(m)
    if m.tie_word_embeddings:
        return 0, root
    kept = sum(t.numel for t in params.model_tensors(m) if t.part in (Part.FINAL_NORM, Part.HEAD))
    return root - kept, kept


def outer_units(ctx: PlanContext) -> OuterUnits:
    """The layout of ``ctx``'s plan: transformers' under tensor parallelism, else accelerate's;
    decided once per plan (five writers read it)."""
    return ctx.once(_outer_units)


def _outer_units(ctx: PlanContext) -> OuterUnits:
    m = ctx.model
    root = params.root_parameters(m)
    if ctx.tensor_shards == 1:
        return OuterUnits(forward_held=root, first_gather_output=root, loss_held=0, regather_output=root,
                          loss_forward_output=None, loss_backward_prefetch=True, backward_held=root,
                          head_gradient_waits=True, early_gradients=0, first_layer_prefetch=0, last_unit=root,
                          last_kept=False, words="FSDP root unit (embeddings, norm, head)")
    embeddings, kept = _split(m)
    if not embeddings:
        # tied: the kept unit is unsharded from the embeddings' forward to the head's backward, then
        # gathered again ahead of the embeddings'; the head reads the tied table through its own
        # reference (the sharded DTensor, gathered by DTensor outside FSDP's units) from its forward
        # to the end of backward
        table = m.vocab_rows * m.hidden_size
        return OuterUnits(forward_held=kept, first_gather_output=kept, loss_held=table, regather_output=0,
                          loss_forward_output=None, loss_backward_prefetch=False, backward_held=table,
                          head_gradient_waits=True, early_gradients=0, first_layer_prefetch=kept, last_unit=kept,
                          last_kept=True, words="FSDP kept unit (tied embeddings, norm)")
    # untied: the kept unit's all-gather is the forward's last; the top layer is gathered at its own
    # backward's start; the kept unit's backward ends (resharded, reduce-scattered) before it
    return OuterUnits(forward_held=0, first_gather_output=embeddings, loss_held=kept, regather_output=0,
                      loss_forward_output=kept, loss_backward_prefetch=False, backward_held=0,
                      head_gradient_waits=False, early_gradients=kept if ctx.layout.root_trained else 0,
                      first_layer_prefetch=embeddings, last_unit=embeddings, last_kept=False,
                      words="FSDP units outside the layers (resharded)")


def layer_backward_extra(ctx: PlanContext, first: bool) -> int:
    """Bytes a layer's backward holds of the units outside the layers beyond ``backward_held``
    (transformers' untied layout; 0 otherwise): at the top layer's, the head unit's sharded
    gradients (its backward has ended; the gradients' dtype, over the sharding degree); at the
    first layer's (``first``), the embeddings' all-gather output, prefetched for their backward in
    place of a layer's (strategies/fsdp_schedule.py counts two layers there)."""
    units, lay = outer_units(ctx), ctx.layout
    if first:
        return (units.first_layer_prefetch - lay.layer_gathered) * lay.gathered_bytes if units.first_layer_prefetch else 0
    return -(-units.early_gradients // lay.shard_degree) * lay.grad_bytes


def loss_forward_output(ctx: PlanContext) -> int:
    """Elements of the all-gather output the loss's forward holds (gathered dtype): the last
    layer's (strategies/fsdp_schedule.py), or under transformers' untied layout the kept unit's,
    the forward's last all-gather."""
    units = outer_units(ctx)
    if units.loss_forward_output is None:
        return gathered_layers(ctx, Instant.LOSS_FORWARD) * ctx.layout.layer_gathered
    return units.loss_forward_output
