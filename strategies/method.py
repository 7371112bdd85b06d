"""Training method: supervised fine-tuning (sft), direct preference optimization (dpo), group
relative policy optimization (grpo) or Kahneman-Tversky optimization (kto), as TRL's trainers run
them. A method is named, never searched: ``--method dpo`` plans a DPO job.

DPO as TRL >= 1.15's DPOTrainer runs it (planner/cost/preference.py holds the facts, with sources):
- each sample of a micro-batch is a pair, its chosen and rejected sequences on the batch axis: the
  configuration's ``rows_per_micro_batch`` (planner/core/vocabulary.py), which every activation
  and time row reads;
- a frozen reference model in the policy's stored dtype, whole on every GPU (DDP; ZeRO-1/2 run it
  at stage 0; ZeRO-3 partitions it like the policy), unless an adapter trains (the adapter-disabled base is the reference) or the
  log-probabilities are precomputed before training (``--dpo-reference precomputed``);
- the reference forward after the policy's, under ``no_grad``, while the policy's activations are
  saved (its own moment of the forward phase), when no precomputation replaces it;
- log-probabilities from TRL's fused LM head, never the logits (strategies/loss.py).
Under ZeRO-3 the reference forward gathers the head and a prefetch bucket as a training forward
does, beside the policy's saved activations; under FSDP2 the reference is one unit, gathered whole;
FSDP1 is refused until modelled.

KTO as TRL >= 1.15's KTOTrainer runs it (kto_trainer.py): one row per sample (a prompt and its
completion, desirable or not), through the same fused LM head; DPO's reference (a frozen copy
unless an adapter trains or the log-probabilities are precomputed: ``--dpo-reference``); with the
KL estimate (``--kto-loss kto``, KTOConfig's default) each micro-batch's completions cycled onto
the other prompts make a KL batch of as many rows, run by the policy under ``no_grad`` before its
own forward and by the reference before the batch's reference forward. The reference forwards
(sequential, each freeing its tensors) are one moment of the forward phase beside the policy's
saved activations, as DPO's; the policy's KL forward comes before any activation is saved and
holds what that moment holds less them, so it never sets the peak and has no row. Time: each of
these forwards per micro-batch. Micro-batches of at least 2 with the KL estimate (TRL refuses 1).

GRPO as TRL 1.16's GRPOTrainer runs it (planner/cost/rollout.py): each row a prompt and its
completion (``--seq-len`` the longest prompt plus ``--completion-len``), padded, never packed;
completions generated a generation batch at a time (``--generation-batch-size``; by default the
optimizer step's: one generation per step; strategies/generation.py), trained on
``--num-iterations`` times, and scored by no-grad forwards of each micro-batch (the policy's for
vLLM's importance-sampling correction or a generation unaligned with the optimizer steps, the
reference's when ``--kl-beta`` is not 0); a reference model only then, and not with an adapter;
the loss through the same fused LM head as DPO's. The generation batch is whole groups of
``--num-generations`` and whole micro-batches of every GPU. Under ZeRO-3 the scoring forwards
gather as a training forward, and the generation gathers what TRL gathers
(strategies/generation.py); FSDP1 is refused until modelled.
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.errors import PlannerInputError
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo, Phase
from planner.core.lengths import Batching
from planner.core.timing import TimeDraft, Window
from planner.core.trl_recipes import grpo_recipe
from planner.core.vocabulary import Setting
from planner.cost import activations, overheads, params, preference
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.generation import SCORING, VLLM
from planner.strategies.moments import FROZEN_EVERY_RANK


class Method(StrEnum):
    SFT = "sft"
    DPO = "dpo"
    GRPO = "grpo"
    KTO = "kto"


class KtoLoss(StrEnum):
    """TRL's KTOConfig ``loss_type``."""

    KTO = "kto"  # the KTO paper's loss: a KL estimate from mismatched completions (extra forwards)
    APO_ZERO_UNPAIRED = "apo-zero-unpaired"  # TRL's apo_zero_unpaired: no KL estimate


#: The trainer that runs each method other than SFT (TRL's).
TRAINERS = {"dpo": "DPOTrainer", "grpo": "GRPOTrainer", "kto": "KTOTrainer"}


class DpoReference(StrEnum):
    """Where DPO's reference log-probabilities come from while training."""

    MODEL = "model"  # a reference forward every step (TRL's default)
    PRECOMPUTED = "precomputed"  # precompute_ref_log_probs: one pass over the data before training
    NONE = "none"  # reference-free losses: ORPO and SimPO as LLaMA-Factory runs them (pref_loss orpo / simpo)


class DpoLogprobs(StrEnum):
    """How a DPO trainer computes its log-probabilities."""

    FUSED = "fused"  # TRL >= 1.15's fused LM head: no logits (planner/cost/preference.py)
    FULL_LOGITS = "full-logits"  # LLaMA-Factory's trainer: the full logits upcast to fp32, then their log-softmax


