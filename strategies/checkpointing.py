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
from planner.ledger import LedgerDraft, Phase
from planner.vocabulary import Checkpointing
from strategies.base import Check, PlanContext, Strategy
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


STRATEGY = Strategy("checkpointing", tuple(Checkpointing), _check, _apply)
