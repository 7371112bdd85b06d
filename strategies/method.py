"""Training method: supervised fine-tuning (sft) or direct preference optimization (dpo), as TRL's
trainers run them. A method is named, never searched: ``--method dpo`` plans a DPO job.

DPO as TRL >= 1.15's DPOTrainer runs it (planner/cost/preference.py holds the facts, with sources):
- each sample of a micro-batch is a pair, its chosen and rejected sequences on the batch axis: the
  configuration's ``rows_per_micro_batch`` (planner/core/vocabulary.py), which every activation
  and time row reads;
- a frozen reference model in the policy's stored dtype, whole on every GPU (DDP; ZeRO-1/2 run it
  at stage 0), unless an adapter trains (the adapter-disabled base is the reference) or the
  log-probabilities are precomputed before training (``--dpo-reference precomputed``);
- the reference forward after the policy's, under ``no_grad``, while the policy's activations are
  saved (its own moment of the forward phase), when no precomputation replaces it;
- log-probabilities from TRL's fused LM head, never the logits (strategies/loss.py).
Sharded engines (ZeRO-3, FSDP), whose reference forward all-gathers its own units while the
policy's activations wait, are refused until modelled.
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo, Phase
from planner.core.lengths import Batching
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Setting
from planner.cost import activations, overheads, params, preference
from planner.strategies import rates
from planner.strategies.base import Check, Choice, PlanContext, Strategy
from planner.strategies.moments import FROZEN_EVERY_RANK


class Method(StrEnum):
    SFT = "sft"
    DPO = "dpo"


class DpoReference(StrEnum):
    """Where DPO's reference log-probabilities come from while training."""

    MODEL = "model"  # a reference forward every step (TRL's default)
    PRECOMPUTED = "precomputed"  # precompute_ref_log_probs: one pass over the data before training


CHOICES: dict[Method, Choice] = {
    Method.SFT: Choice("supervised fine-tuning: next-token cross-entropy on every sequence"),
    # (not convex in the micro-batch: the fused head's projection buffer stops growing at 4,096 tokens)
    Method.DPO: Choice("direct preference optimization (TRL's DPOTrainer): chosen and rejected, a reference",
                       searched=False, convex=False),
}

SETTINGS = (
    Setting("dpo_reference", DpoReference, DpoReference.MODEL,
            "DPO's reference log-probabilities: model (a reference forward every step; a frozen copy of the "
            "policy unless an adapter trains) or precomputed (TRL's precompute_ref_log_probs: one pass before "
            "training, no reference model kept)", used_at=("dpo",)),
)

#: The forward phase's moment of DPO's reference forward (planner.core.ledger.resident).
REFERENCE_FORWARD = "the reference forward"
#: What a DPO plan needs of the other techniques: (field, allowed values, rejection code, why).
DPO_ALLOWS = (
    ("sharding", ("none", "ddp", "zero1", "zero2"), "dpo with a sharded engine",
     "the sharded reference forward (its all-gathers while the policy's activations are saved) is not "
     "modelled yet; use sharding ddp, zero1 or zero2 (the reference whole on every GPU)"),
    ("loss", ("standard",), "dpo with the chunked loss",
     "TRL's DPOTrainer computes its log-probabilities with its own fused LM head (no logits); plan loss standard"),
)


def dpo(config) -> bool:
    """Whether ``config`` (a TrainingConfig) plans DPO: the one test every layer asks."""
    return config.method == Method.DPO


def reference_kept(ctx: PlanContext) -> bool:
    """Whether the plan holds a reference model (preference.reference_kept)."""
    return dpo(ctx.config) and preference.reference_kept(ctx.layout.adapter is not None,
                                                         ctx.config.dpo_reference == DpoReference.PRECOMPUTED)


def reference_forward(ctx: PlanContext) -> bool:
    """Whether each step runs a reference forward (not with precomputed log-probabilities)."""
    return dpo(ctx.config) and ctx.config.dpo_reference == DpoReference.MODEL