CHOICES: dict[Method, Choice] = {
    Method.SFT: Choice("supervised fine-tuning: next-token cross-entropy on every sequence"),
    # (not convex in the micro-batch: the fused head's projection buffer stops growing at 4,096 tokens)
    Method.DPO: Choice("direct preference optimization (TRL's DPOTrainer): chosen and rejected, a reference",
                       searched=False, convex=False),
    Method.GRPO: Choice("group relative policy optimization (TRL's GRPOTrainer): completions generated and scored "
                        "each step", searched=False, convex=False),
    Method.KTO: Choice("Kahneman-Tversky optimization (TRL's KTOTrainer): unpaired completions, a KL estimate, a "
                       "reference", searched=False, convex=False),
}

SETTINGS = (
    Setting("dpo_reference", DpoReference, DpoReference.MODEL,
            "DPO's and KTO's reference log-probabilities: model (a reference forward every step; a frozen copy of "
            "the policy unless an adapter trains), precomputed (TRL's precompute_ref_log_probs: one pass before "
            "training, no reference model kept) or none (DPO only, a reference-free loss: LLaMA-Factory's pref_loss "
            "orpo or simpo)", used_at=("dpo", "kto")),
    Setting("dpo_logprobs", DpoLogprobs, DpoLogprobs.FUSED,
            "how DPO's log-probabilities are computed: fused (TRL >= 1.15's fused LM head: no logits; what planner's "
            "files run) or full-logits (LLaMA-Factory's DPO trainer: the head's logits upcast to fp32 and their "
            "log-softmax, for the policy and the reference; planned by check, not emitted)", used_at=("dpo",)),
    Setting("kto_loss", KtoLoss, KtoLoss.KTO,
            "KTO's loss (KTOConfig loss_type): kto (the KL estimate: each micro-batch's completions cycled onto "
            "other prompts, a no-grad forward of the policy and of the reference over them; micro-batches of at "
            "least 2) or apo-zero-unpaired (no KL estimate)", used_at=("kto",)),
    Setting("num_generations", int, 8, "GRPO's completions per prompt (GRPOConfig num_generations): the global "
            "batch of completions is a multiple of it", ge=2, used_at=("grpo",)),
    Setting("completion_len", int, 512, "GRPO's max_completion_length: the tokens generated per completion, part of "
            "--seq-len (the longest prompt plus this)", ge=1, used_at=("grpo",)),
    Setting("kl_beta", float, 0.0, "GRPO's beta (the KL coefficient): 0 (TRL's default) keeps no reference model; "
            "above 0, a reference forward per micro-batch and, without an adapter, a frozen copy", ge=0.0,
            used_at=("grpo",)),
    Setting("generation_batch_size", int, 0, "GRPO's generation batch (GRPOConfig generation_batch_size): "
            "completions generated at once over the training GPUs, trained on micro-batch by micro-batch over the "
            "steps that follow; 0: the optimizer step's batch (TRL's default). Whole groups of --num-generations, a "
            "multiple of micro-batch x GPUs", ge=0, used_at=("grpo",)),
    Setting("num_iterations", int, 1, "GRPO's num_iterations (the paper's mu): optimization passes over each "
            "generation batch; one generation per mu of them", ge=1, used_at=("grpo",)),
)

#: The forward phase's moment of DPO's reference forward (planner.core.ledger.resident).
REFERENCE_FORWARD = "the reference forward"
#: What a DPO or GRPO plan needs of the other techniques: (field, allowed values, rejection code,
#: why, whether the job may run and planner does not model it yet).
TRL_ALLOWS = (
    ("fsdp_version", (2,), "with FSDP1",
     "TRL's prepare_fsdp wraps the reference with FSDP1's auto-wrap policy, whose gathers around TRL's extra "
     "forwards are not modelled yet; use --fsdp-version 2, or ZeRO-3", True),
    ("loss", ("standard",), "with the chunked loss",
     "TRL's trainer computes its log-probabilities with its own fused LM head (no logits); plan loss standard", False),
)


def dpo(config) -> bool:
    """Whether ``config`` (a TrainingConfig) plans DPO: the one test every layer asks."""
    return config.method == Method.DPO


def kto(config) -> bool:
    """Whether ``config`` (a TrainingConfig) plans KTO."""
    return config.method == Method.KTO


def referenced(config) -> bool:
    """Whether ``config`` plans a method whose reference is DPO's (``dpo_reference``): DPO or KTO."""
    return config.method in (Method.DPO, Method.KTO)


def kl_estimate(config) -> bool:
    """Whether ``config`` plans KTO with its KL estimate (KTOConfig loss_type kto: TRL's
    ``calculate_KL``, every loss type but apo_zero_unpaired)."""
    return kto(config) and config.kto_loss == KtoLoss.KTO


