"""FSDP2's memory beyond the sharded model states: gathered units, reduce-scatter buffers and the
root unit, phase by phase and moment by moment (planner.core.ledger.resident).

Behaviour modelled (torch ``fully_shard``, as planner emits it: every decoder layer and then the
root wrapped, reshard_after_forward=True for each unit, the root included, except fsdp-grad-op):
- how many layers are unsharded at each instant: the gather schedule (strategies/fsdp_schedule.py);
- a layer's reduce-scatter input (reduce dtype) is held (``reduce_scatter_state``) until the next
  reduce-scatter; the unsharded gradients are copied in and freed before the sharded output;
- the units outside the layers (strategies/fsdp_units.py: accelerate's root unit, or transformers'
  units under tensor parallelism): accelerate's root is resharded after forward and gathered again
  when backward starts; its gradients (the head's from the loss on, the embeddings' last) are
  reduce-scattered when its backward ends;
- accumulating, every trained parameter's unsharded gradient in the reduce dtype, from the first
  micro-batch's backward to the last one's reduce-scatter (PlanContext.fsdp_defers_reduction).
Every figure is checked against FSDP2 traced under a fake process group (tests/test_traced.py,
benchmarks/traced_matrix.py).
"""

from planner.core.ledger import LedgerDraft, Phase
from planner.cost import params, tensor
from planner.strategies.base import PlanContext
from planner.strategies.checkpointing import backward_peak
from planner.strategies.fsdp_schedule import Instant, forward_instants, gathered_layers, reduce_scatter_input_elements
from planner.strategies.fsdp_units import layer_backward_extra, loss_forward_output, outer_units
from planner.strategies.loss import Loss

FWD, BWD = frozenset({Phase.FORWARD}), frozenset({Phase.BACKWARD})


#: The forward instants' gather rows: (resharding, instant) -> (what, note).
_GATHER_WORDS = {
    (True, Instant.FIRST_LAYER_GATHER): ("the root's all-gather output and 2 layers",
                                         "held until the first layer's output is copied out; no saved tensors yet"),
    (True, Instant.LAST_LAYER_GATHER): ("3 layers", "its all-gather output and unsharded parameters, the previous "
                                        "output held"),
    (True, Instant.LAST_LAYER_FORWARD): ("2 layers", "its unsharded parameters and all-gather output"),
    (False, Instant.LAST_LAYER_GATHER): ("2 all-gather output(s)", "its own and the previous one, held"),
    (False, Instant.LAST_LAYER_FORWARD): ("1 all-gather output(s)", "its own, held until the next all-gather"),
}


def forward_gathered_elements(ctx: PlanContext) -> int:
    """Elements an FSDP2 forward holds gathered at its largest instant: the units outside the
    layers held through it and the layers (and the first gather's held output) of its largest
    forward instant, or the loss's unit and layer, as ``fsdp_rows`` and strategies/loss.py write
    them. Unit: elements (of gathered_bytes)."""
    layer, units = ctx.layout.layer_gathered, outer_units(ctx)
    if not ctx.layout.resharding:
        return gathered_model_elements(ctx)
    instants = [i for i in forward_instants(ctx) if (True, i) in _GATHER_WORDS]
    first = units.first_gather_output
    at_loss = units.loss_held + loss_forward_output(ctx)
    return units.forward_held + max([at_loss] + [gathered_layers(ctx, i) * layer
                                                 + (first if i == Instant.FIRST_LAYER_GATHER else 0) for i in instants])


