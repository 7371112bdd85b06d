"""FSDP2's gather schedule: the instants of a step at which the sharded engine holds decoder layers
unsharded, and how many. The one rule every module writing FSDP rows reads (strategies/fsdp_memory.py
the gathers themselves, strategies/checkpointing.py the layers' backward, strategies/loss.py the loss).

Behaviour modelled (torch ``fully_shard`` as planner emits it: every decoder layer and then the root
wrapped; reshard_after_forward=True for every unit, except fsdp-grad-op):
- a unit's all-gather output is held (``all_gather_state``) until the next unit's all-gather has been
  copied out, so a layer's gather briefly holds the previous output, its own output and its unsharded
  parameters;
- resharding, a layer is unsharded from its pre-forward to its post-forward and again in backward,
  where the layer below is prefetched; fsdp-grad-op keeps every layer unsharded from its forward to
  its backward (that whole-model row is fsdp_memory's, beside the forward instants' counts here);
- the last all-gather output is freed when the root's forward returns (``_post_forward``), so the loss's
  forward, inside it, holds it; resharding, the root's pre-backward gathers the top layer ahead, and the
  loss's backward moments hold that output until the layer's backward copies it out.
Every count is checked against FSDP2 traced under a fake process group (tests/test_traced.py,
benchmarks/traced_matrix.py: Mixtral 8x7B, Phi-3-mini).
"""

from enum import StrEnum

from planner.strategies.base import Engine, PlanContext
from planner.strategies.moments import (
    FIRST_LAYER_GATHER,
    LAST_LAYER_FORWARD,
    LAST_LAYER_GATHER,
    LOSS_MOMENT,
    ROOT_REGATHER,
)


class Instant(StrEnum):
    """The instants of a step the schedule counts; the forward ones are the ledger's moments."""

    FIRST_LAYER_GATHER = FIRST_LAYER_GATHER
    LAST_LAYER_GATHER = LAST_LAYER_GATHER
    LAST_LAYER_FORWARD = LAST_LAYER_FORWARD
    LOSS_FORWARD = LOSS_MOMENT
    ROOT_REGATHER = ROOT_REGATHER
    LOSS_BACKWARD = "the loss's backward"
    TOP_LAYER_BACKWARD = "the top layer's backward"
    SECOND_LAYER_BACKWARD = "the second layer's backward"
    LAYER_BACKWARD = "a layer's backward"


def forward_instants(ctx: PlanContext) -> tuple[Instant, ...]:
    """The alternative instants of FSDP's forward phase, in step order; () without FSDP. Resharding,
    the first layer's gather (the root's output still held) and the root's re-gather for backward
    are instants of their own."""
    if ctx.engine != Engine.FSDP:
        return ()
    if not ctx.layout.resharding:
        return Instant.LAST_LAYER_GATHER, Instant.LAST_LAYER_FORWARD, Instant.LOSS_FORWARD
    return (Instant.FIRST_LAYER_GATHER, Instant.LAST_LAYER_GATHER, Instant.LAST_LAYER_FORWARD, Instant.LOSS_FORWARD,
            Instant.ROOT_REGATHER)


def layers_saved(ctx: PlanContext, instant: Instant) -> int:
    """Decoder layers whose saved activations exist at a forward instant: none before the first
    layer runs, all but the last at its gather, every one from its forward on."""
    n = ctx.model.num_layers
    return {Instant.FIRST_LAYER_GATHER: 0, Instant.LAST_LAYER_GATHER: n - 1}.get(instant, n)


def gathered_layers(ctx: PlanContext, instant: Instant) -> int:
    """Decoder layers' worth of unsharded parameters and held all-gather outputs at ``instant``
    (each ``layout.layer_gathered`` elements in the gathered dtype); 0 without FSDP.

    | instant                 | resharding      | fsdp-grad-op                      |
    | first layer's gather    | 2 (+ the root)  | (not an instant)                  |
    | last layer's gather     | 3               | 2 beside the kept layers          |
    | last layer's forward    | 2               | 1 beside the kept layers          |
    | the loss's forward      | 1               | 1                                 |
    | the loss's backward     | 1 (prefetched)  | 0                                 |
    | top layer's backward    | 2 (+1 prefetch) | every layer                       |
    | a layer's backward      | 2 (1 if alone)  | 1 (the layers above resharded)    |
    | second layer's backward | as a layer's    | a layer's + the n - 2 below, kept |
    """
    if ctx.engine != Engine.FSDP:
        return 0
    n, resharding = ctx.model.num_layers, ctx.layout.resharding
    layer = 2 if resharding and n > 1 else 1
    counts = {
        Instant.FIRST_LAYER_GATHER: 2,
        Instant.LAST_LAYER_GATHER: 3 if resharding else 2,
        Instant.LAST_LAYER_FORWARD: 2 if resharding else 1,
        Instant.LOSS_FORWARD: 1,
        Instant.ROOT_REGATHER: 0,
        Instant.LOSS_BACKWARD: 1 if resharding else 0,
        Instant.TOP_LAYER_BACKWARD: min(2, n) if resharding else n,
        Instant.LAYER_BACKWARD: layer,
        Instant.SECOND_LAYER_BACKWARD: layer + (0 if resharding else n - 2),
    }
    return counts[instant]


def gathered_bytes(ctx: PlanContext, instant: Instant) -> int:
    """``gathered_layers`` in bytes per GPU."""
    lay = ctx.layout
    return gathered_layers(ctx, instant) * lay.layer_gathered * lay.gathered_bytes


def reduce_scatter_input_elements(ctx: PlanContext) -> int:
    """Elements of one layer's reduce-scatter input (in ``layout.reduce_bytes``), held from a layer's
    backward until the next reduce-scatter (``reduce_scatter_state``): FSDP only."""
    return ctx.layout.layer_trained if ctx.engine == Engine.FSDP else 0