def grpo(config) -> bool:
    """Whether ``config`` (a TrainingConfig) plans GRPO."""
    return config.method == Method.GRPO


def fused_head(config) -> bool:
    """Whether the plan's log-probabilities come from TRL's fused LM head (DPO, GRPO): no logits."""
    return config.method != Method.SFT and not full_logits(config)


def trl_emittable(config) -> bool:
    """Whether planner's files (TRL's trainers) run the plan: not a DPO of LLaMA-Factory's trainer
    (full-logits log-probabilities, or a reference-free loss), which check plans but TRL does not run."""
    return not (dpo(config) and (full_logits(config) or config.dpo_reference == DpoReference.NONE))


def full_logits(config) -> bool:
    """Whether the plan is DPO computing its log-probabilities from the full logits (LLaMA-Factory's
    trainer: the head's logits, their fp32 upcast and log-softmax; planner/cost/preference.py)."""
    return config.method == Method.DPO and config.dpo_logprobs == DpoLogprobs.FULL_LOGITS


def reference_kept(ctx: PlanContext) -> bool:
    """Whether the plan holds a reference model (preference.reference_kept): DPO's unless
    precomputed, GRPO's when its beta is not 0; neither with an adapter."""
    cfg, adapter = ctx.config, ctx.layout.adapter is not None
    if grpo(cfg):
        return cfg.kl_beta > 0 and not adapter
    return (referenced(cfg) and cfg.dpo_reference != DpoReference.NONE
            and preference.reference_kept(adapter, cfg.dpo_reference == DpoReference.PRECOMPUTED))


def reference_forward(ctx: PlanContext) -> bool:
    """Whether each DPO or KTO micro-batch runs a reference forward with the policy's activations
    saved (not with precomputed log-probabilities)."""
    return referenced(ctx.config) and ctx.config.dpo_reference == DpoReference.MODEL


def no_grad_forwards(ctx: PlanContext) -> tuple[int, int]:
    """DPO's and KTO's no-grad forwards per micro-batch, each of the micro-batch's rows: (the
    policy's, the reference's). DPO's reference forward; KTO's reference forward and, with the KL
    estimate, the policy's and the reference's over the KL batch (kto_trainer.py ``_compute_loss``:
    ``_compute_kl_logps`` of the policy before its forward, of the reference before the
    reference's forward)."""
    kl = kl_estimate(ctx.config)
    return int(kl), reference_forward(ctx) * (1 + kl)


def generation_batch(config, data_parallel: int) -> int:
    """GRPO's generation batch: ``generation_batch_size``, or the optimizer step's batch (TRL's
    default, ``steps_per_generation`` the accumulation steps). Unit: completions, over the
    ``data_parallel`` training GPUs."""
    return config.generation_batch_size or config.samples_per_gpu_step * data_parallel


def generation_batch_faults(size: int, micro_batch: int | None, data_parallel: int, groups: int) -> tuple[str, ...]:
    """What GRPOConfig.__post_init__ raises for a generation batch of ``size`` completions:
    "micro-batches" where it is not whole micro-batches of every process (``micro_batch`` None: not
    asked), "groups" where it is not whole groups of ``groups`` (num_generations)."""
    return tuple(fault for fault, bad in (
        ("micro-batches", micro_batch is not None and size % (micro_batch * data_parallel) != 0),
        ("groups", size % groups != 0)) if bad)


def generations_per_step(ctx: PlanContext) -> float:
    """Generations per optimizer step, on average: TRL generates every ``steps_per_generation x
    num_iterations`` micro-batches (grpo_trainer.py ``_prepare_inputs``: ``generate_every``), with
    ``steps_per_generation`` the generation batch over micro-batch x GPUs; so the step's batch over
    the generation batch times ``num_iterations`` (below 1: one generation every few steps). Unit:
    generations per step."""
    cfg, dp = ctx.config, ctx.layout.data_parallel
    return cfg.samples_per_gpu_step * dp / (generation_batch(cfg, dp) * cfg.num_iterations)


def aligned(ctx: PlanContext) -> bool:
    """Whether every generation falls on an optimizer step's boundary (TRL: the accumulation steps a
    multiple of ``steps_per_generation x num_iterations``): the step's batch a multiple of the
    generation batch times ``num_iterations``. Unaligned, the completions may come from an earlier
    policy, and TRL scores them with the policy before training (``old_per_token_logps``)."""
    cfg, dp = ctx.config, ctx.layout.data_parallel
    return cfg.samples_per_gpu_step * dp % (generation_batch(cfg, dp) * cfg.num_iterations) == 0


def scoring_forwards(ctx: PlanContext) -> int:
    """GRPO's no-grad forwards of each micro-batch of completions after their generation
    (``scoring_passes``, the policy's and the reference's together)."""
    return sum(scoring_passes(ctx))