def fsdp_rows(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The FSDP2 rows of every phase, the layers' gathers by the schedule (strategies/fsdp_schedule.py;
    the sharded model states are their writers' rows, placed by the layout)."""
    lay = ctx.layout
    layer, total, units = lay.layer_gathered, gathered_model_elements(ctx), outer_units(ctx)
    g = lay.gathered_bytes
    if not lay.resharding:  # fsdp-grad-op
        ledger.add(
            "gathered_parameters", "unsharded parameters kept from forward to backward", total, g, phases=FWD,
            note="reshard_after_forward=False",
        )
    else:
        # accelerate's root is unsharded from its pre-forward to its post-forward and gathered
        # again when backward starts (strategies/loss.py writes that moment)
        ledger.add(
            "gathered_parameters", units.words, units.forward_held, g, phases=FWD,
            note="unsharded through the layers' forward (strategies/fsdp_units.py)",
        )
    for instant in forward_instants(ctx):
        if (lay.resharding, instant) not in _GATHER_WORDS:  # the loss's instants: strategies/loss.py
            continue
        what, note = _GATHER_WORDS[(lay.resharding, instant)]
        first = units.first_gather_output if instant == Instant.FIRST_LAYER_GATHER else 0
        elements = gathered_layers(ctx, instant) * layer + first
        ledger.add("gathered_parameters", f"FSDP at {instant}: {what}", elements, g, phases=FWD, moment=str(instant),
                   note=note)
    if ctx.fsdp_defers_reduction:
        ledger.add(
            "gradients", "unsharded gradients accumulated until the last micro-batch", lay.trainable_parameters,
            lay.reduce_bytes, phases=FWD | BWD,
            note="gradient sync off between accumulation boundaries (accelerate no_sync)",
        )
    ledger.add(
        "gathered_parameters", f"{units.words} (backward)", units.backward_held, g, phases=BWD,
        note="gathered for backward's start; the layers' gathers are in the layer moments",
    )
    peak = backward_peak(ctx)
    if peak.reduce_scatter_in_flight:
        ledger.add(
            "communication_buffers", "a layer's reduce-scatter input", reduce_scatter_input_elements(ctx), lay.reduce_bytes,
            phases=BWD, note="FSDP2 copies the unsharded gradients in and frees them before making the sharded output",
        )
    if peak.gradients_before:  # the first layer's: the embeddings' unit gathered ahead
        ledger.add("gathered_parameters", "the embeddings' all-gather output, prefetched",
                   layer_backward_extra(ctx, True), 1, phases=BWD)
    elif not peak.reduce_scatter_in_flight:  # the top layer's: the head unit's backward has ended
        ledger.add("gradients", "the head unit's sharded gradients", layer_backward_extra(ctx, False), 1,
                   phases=BWD)
    waiting = root_waiting_gradient(ctx)
    ledger.add(
        "communication_buffers", "FSDP root unit: the head's unsharded gradient (until the root's reduce-scatter)",
        waiting, g, phases=BWD, note="made by the head's backward, reduced when the root unit's backward ends",
    )
    label, at_end = fsdp_backward_end(ctx)
    for term, bytes_ in at_end.items():
        ledger.add(term, f"FSDP end of backward, {label}", bytes_, 1, phases=frozenset({Phase.BACKWARD_END}),
                   note="the larger of the embeddings' backward and the root unit's reduce-scatter")


def gathered_model_elements(ctx: PlanContext) -> int:
    """Elements of the whole model as ZeRO-3 / FSDP gather it, in the gathered dtype: the root
    unit and every decoder layer with its adapters (FSDP-QLoRA: the packed NF4 codes)."""
    return params.root_parameters(ctx.model) + ctx.model.num_layers * ctx.layout.layer_gathered


def root_waiting_gradient(ctx: PlanContext) -> int:
    """Elements of the root unit's gradients made before its reduce-scatter (the head's and the
    final norm's, from the loss on): the root's trained elements but the embeddings'; 0 with an
    adapter (the root unit is frozen) or where the head's unit reduces them before the layers'
    backward (strategies/fsdp_units.py)."""
    lay = ctx.layout
    if not lay.root_trained or not outer_units(ctx).head_gradient_waits:
        return 0
    return lay.root_trained - params.late_gradient_parameters(ctx.model)


def fsdp_backward_end(ctx: PlanContext) -> tuple[str, dict[str, int]]:
    """FSDP2 at the end of backward (phase ``backward_end``), bytes per term beyond the layers'
    sharded gradients; the larger of two moments (g: parameter dtype bytes; red: reduce dtype).

    - the embeddings' backward: the root unit is unsharded (root*g), the first layer's
      reduce-scatter input is still held until the next reduce-scatter (layer*red; FSDP2 keeps
      ``reduce_scatter_state``), the head's unsharded gradient waits, and the embeddings' backward
      makes its gradient (late*g; tied: one more V*h*g) from the residual gradient (r*h per token).
      Tied, the two table gradients are then added out of place (FSDP's unsharded gradients are
      plain parameters' .grad, no autocast copy): the new one and the sum, 2*V*h*g;
    - the last unit's reduce-scatter (accelerate's root, transformers' embeddings: strategies/
      fsdp_units.py): its unsharded gradients (last*g) and their reduce-dtype input (last*red); a
      kept unit (transformers', tied) is still unsharded (last*g).
    Vocabulary-parallel (tensor parallelism): the embeddings' backward makes the whole table's
    gradient, held until the reduce-scatter (planner.cost.tensor.embedding_backward_extra), and
    then a clone of the rank's rows, before the reduce-scatter copies it in; both are still held
    when the reduce-scatter makes its sharded output (last*red/D).
    With an adapter the root unit trains nothing and the frozen embeddings have no backward: the
    root unit, gathered for backward, and the first layer's reduce-scatter input are what is held.
    Traced with FSDP2 under a fake process group (benchmarks/traced_matrix.py).
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    g, red = lay.gathered_bytes, lay.reduce_bytes
    units, late = outer_units(ctx), params.late_gradient_parameters(m)
    last = units.last_unit
    vh = m.vocab_rows * m.hidden_size if m.tie_word_embeddings else 0
    waiting = root_waiting_gradient(ctx)
    held = {"gathered_parameters": last * g, "communication_buffers": lay.layer_trained * red + waiting * g}
    if lay.adapter is not None:
        return "the root unit and the first layer's reduce-scatter input (frozen embeddings)", held
    T = cfg.tokens_per_micro_batch
    rht = lay.dtypes.residual * m.hidden_size * T
    # vocabulary-parallel: the whole table's gradient beyond the rank's rows, and the masked output gradient
    whole, masked = tensor.embedding_backward_extra(m)
    split = {"gradients": (whole - m.vocab_rows * m.hidden_size) * g if whole else 0}
    moments = {"the embeddings' backward": held | split | {"activations": rht + (late + vh) * g
                                                           + masked * T * lay.dtypes.compute}}
    if vh and cfg.loss != Loss.CHUNKED:  # the chunked loss's buffer is fresh: added in place
        moments["tied gradients added out of place"] = held | split | {"activations": (late + 2 * vh) * g}
    if whole:  # the rank's rows cut from the whole table's gradient (a clone), before the reduce-scatter
        moments["the rank's rows cut from the whole gradient"] = held | {
            "gradients": (whole + m.vocab_rows * m.hidden_size) * g}
    # its unsharded gradients and their reduce-dtype input; vocabulary-parallel, the whole table's
    # gradient and the rank's rows cut from it are still held when the sharded output is made
    moments["the last unit's reduce-scatter"] = {
        "communication_buffers": last * (g + red) + (last * red // lay.shard_degree if whole else 0),
        "gradients": whole * g, "gathered_parameters": last * g if units.last_kept else 0}
    label = max(moments, key=lambda k: sum(moments[k].values()))
    return label, moments[label]
