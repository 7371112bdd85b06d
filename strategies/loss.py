"""Loss: standard cross-entropy over full fp32 logits, or a chunked fused linear cross-entropy."""

from planner.cost import activations as A
from planner.emitted import EmitDraft
from planner.ledger import Ledger, LedgerDraft, PagedInfo, Phase
from planner.timing import TimeDraft, Window
from planner.vocabulary import Loss
from strategies import rates
from strategies.base import Check, PlanContext, Strategy
from strategies.precision import layout


def _check(ctx: PlanContext, out: Check) -> None:
    return None


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    m, lay, cfg = ctx.model, layout(ctx), ctx.config
    tokens = cfg.tokens_per_micro_batch
    fwd = frozenset({Phase.FORWARD})
    if cfg.loss == Loss.CHUNKED:
        ledger.add(
            "logits", "chunked fused linear cross-entropy", A.chunked_loss_bytes(m, lay.dtypes, tokens), 1, phases=fwd,
            note="one chunk of logits and its gradient, plus the head-input gradient",
        )
        return
    per_token = A.logits_bytes(m, lay.dtypes)
    ledger.add(
        "logits", "logits and cross-entropy (fp32)", per_token, tokens, phases=fwd,
        note=f"{per_token:,.0f} B/token: fp32 log-softmax output, its grad and input grad (V={m.vocab_size:,})",
    )


#: fp32 bytes per token x vocabulary the loss moves: forward upcast and log-softmax (~12V),
#: backward NLL gradient, log-softmax backward and the cast back (~22V). A fused or chunked
#: loss moves about the same bytes (it never keeps them). Assumption, calibrated in issue 7.
LOSS_TRAFFIC_FORWARD_PER_VOCAB = 12
LOSS_TRAFFIC_BACKWARD_PER_VOCAB = 22


def _time(ctx: PlanContext, ledger: Ledger, paged: PagedInfo | None, draft: TimeDraft) -> None:
    per = ctx.model.vocab_size * rates.tokens(ctx) / rates.bandwidth(ctx)
    draft.compute("loss", "cross-entropy over the vocabulary (forward)", LOSS_TRAFFIC_FORWARD_PER_VOCAB * per, Window.FORWARD)
    draft.compute("loss", "cross-entropy over the vocabulary (backward)", LOSS_TRAFFIC_BACKWARD_PER_VOCAB * per, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    chunked = ctx.config.loss == Loss.CHUNKED
    files.training_args["use_liger_kernel"] = chunked
    if chunked:
        files.notes.append("chunked loss: pip install liger-kernel (fused linear cross-entropy; use_liger_kernel)")


STRATEGY = Strategy("loss", tuple(Loss), _check, _apply, _time, _emit)