def scoring_passes(ctx: PlanContext) -> tuple[int, int]:
    """GRPO's no-grad forwards of each micro-batch of completions after their generation: (the
    policy's, when vLLM generated them (importance sampling, TRL's default) or the generation is not
    aligned with the optimizer steps (``aligned``); the reference's, when beta is not 0)
    (planner/cost/rollout.py; grpo_trainer.py ``_generate_and_score_completions``)."""
    cfg = ctx.config
    if not grpo(cfg):
        return 0, 0
    return int(cfg.generation in VLLM or not aligned(ctx)), int(cfg.kl_beta > 0)


def scoring_words(ctx: PlanContext) -> str:
    """Which scoring forwards run (``scoring_forwards``), and why."""
    cfg = ctx.config
    words = (["the policy's (vLLM's importance sampling)"] if cfg.generation in VLLM
             else ["the policy's (a generation not aligned with the optimizer steps)"] if not aligned(ctx) else [])
    return " and ".join(words + (["the reference's (beta > 0)"] if cfg.kl_beta > 0 else []))


def _check(ctx: PlanContext, out: Check) -> None:
    cfg = ctx.config
    if cfg.method == Method.SFT:
        return
    for field, allowed, code, why, unmodelled in TRL_ALLOWS:
        value = getattr(cfg, field)
        if field == "fsdp_version" and ctx.engine != "fsdp":
            continue
        if value not in allowed and str(value) not in allowed:
            out.reject(f"{cfg.method} {code}", f"{cfg.method} with {field} {value}: {why}", unmodelled)
            return
    if cfg.batching != Batching.PADDED:
        out.reject(f"{cfg.method} with {cfg.batching} batching", f"{cfg.method} with {cfg.batching} batching: TRL's "
                   f"{TRAINERS[str(cfg.method)]} pads each micro-batch to its longest sequence and never packs; use "
                   "--batching padded")
        return
    if kto(cfg):
        _check_kto(cfg, out)
        return
    if not grpo(cfg):
        return
    if cfg.completion_len >= cfg.seq_len:
        out.reject("grpo completion too long", f"--completion-len {cfg.completion_len:,} leaves no prompt in rows of "
                   f"--seq-len {cfg.seq_len:,} (the longest prompt plus the completion)")
    dp = ctx.layout.data_parallel
    batch = generation_batch(cfg, dp)
    faults = generation_batch_faults(batch, cfg.micro_batch_size, dp, cfg.num_generations)
    if "groups" in faults:
        out.reject("grpo batch not whole groups", f"a generation batch of {batch} completions is not a multiple of "
                   f"--num-generations {cfg.num_generations} (GRPOConfig requires whole groups of one prompt's "
                   "completions)")
    # (a search offers only the micro-batch sizes that divide it (planner/engine/space.py): this
    # answer holds for every size the search's check cache serves it to)
    elif faults:
        out.reject("grpo generation batch not whole micro-batches",
                   f"--generation-batch-size {batch} is not a multiple of micro-batch {cfg.micro_batch_size} x {dp} "
                   "GPUs (GRPOConfig splits it into steps_per_generation micro-batches)")


def _check_kto(cfg, out: Check) -> None:
    if cfg.dpo_reference == DpoReference.NONE:
        out.reject("kto without a reference", "kto with --dpo-reference none: TRL's KTOTrainer has no reference-free "
                   "loss; --dpo-reference model or precomputed")
    # (a search offers only the sizes of at least 2 here (planner/engine/space.py): this answer
    # holds for every size the search's check cache serves it to)
    elif kl_estimate(cfg) and cfg.micro_batch_size < 2:
        out.reject("kto kl with one row", "kto's KL estimate with a micro-batch of 1: TRL's KTOTrainer refuses it (the "
                   "KL term would equal the implied reward); --micro-batch-size 2 or more, or --kto-loss "
                   "apo-zero-unpaired")


def _no_grad_forward(ctx: PlanContext, ledger: LedgerDraft, phases: frozenset, moment: str, what: str) -> None:
    """A forward of the micro-batch under ``no_grad`` through the fused LM head: one decoder layer's
    tensors at most (a layer frees its intermediates as it goes: bounded by what it would save),
    the backbone's output and the fused head's forward (projection buffer, per-token statistics);
    over partitioned parameters, what the forward gathers (``forward_gathered``)."""
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    tokens, c = cfg.tokens_per_micro_batch, lay.dtypes.compute
    layer = activations.total(activations.layer_saved(m, lay.dtypes, lay.fused_attention, cfg.seq_len))
    ledger.add("activations", f"{what}: one decoder layer's tensors (at most its saved list)", layer,
               tokens, phases=phases, moment=moment, note="under no_grad")
    if full_logits(cfg):
        v_t = m.vocab_size * tokens
        ledger.add("logits", f"{what}: its logits, upcast to fp32, and their log-softmax",
                   preference.full_logprobs_forward_bytes(v_t, c, tokens * m.hidden_size * c), 1, phases=phases,
                   moment=moment, note="LLaMA-Factory's concatenated_forward, under no_grad")
        ledger.add("logits", "the policy's fp32 logits and log-softmax output, alive beside it",
                   preference.FULL_LOGPROBS_HELD * v_t, 1, phases=phases, moment=moment,
                   note="returned to the loss, which the reference forward precedes")
    else:
        ledger.add("logits", f"{what}: the fused LM head (projection buffer, per-token statistics)",
                   preference.fused_forward_bytes(tokens, m.hidden_size, c, c) + tokens * m.hidden_size * c, 1,
                   phases=phases, moment=moment, note="and the backbone's output; no logits")
    if gathered := forward_gathered(ctx):
        words = "the whole reference (one FSDP unit)" if gathered == params.total_parameters(m) else "its gathers"
        ledger.add("gathered_parameters", f"{what}: {words}", gathered, lay.gathered_bytes, phases=phases,
                   moment=moment)