def _check(ctx: PlanContext, out: Check) -> None:
    if not dpo(ctx.config):
        return
    for field, allowed, code, why in DPO_ALLOWS:
        value = str(getattr(ctx.config, field))
        if value not in allowed:
            out.reject(code, f"dpo with {field} {value}: {why}")
            return
    if ctx.config.batching != Batching.PADDED:
        out.reject(f"dpo with {ctx.config.batching} batching", f"dpo with {ctx.config.batching} batching: TRL's "
                   "DPOTrainer pads each micro-batch of pairs to its longest sequence (cut at max_length) and never "
                   "packs; use --batching padded")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The reference model's weights (every phase) and the reference forward's moment: one decoder
    layer's tensors at most (under ``no_grad`` a layer frees its intermediates as it goes: bounded
    by what it would save), the backbone's output and the fused LM head's forward."""
    if not dpo(ctx.config):
        return
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    if reference_kept(ctx):
        ledger.add("weights", "the reference model (frozen copy, DPO)", params.total_parameters(m), lay.weight_bytes,
                   shard=preference.reference_divisor(False, lay.data_parallel), tag=FROZEN_EVERY_RANK,
                   note="in the policy's dtype, whole on every GPU (DeepSpeed runs it at ZeRO stage 0)")
    if not reference_forward(ctx):
        return
    tokens, c, fwd = cfg.tokens_per_micro_batch, lay.dtypes.compute, frozenset({Phase.FORWARD})
    layer = activations.total(activations.layer_saved(m, lay.dtypes, lay.fused_attention, cfg.seq_len))
    ledger.add("activations", "reference forward: one decoder layer's tensors (at most its saved list)", layer,
               tokens, phases=fwd, moment=REFERENCE_FORWARD, note="under no_grad, after the policy's forward")
    ledger.add("logits", "reference forward: the fused LM head (projection buffer, per-token statistics)",
               preference.fused_forward_bytes(tokens, m.hidden_size, c, c) + tokens * m.hidden_size * c, 1,
               phases=fwd, moment=REFERENCE_FORWARD, note="and the backbone's output; no logits")


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The reference forward of every micro-batch: one forward pass of the model over the pairs'
    rows (matmuls with the head, attention, the elementwise ops; over a QLoRA base, its
    dequantization too), under no_grad."""
    if not reference_forward(ctx):
        return
    # (imported here: the loss strategy, which adapter and checkpointing import, reads ``dpo``)
    from planner.strategies.adapter import nf4_dequantize_seconds
    from planner.strategies.checkpointing import layer_saved_bytes

    forward = (rates.layer_matmul_forward_seconds(ctx) + rates.head_matmul_forward_seconds(ctx)
               + rates.attention_forward_seconds(ctx) + rates.elementwise_forward_seconds(ctx, layer_saved_bytes(ctx)))
    spec = ctx.layout.adapter
    if spec is not None and spec.nf4:  # the adapter-disabled 4-bit base dequantizes every weight again
        forward += nf4_dequantize_seconds(ctx)
    draft.compute("matmul", "DPO reference forward (no_grad)", forward, Window.FORWARD,
                  note="every micro-batch, after the policy's forward")
    draft.dispatch(ctx.model.num_layers * overheads.layer_forward_dispatch_seconds(ctx.layout.fused_attention), 0.0)


#: DPOConfig keys the emitted Trainer arguments state (DPO's own: no SFT recipe holds them).
EMITTED = ("precompute_ref_log_probs", "f_divergence_type")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """A DPO plan's Trainer arguments are a TRL DPOConfig: its own keys (``f_divergence_type``
    reverse_kl: standard DPO, DPOConfig's default), the precomputation and the length."""
    if not dpo(ctx.config):
        return
    files.training_args["precompute_ref_log_probs"] = ctx.config.dpo_reference == DpoReference.PRECOMPUTED
    files.training_args["f_divergence_type"] = "reverse_kl"
    files.training_args["max_length"] = ctx.config.seq_len
    files.extras.add("trl")


#: Keys only TRL's DPOConfig has (not KTO's, ORPO's or SFT's): a recipe holding one is DPO.
DPO_ONLY = ("f_divergence_type", "use_weighting", "ld_alpha", "discopop_tau", "rpo_alpha", "ref_model_init_kwargs")


def _read(job: JobFiles, r: Reading) -> None:
    """A Trainer/TRL recipe with a key only DPOConfig has is DPO; its reference from
    ``precompute_ref_log_probs``."""
    d, where = job.training_args, job.training_args_where
    if not where:
        return
    said = [k for k in DPO_ONLY if k in d] if not job.framework else []
    if not said:  # (a framework file of another method, or a TRL recipe of one, is refused: planner/check/methods.py)
        r.set("method", Method.SFT, f"{where}: no DPOConfig key: supervised fine-tuning")
    else:
        r.set("batching", Batching.PADDED, f"{where}: {said[0]}: TRL's preference collator pads each micro-batch "
                                            "of pairs to its longest")
        r.set("method", Method.DPO, f"{where}: {said[0]} (a DPOConfig key)")
        pre = r.typed(d, "precompute_ref_log_probs", (bool,), where)
        r.set("dpo_reference", DpoReference.PRECOMPUTED if pre else DpoReference.MODEL,
              f"{where}: precompute_ref_log_probs" if pre is not None else
              f"{where}: no precompute_ref_log_probs (DPOConfig's default, false)")


def describe(get) -> str:
    """'' for sft (supervised fine-tuning goes without saying in a summary), else the method with
    its reference ("dpo", "dpo precomputed")."""
    if get("method") != Method.DPO:
        return ""
    return "dpo" + (" precomputed" if get("dpo_reference") == DpoReference.PRECOMPUTED else "")


STRATEGY = Strategy(
    "method", Method, Method.SFT, order=8, short="method",
    help="training method: sft (supervised fine-tuning) or dpo (TRL's DPOTrainer: chosen and rejected sequences, "
         "a frozen reference); named, never searched",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, settings=SETTINGS, describe=describe,
    records=CHOICES, named=True,
)
