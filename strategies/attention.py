"""Attention implementation: sdpa (fused: flash / memory-efficient kernels) or eager.

Its memory effect lives in planner.cost.activations (fused attention saves no s^2 tensor;
eager saves fp32 softmax probabilities, a*s per token). Here: when a choice is unwise.
"""

from planner.core.emitted import EmitDraft
from planner.core.ledger import Ledger, LedgerDraft, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Attention
from strategies import rates
from strategies.base import Check, PlanContext, Strategy


#: Families whose transformers class has no SDPA path (Gemma2ForCausalLM raises ValueError on
#: attn_implementation="sdpa" in transformers 5; found by the traced probe).
NO_SDPA = frozenset({"gemma2"})


def _check(ctx: PlanContext, out: Check) -> None:
    m, a = ctx.model, ctx.config.attention
    if a == Attention.SDPA and m.family in NO_SDPA:
        out.reject(
            "sdpa unsupported by the model",
            f"{m.family}: transformers' model class refuses attn_implementation='sdpa' (attention-logit "
            "soft-capping); use --attention eager",
        )
    elif a == Attention.SDPA and m.attn_logit_softcapping:
        out.warnings.append(
            f"{m.family}: SDPA ignores attention-logit soft-capping ({m.attn_logit_softcapping}); "
            "transformers recommends eager attention for training this model"
        )
    if a == Attention.EAGER and ctx.config.seq_len >= 4096:
        out.warnings.append("eager attention materialises s^2 scores per head; sdpa is faster and saves that memory")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    return None


def _time(ctx: PlanContext, ledger: Ledger, paged: PagedInfo | None, draft: TimeDraft) -> None:
    fwd = rates.attention_forward_seconds(ctx)
    how = "fused, causal blocks skipped" if ctx.config.attention == Attention.SDPA else "eager, full s^2"
    draft.compute("attention", f"attention forward ({how})", fwd, Window.FORWARD)
    draft.compute("attention", f"attention backward ({how})", 2 * fwd, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    files.model_kwargs["attn_implementation"] = str(ctx.config.attention)


STRATEGY = Strategy("attention", tuple(Attention), _check, _apply, _time, _emit)