def partitioned(ctx: PlanContext) -> bool:
    """Whether the plan's parameters are partitioned (ZeRO-3, FSDP): its extra forwards gather them."""
    from planner.strategies.sharding import sharded_parameters  # (sharding imports the loss, which reads dpo)

    return sharded_parameters(ctx)


def forward_gathered(ctx: PlanContext) -> int:
    """Elements DPO's reference forward or GRPO's scoring forwards hold gathered at their peak: a
    policy forward's (``sharding.forward_gathered``: ZeRO-3's head and prefetch bucket, FSDP2's
    root and layers); a reference model's under ZeRO-3 the same, under FSDP2 all of it (TRL's
    ``prepare_fsdp`` shards it with one ``fully_shard`` of the whole model: one unit, gathered
    whole by its forward). The largest of the forwards that run. Unit: elements."""
    from planner.strategies.sharding import forward_gathered as policy_forward

    if not partitioned(ctx):
        return 0
    policy = policy_forward(ctx)
    if reference_kept(ctx) and ctx.engine == Engine.FSDP:
        return max(policy, params.total_parameters(ctx.model))
    return policy


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The reference model's weights (every phase); DPO's reference forward, a moment of the forward
    phase beside the policy's saved activations; GRPO's scoring forwards, a moment of the rollout."""
    if ctx.config.method == Method.SFT:
        return
    m, lay = ctx.model, ctx.layout
    if reference_kept(ctx):
        shard = partitioned(ctx)
        # LLaMA-Factory (the full-logits trainer) loads it untrainable, in the compute dtype, never
        # upcast (model/adapter.py upcasts trainable parameters only); TRL in the policy's dtype
        dtype = lay.dtypes.compute if full_logits(ctx.config) else lay.weight_bytes
        ledger.add("weights", f"the reference model (frozen copy, {ctx.config.method.upper()})",
                   params.total_parameters(m), dtype,
                   shard=preference.reference_divisor(shard, lay.data_parallel), tag=FROZEN_EVERY_RANK,
                   note="partitioned like the policy (TRL's prepare_deepspeed / prepare_fsdp)" if shard else
                   "whole on every GPU (DeepSpeed runs it at ZeRO stage 0)")
    if reference_forward(ctx):
        what = "reference forwards (the KL batch's, then the batch's)" if kl_estimate(ctx.config) else "reference forward"
        _no_grad_forward(ctx, ledger, frozenset({Phase.FORWARD}), REFERENCE_FORWARD, what)
    elif scoring_forwards(ctx):
        _no_grad_forward(ctx, ledger, frozenset({Phase.ROLLOUT}), SCORING, "scoring forward")


def forward_seconds(ctx: PlanContext, policy: bool = False) -> float:
    """One forward pass of the model over the micro-batch under no_grad (matmuls with the head,
    attention, the elementwise ops; over a QLoRA base, its dequantization too); ``policy``: the
    policy's, through its adapters too (a reference's runs with them disabled). Unit: seconds."""
    # (imported here: the loss strategy, which adapter and checkpointing import, reads ``dpo``)
    from planner.strategies.adapter import adapter_forward_seconds, nf4_dequantize_seconds
    from planner.strategies.checkpointing import layer_saved_bytes

    forward = (rates.layer_matmul_forward_seconds(ctx) + rates.head_matmul_forward_seconds(ctx)
               + rates.attention_forward_seconds(ctx) + rates.elementwise_forward_seconds(ctx, layer_saved_bytes(ctx)))
    spec = ctx.layout.adapter
    if spec is not None and spec.nf4:  # the adapter-disabled 4-bit base dequantizes every weight again
        forward += nf4_dequantize_seconds(ctx)
    return forward + (adapter_forward_seconds(ctx) if policy else 0.0)


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """DPO's reference forward of every micro-batch, after the policy's; KTO's with its KL forwards
    (``no_grad_forwards``); GRPO's scoring forwards of every micro-batch, before training on it
    (serial: nothing overlaps them)."""
    dispatch = ctx.model.num_layers * overheads.layer_forward_dispatch_seconds(ctx.layout.fused_attention)
    from planner.strategies.sharding import model_gather_seconds

    gather = model_gather_seconds(ctx)
    policy, reference = no_grad_forwards(ctx)
    if n := policy + reference:
        method, only_reference = str(ctx.config.method).upper(), not kl_estimate(ctx.config)
        what = "reference forward" if only_reference else f"no-grad forwards, {n} per micro-batch"
        parts = ([] if only_reference else ["the policy's over the KL batch, before its forward"]) + (
            [("the reference's" if only_reference else "the reference's over the KL batch and the batch")
             + ", after the policy's forward"] if reference_forward(ctx) else [])
        seconds = policy * forward_seconds(ctx, policy=True) + reference * forward_seconds(ctx)
        draft.compute("matmul", f"{method} {what}" + (" (no_grad)" if only_reference else ""), seconds, Window.FORWARD,
                      note="every micro-batch: " + "; ".join(parts))
        draft.dispatch(n * dispatch, 0.0)
        if gather:
            draft.overlapped("communication", f"all-gather of the {what}", n * gather, Window.FORWARD, True)
    elif n := scoring_forwards(ctx):
        # (each generation is scored once, micro-batch by micro-batch: num_iterations passes reuse it)
        mu, (policy, reference) = ctx.config.num_iterations, scoring_passes(ctx)
        passes = (policy * max(forward_seconds(ctx, policy=True) + gather, dispatch)
                  + reference * max(forward_seconds(ctx) + gather, dispatch))
        draft.serial("matmul", f"GRPO scoring forwards (no_grad, {n} per micro-batch)", passes / mu,
                     per_micro_batch=True,
                     note=scoring_words(ctx) + (f"; once per {mu} passes" if mu > 1 else "")
                     + ("; each gathers the partitioned model" if gather else ""))


#: DPOConfig, KTOConfig and GRPOConfig keys the emitted Trainer arguments state (no SFT recipe holds them).
EMITTED = ("precompute_ref_log_probs", "f_divergence_type", "num_generations", "max_completion_length", "beta",
           "generation_batch_size", "num_iterations", "loss_type", "desirable_weight", "undesirable_weight")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """A DPO plan's Trainer arguments are a TRL DPOConfig: its own keys (``f_divergence_type``
    reverse_kl: standard DPO, DPOConfig's default), the precomputation and the length. A GRPO
    plan's are a GRPOConfig: the group size, the completion's length and beta."""
    cfg = ctx.config
    if not trl_emittable(cfg):
        raise PlannerInputError(
            f"a plan of DPO with {'full-logits log-probabilities' if full_logits(cfg) else 'no reference'} (as "
            "LLaMA-Factory's trainer runs it) is checked, not emitted: planner's files run TRL's DPOTrainer, "
            "whose fused LM head and reference differ",
            hint="Run the job with llamafactory-cli, or plan it for TRL: --dpo-logprobs fused --dpo-reference model.")
    if dpo(cfg):
        files.training_args["precompute_ref_log_probs"] = cfg.dpo_reference == DpoReference.PRECOMPUTED
        files.training_args["f_divergence_type"] = "reverse_kl"
        files.training_args["max_length"] = cfg.seq_len
    elif kto(cfg):  # (KTOConfig's train_sampling_strategy is sequential, as its KL estimate needs)
        # its default weights, written: the keys only KTOConfig has say the file is KTO's (check reads it back)
        files.training_args |= dict.fromkeys(KTO_ONLY, 1.0)
        files.training_args["precompute_ref_log_probs"] = cfg.dpo_reference == DpoReference.PRECOMPUTED
        files.training_args["loss_type"] = TRL_KTO_LOSS[cfg.kto_loss]
        files.training_args["max_length"] = cfg.seq_len
    elif grpo(cfg):
        files.training_args["num_generations"] = cfg.num_generations
        files.training_args["max_completion_length"] = cfg.completion_len
        files.training_args["beta"] = cfg.kl_beta
        files.training_args["generation_batch_size"] = generation_batch(cfg, ctx.layout.data_parallel)
        files.training_args["num_iterations"] = cfg.num_iterations
    else:
        return
    files.extras.add("trl")


#: KTOConfig's ``loss_type`` for each ``kto_loss``.
TRL_KTO_LOSS = {KtoLoss.KTO: "kto", KtoLoss.APO_ZERO_UNPAIRED: "apo_zero_unpaired"}
#: Keys only TRL's KTOConfig has (planner/core/trl_recipes.py's KTO marker): a recipe holding one is KTO.
KTO_ONLY = ("desirable_weight", "undesirable_weight")


#: Keys only TRL's DPOConfig has (not KTO's, ORPO's or SFT's): a recipe holding one is DPO.
DPO_ONLY = ("f_divergence_type", "use_weighting", "ld_alpha", "discopop_tau", "rpo_alpha", "ref_model_init_kwargs")


def _read(job: JobFiles, r: Reading) -> None:
    """A Trainer/TRL recipe with a key only DPOConfig has is DPO, its reference from
    ``precompute_ref_log_probs``; one with GRPOConfig's keys is GRPO, with its group, lengths and
    beta (planner/core/trl_recipes.py ``grpo_recipe``)."""
    d, where = job.training_args, job.training_args_where
    if not where:
        return
    if grpo_recipe(d):
        _read_grpo(d, where, r)
        return
    if job.framework == "llamafactory" and d.get("stage") == "dpo":
        _read_llamafactory_dpo(d, where, r)
        return
    if any(k in d for k in KTO_ONLY):  # (axolotl's rl kto, translated, writes them: planner/check/frameworks.py)
        _read_kto(d, where, r)
        return
    if job.framework:  # axolotl's rl dpo / ipo, translated (planner/check/frameworks.py)
        said = [f"rl {d['rl']} (TRL's DPOTrainer)"] if d.get("rl") in ("dpo", "ipo") else []
    else:
        said = [f"{k} (a DPOConfig key)" for k in DPO_ONLY if k in d]
    if not said:  # (a framework file of another method, or a TRL recipe of one, is refused: planner/check/methods.py)
        r.set("method", Method.SFT, f"{where}: no DPOConfig key: supervised fine-tuning")
    else:
        r.set("batching", Batching.PADDED, f"{where}: {said[0]}: TRL's preference collator pads each micro-batch "
                                            "of pairs to its longest")
        r.set("method", Method.DPO, f"{where}: {said[0]}")
        r.set("dpo_logprobs", DpoLogprobs.FUSED, f"{where}: {said[0]}: TRL's DPOTrainer computes them with its fused "
                                                 "LM head")
        pre = r.typed(d, "precompute_ref_log_probs", (bool,), where)
        r.set("dpo_reference", DpoReference.PRECOMPUTED if pre else DpoReference.MODEL,
              f"{where}: precompute_ref_log_probs" if pre is not None else
              f"{where}: no precompute_ref_log_probs (DPOConfig's default, false)")


def _read_kto(d: dict, where: str, r: Reading) -> None:
    """A KTOConfig recipe (a key only KTOConfig has): TRL's KTOTrainer, its ``loss_type`` (kto or
    apo_zero_unpaired; KTOConfig's default kto) and ``precompute_ref_log_probs``."""
    said = ("rl kto (TRL's KTOTrainer)" if d.get("rl") == "kto" else
            next(f"{k} (a KTOConfig key)" for k in KTO_ONLY if k in d))
    r.set("method", Method.KTO, f"{where}: {said}")
    r.set("batching", Batching.PADDED, f"{where}: {said}: TRL's unpaired collator pads each micro-batch to its longest")
    loss = d.get("loss_type", "kto")
    by_trl = {v: k for k, v in TRL_KTO_LOSS.items()}
    if loss not in by_trl:
        r.problems.append(f"{where}: loss_type {loss!r}: KTOConfig takes {' or '.join(by_trl)}")
    else:
        r.set("kto_loss", by_trl[loss], f"{where}: loss_type {loss}" if "loss_type" in d
              else f"{where}: no loss_type (KTOConfig's default, kto)")
    pre = r.typed(d, "precompute_ref_log_probs", (bool,), where)
    r.set("dpo_reference", DpoReference.PRECOMPUTED if pre else DpoReference.MODEL,
          f"{where}: precompute_ref_log_probs" if pre is not None else
          f"{where}: no precompute_ref_log_probs (KTOConfig's default, false)")


