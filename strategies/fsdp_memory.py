"""FSDP2's memory beyond the sharded model states: gathered units, reduce-scatter buffers and the
root unit, phase by phase and moment by moment (planner.core.ledger.resident).

Behaviour modelled (torch ``fully_shard``, as planner emits it: every decoder layer and then the
root wrapped, reshard_after_forward=True for each unit, the root included, except fsdp-grad-op):
- how many layers are unsharded at each instant: the gather schedule (strategies/fsdp_schedule.py);
- a layer's reduce-scatter input (reduce dtype) is held (``reduce_scatter_state``) until the next
  reduce-scatter; the unsharded gradients are copied in and freed before the sharded output;
- the root unit is resharded after forward and gathered again when backward starts; its gradients
  (the head's from the loss on, the embeddings' last) are reduce-scattered when its backward ends;
- accumulating, every trained parameter's unsharded gradient in the reduce dtype, from the first
  micro-batch's backward to the last one's reduce-scatter (PlanContext.fsdp_defers_reduction).
Every figure is checked against FSDP2 traced under a fake process group (tests/test_traced.py,
benchmarks/traced_matrix.py).
"""

from planner.core.ledger import LedgerDraft, Phase
from planner.cost import params
from planner.strategies.base import PlanContext
from planner.strategies.checkpointing import backward_peak
from planner.strategies.fsdp_schedule import Instant, forward_instants, gathered_layers, reduce_scatter_input_elements
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
    """Elements an FSDP2 forward holds gathered at its largest instant: the unsharded root unit
    and the layers (and the root's all-gather output) of its largest forward instant, as
    ``fsdp_rows`` writes them. Unit: elements (of gathered_bytes)."""
    root, layer = params.root_parameters(ctx.model), ctx.layout.layer_gathered
    if not ctx.layout.resharding:
        return gathered_model_elements(ctx)
    instants = [i for i in forward_instants(ctx) if (True, i) in _GATHER_WORDS]
    return root + max((gathered_layers(ctx, i) * layer + (root if i == Instant.FIRST_LAYER_GATHER else 0)
                       for i in instants), default=0)


def fsdp_rows(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The FSDP2 rows of every phase, the layers' gathers by the schedule (strategies/fsdp_schedule.py;
    the sharded model states are their writers' rows, placed by the layout)."""
    m, lay = ctx.model, ctx.layout
    root, layer, total = params.root_parameters(m), lay.layer_gathered, gathered_model_elements(ctx)
    g = lay.gathered_bytes
    if not lay.resharding:  # fsdp-grad-op
        ledger.add(
            "gathered_parameters", "unsharded parameters kept from forward to backward", total, g, phases=FWD,
            note="reshard_after_forward=False",
        )
    else:
        # the root is unsharded from its pre-forward to its post-forward and gathered again when
        # backward starts (strategies/loss.py writes that moment)
        ledger.add(
            "gathered_parameters", "FSDP root unit (embeddings, norm, head)", root, g, phases=FWD,
            note="unsharded from the root's pre-forward to its post-forward, and again for backward",
        )
    for instant in forward_instants(ctx):
        if (lay.resharding, instant) not in _GATHER_WORDS:  # the loss's instants: strategies/loss.py
            continue
        what, note = _GATHER_WORDS[(lay.resharding, instant)]
        elements = gathered_layers(ctx, instant) * layer + (root if instant == Instant.FIRST_LAYER_GATHER else 0)
        ledger.add("gathered_parameters", f"FSDP at {instant}: {what}", elements, g, phases=FWD, moment=str(instant),
                   note=note)
    if ctx.fsdp_defers_reduction:
        ledger.add(
            "gradients", "unsharded gradients accumulated until the last micro-batch", lay.trainable_parameters,
            lay.reduce_bytes, phases=FWD | BWD,
            note="gradient sync off between accumulation boundaries (accelerate no_sync)",
        )
    ledger.add(
        "gathered_parameters", "FSDP root unit (backward)", root, g, phases=BWD,
        note="gathered again when backward starts; the layers' gathers are in the layer moments",
    )
    if backward_peak(ctx).reduce_scatter_in_flight:
        ledger.add(
            "communication_buffers", "a layer's reduce-scatter input", reduce_scatter_input_elements(ctx), lay.reduce_bytes,
            phases=BWD, note="FSDP2 copies the unsharded gradients in and frees them before making the sharded output",
        )
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
    adapter (the root unit is frozen)."""
    lay = ctx.layout
    return lay.root_trained - params.late_gradient_parameters(ctx.model) if lay.root_trained else 0


def fsdp_backward_end(ctx: PlanContext) -> tuple[str, dict[str, int]]:
    """FSDP2 at the end of backward (phase ``backward_end``), bytes per term beyond the layers'
    sharded gradients; the larger of two moments (g: parameter dtype bytes; red: reduce dtype).

    - the embeddings' backward: the root unit is unsharded (root*g), the first layer's
      reduce-scatter input is still held until the next reduce-scatter (layer*red; FSDP2 keeps
      ``reduce_scatter_state``), the head's unsharded gradient waits, and the embeddings' backward
      makes its gradient (late*g; tied: one more V*h*g) from the residual gradient (r*h per token).
      Tied, the two table gradients are then added out of place (FSDP's unsharded gradients are
      plain parameters' .grad, no autocast copy): the new one and the sum, 2*V*h*g;
    - the root unit's reduce-scatter: its unsharded gradients (root*g) and their reduce-dtype
      input (root*red).
    With an adapter the root unit trains nothing and the frozen embeddings have no backward: the
    root unit, gathered for backward, and the first layer's reduce-scatter input are what is held.
    Traced with FSDP2 under a fake process group (benchmarks/traced_matrix.py).
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    g, red = lay.gathered_bytes, lay.reduce_bytes
    root, late = params.root_parameters(m), params.late_gradient_parameters(m)
    vh = m.vocab_rows * m.hidden_size if m.tie_word_embeddings else 0
    waiting = root_waiting_gradient(ctx)
    held = {"gathered_parameters": root * g, "communication_buffers": lay.layer_trained * red + waiting * g}
    if lay.adapter is not None:
        return "the root unit and the first layer's reduce-scatter input (frozen embeddings)", held
    rht = lay.dtypes.residual * m.hidden_size * cfg.tokens_per_micro_batch
    moments = {"the embeddings' backward": held | {"activations": rht + (late + vh) * g}}
    if vh and cfg.loss != Loss.CHUNKED:  # the chunked loss's buffer is fresh: added in place
        moments["tied gradients added out of place"] = held | {"activations": (late + 2 * vh) * g}
    moments["the root unit's reduce-scatter"] = {"communication_buffers": root * (g + red)}
    label = max(moments, key=lambda k: sum(moments[k].values()))
    return label, moments[label]
