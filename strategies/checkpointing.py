"""Activation checkpointing: which activations a layer keeps, and the recompute peak.

- none: every tensor each layer saves (planner.cost.activations.layer_saved).
- selective: matmul and attention outputs plus the layer input; norms, activations, RoPE are
  recomputed (torchtitan op-level selective AC).
- full: the layer input only (HF gradient checkpointing, non-reentrant); during backward one
  layer is recomputed in full. Korthikanti et al. 2022, Sec. 5: 2*s*b*h per layer in 16 bit.
In every mode, at the end of backward one layer's saved tensors (recomputed or kept) and its
gradient temporaries are alive; the checkpointed layer input that recomputation starts from
(r*h bytes per token) is counted as part of that layer, which understates the recompute case by
that one vector per token (< 0.1% of a step's peak).
"""

from planner.cost import activations as A
from planner.cost import runtime as R
from planner.emitted import EmitDraft
from planner.ledger import Ledger, LedgerDraft, PagedInfo, Phase
from planner.timing import TimeDraft, Window
from planner.vocabulary import Checkpointing
from strategies import rates
from strategies.base import Check, Engine, PlanContext, Strategy
from strategies.precision import layout


def per_layer_forward_bytes(ctx: PlanContext) -> float:
    """Bytes per token one layer holds from its forward until its backward."""
    m, dt, cfg = ctx.model, layout(ctx).dtypes, ctx.config
    match cfg.checkpointing:
        case Checkpointing.NONE:
            return A.total(A.layer_saved(m, dt, cfg.attention, cfg.seq_len))
        case Checkpointing.SELECTIVE:
            return A.total(A.layer_selective(m, dt, cfg.attention, cfg.seq_len))
        case Checkpointing.FULL:
            return A.layer_input_bytes(m, dt)
    raise ValueError(cfg.checkpointing)


def _check(ctx: PlanContext, out: Check) -> None:
    return None


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    m, dt, cfg = ctx.model, layout(ctx).dtypes, ctx.config
    tokens = cfg.tokens_per_micro_batch
    per_layer = per_layer_forward_bytes(ctx)
    ledger.add(
        "activations", f"saved activations, {m.num_layers} layers ({cfg.checkpointing})", per_layer * m.num_layers,
        tokens, phases=frozenset({Phase.FORWARD}), note=f"{per_layer:,.0f} B/token/layer x {tokens:,} tokens",
    )
    ledger.add(
        "activations", "final norm and head input", A.final_norm_bytes(m, dt), tokens, phases=frozenset({Phase.FORWARD}),
    )
    one_layer = A.total(A.layer_saved(m, dt, cfg.attention, cfg.seq_len))
    transient = A.backward_transient_bytes(m, dt, cfg.attention, cfg.seq_len)
    ledger.add(
        "activations", "one layer's activations and gradient temporaries (backward)", one_layer + transient,
        tokens, phases=frozenset({Phase.BACKWARD}), note="recomputed or kept, plus backward temporaries",
    )


def _time(ctx: PlanContext, ledger: Ledger, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """Elementwise traffic of the layers, and recomputation: full checkpointing runs every layer's
    forward again during backward (matmuls, attention, elementwise: ~33% more compute,
    Korthikanti et al. 2022); selective recomputes only the elementwise ops it did not keep."""
    cfg, m = ctx.config, ctx.model
    saved = A.total(A.layer_saved(m, layout(ctx).dtypes, cfg.attention, cfg.seq_len))
    elementwise = rates.elementwise_forward_seconds(ctx, saved)
    draft.compute("elementwise", "norms, activations, RoPE, residuals (forward)", elementwise, Window.FORWARD)
    draft.compute("elementwise", "norms, activations, RoPE, residuals (backward)", 2 * elementwise, Window.BACKWARD)
    if cfg.checkpointing == Checkpointing.FULL:
        redo = rates.layer_matmul_forward_seconds(ctx) + rates.attention_forward_seconds(ctx) + elementwise
        draft.compute("recompute", "full recomputation: each layer's forward again", redo, Window.BACKWARD)
        draft.cpu_dispatch_seconds += m.num_layers * R.OPS_PER_LAYER_FORWARD * R.DISPATCH_SECONDS_PER_OP_FORWARD
    elif cfg.checkpointing == Checkpointing.SELECTIVE:
        kept = A.total(A.layer_selective(m, layout(ctx).dtypes, cfg.attention, cfg.seq_len))
        redo = rates.elementwise_forward_seconds(ctx, max(0.0, saved - kept))
        draft.compute("recompute", "selective recomputation of elementwise ops", redo, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """Full: FSDP's own activation checkpointing under FSDP (the Trainer's would add a redundant
    all-gather, transformers issue #30404), else HF gradient checkpointing, non-reentrant.
    Selective: no switch exists in accelerate or the Trainer; the notes say how."""
    c = ctx.config.checkpointing
    fsdp = ctx.engine == Engine.FSDP
    if c == Checkpointing.FULL and fsdp:
        files.fsdp()["fsdp_activation_checkpointing"] = True
        files.trainer_fsdp()["activation_checkpointing"] = True
    # transformers 5 names (gradient_checkpointing* are deprecated aliases, removed in v6)
    files.training_args["activation_checkpointing"] = c == Checkpointing.FULL and not fsdp
    if c == Checkpointing.FULL and not fsdp:
        files.training_args["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    if c == Checkpointing.SELECTIVE:
        files.notes.append(
            "selective checkpointing: wrap each decoder layer in torch.utils.checkpoint with "
            "create_selective_checkpoint_contexts and a policy that saves matmul and attention outputs "
            "(examples/train_causal_lm.py does this); neither accelerate nor the Trainer has a switch for it"
        )


STRATEGY = Strategy("checkpointing", tuple(Checkpointing), _check, _apply, _time, _emit)