#: LLaMA-Factory's reference-free ``pref_loss`` values (hparams/finetuning_args.py: use_ref_model is
#: false for them).
REFERENCE_FREE = ("orpo", "simpo")


def _read_llamafactory_dpo(d: dict, where: str, r: Reading) -> None:
    """LLaMA-Factory's ``stage: dpo`` (translated by planner/check/frameworks.py, which keeps
    ``stage`` and ``pref_loss``): its own DPO trainer, log-probabilities from the full logits, a
    reference forward unless the loss is reference-free."""
    r.set("method", Method.DPO, f"{where}: stage dpo (LLaMA-Factory's DPO trainer)")
    r.set("batching", Batching.PADDED, f"{where}: stage dpo: the pairwise collator pads each micro-batch of pairs "
                                        "to its longest")
    r.set("dpo_logprobs", DpoLogprobs.FULL_LOGITS, f"{where}: stage dpo: LLaMA-Factory's trainer takes "
                                                    "log-probabilities from the full fp32 logits")
    loss = d.get("pref_loss", "sigmoid")
    r.set("dpo_reference", DpoReference.NONE if loss in REFERENCE_FREE else DpoReference.MODEL,
          f"{where}: pref_loss {loss}" + (": reference-free" if loss in REFERENCE_FREE else ": a reference forward "
                                          "every step"))


#: GRPOConfig's defaults (TRL 1.16 grpo_config.py) for the keys a plan reads.
GRPO_DEFAULTS = {"num_generations": 8, "max_completion_length": 512, "beta": 0.0}


def _read_grpo(d: dict, where: str, r: Reading) -> None:
    r.set("method", Method.GRPO, f"{where}: GRPOConfig keys")
    r.set("batching", Batching.PADDED, f"{where}: GRPOTrainer pads prompts and completions, never packs")
    for key, field, kinds in (("num_generations", "num_generations", (int,)),
                              ("max_completion_length", "completion_len", (int,)),
                              ("beta", "kl_beta", (int, float))):
        value = r.typed(d, key, kinds, where)
        said = f"{where}: {key}" if value is not None else f"{where}: no {key} (GRPOConfig's default, {GRPO_DEFAULTS[key]})"
        r.set(field, value if value is not None else GRPO_DEFAULTS[key], said)
    _read_generation_batch(d, where, r)
    prompt = r.typed(d, "max_prompt_length", (int,), where)
    completion = d.get("max_completion_length", GRPO_DEFAULTS["max_completion_length"])
    if prompt is not None and isinstance(completion, int):
        r.set("seq_len", prompt + completion, f"{where}: max_prompt_length + max_completion_length")


def pin(ctx: PlanContext) -> dict:
    """A GRPO plan states its generation batch (``generation_batch``) where the request left it to
    TRL's default, the optimizer step's batch."""
    cfg = ctx.config
    if grpo(cfg) and not cfg.generation_batch_size:
        return {"generation_batch_size": generation_batch(cfg, ctx.layout.data_parallel)}
    return {}


def _read_generation_batch(d: dict, where: str, r: Reading) -> None:
    """GRPOConfig's generation batch (``generation_batch_size``, or ``steps_per_generation``, which
    the check resolves with the micro-batch and the GPUs: ``Reading.steps_per_generation``; neither:
    the optimizer step's batch) and ``num_iterations``. Both sizes set is GRPOConfig's error."""
    size = r.typed(d, "generation_batch_size", (int,), where)
    steps = r.typed(d, "steps_per_generation", (int,), where)
    if size is not None and steps is not None:
        r.problems.append(f"{where}: generation_batch_size and steps_per_generation: GRPOConfig takes one of them "
                          "(it raises 'can not be both configured'); remove one")
    elif size is not None:
        r.set("generation_batch_size", size, f"{where}: generation_batch_size")
    elif steps is not None:
        r.steps_per_generation = (steps, f"{where}: steps_per_generation")
    else:
        r.set("generation_batch_size", 0, f"{where}: no generation_batch_size or steps_per_generation (GRPOConfig's "
                                          "default: the optimizer step's batch)")
    mu = r.typed(d, "num_iterations", (int,), where)
    r.set("num_iterations", mu if mu is not None else 1, f"{where}: num_iterations" if mu is not None
          else f"{where}: no num_iterations (GRPOConfig's default, 1)")


def describe(get) -> str:
    """'' for sft (supervised fine-tuning goes without saying in a summary), else the method with
    its reference ("dpo", "dpo precomputed", "grpo G8 c512", "grpo G8 c512 beta 0.04")."""
    method = get("method")
    if method == Method.DPO:
        reference = get("dpo_reference")
        return ("dpo" + (f" {reference}" if reference in (DpoReference.PRECOMPUTED, DpoReference.NONE) else "")
                + (" full-logits" if get("dpo_logprobs") == DpoLogprobs.FULL_LOGITS else ""))
    if method == Method.KTO:
        reference, loss = get("dpo_reference"), get("kto_loss")
        return ("kto" + (" precomputed" if reference == DpoReference.PRECOMPUTED else "")
                + (f" {loss}" if loss == KtoLoss.APO_ZERO_UNPAIRED else ""))
    if method == Method.GRPO:
        beta = get("kl_beta") or 0
        mu = get("num_iterations") or 1
        return (f"grpo G{get('num_generations')} c{get('completion_len')}" + (f" beta {beta:g}" if beta else "")
                + (f" mu {mu}" if mu > 1 else ""))
    return ""


STRATEGY = Strategy(
    "method", Method, Method.SFT, order=8, short="method",
    help="training method: sft (supervised fine-tuning), dpo (TRL's DPOTrainer: chosen and rejected sequences, "
         "a frozen reference), grpo (TRL's GRPOTrainer: completions generated and scored each step) or kto (TRL's "
         "KTOTrainer: unpaired completions, a KL estimate, a reference); named, never searched",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, settings=SETTINGS, describe=describe,
    records=CHOICES, named=True, pin=pin,
)
