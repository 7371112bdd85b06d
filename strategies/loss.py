"""Loss: standard cross-entropy over full fp32 logits, or a chunked fused linear cross-entropy."""

from enum import StrEnum

from planner.core import job as job_module
from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo, Phase
from planner.core.specs import HardwareSpec
from planner.core.timing import TimeDraft, Window
from planner.core.trl_recipes import grpo_recipe
from planner.core.units import DTYPE_BYTES
from planner.core.vocabulary import Setting
from planner.cost import activations, params, preference
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.fsdp_schedule import Instant, gathered_bytes
from planner.strategies.fsdp_units import loss_forward_output, outer_units
from planner.strategies.method import full_logits, fused_head
from planner.strategies.moments import LOSS_MOMENT, ROOT_REGATHER
from planner.strategies.precision import CHOICES as PRECISIONS
from planner.strategies.precision import cache_only_casts


class Loss(StrEnum):
    STANDARD = "standard"
    CHUNKED = "chunked"  # fused/chunked cross-entropy that never holds full fp32 logits


class LossPath(StrEnum):
    """How the model's forward turns the head's output into the standard loss, per transformers
    version (the tensors alive at the loss differ; ``loss_forward_copies``)."""

    PAD_LABELS = "pad-labels"  # transformers >= 4.49: ForCausalLMLoss shifts the labels, not the logits
    SHIFT_LOGITS = "shift-logits"  # 4.46 - 4.48: ForCausalLMLoss copies the shifted fp32 logits
    FP32_LOGITS = "fp32-logits"  # <= 4.45: the model upcasts its logits and returns the fp32 copy


class ModelOutput(StrEnum):
    """What the training loop does with the model's output (its logits) while backward runs."""

    DROPPED = "dropped"  # the Trainer (and TRL's trainers), planner's launch: only the loss is kept
    HELD = "held"  # ``out = model(**batch); out.loss.backward()``: alive until the next call returns


#: The first transformers of each loss path (planner/check reads the installed version): 4.46 moved
#: the upcast into ``loss_utils.ForCausalLMLoss`` and returns the logits in the model's dtype; 4.49
#: pads the labels instead of copying the shifted logits. Read from the releases' modeling_llama.py
#: and loss/loss_utils.py (4.38.2, 4.44.2, 4.45.2, 4.46.3, 4.47.1, 4.48.3, 4.49.0, 4.51.3).
LOSS_PATH_SINCE: tuple[tuple[tuple[int, int], LossPath], ...] = (
    ((4, 49), LossPath.PAD_LABELS), ((4, 46), LossPath.SHIFT_LOGITS), ((0, 0), LossPath.FP32_LOGITS))


def loss_path_of(version: tuple[int, int]) -> LossPath:
    """The loss path of transformers ``version`` (major, minor)."""
    return next(path for since, path in LOSS_PATH_SINCE if version >= since)


#: Every loss value; the chunked one is a kernel library (Liger) beyond torch.
CHOICES: dict[Loss, Choice] = {
    Loss.STANDARD: Choice("cross-entropy over the full fp32 logits"),
    # its chunk is a power of two of tokens (``activations.liger_chunk_tokens``): a staircase
    Loss.CHUNKED: Choice("Liger's fused linear cross-entropy, chunk by chunk: no full logits", complexity=1,
                         convex=False),
}


def head_gradient_moment_bytes(ctx: PlanContext) -> int:
    """Bytes of the output head's weight gradient just after the head's matmul backward.

    The matmul makes the gradient in the compute dtype (V*h*c) in the parameter's own layout
    (torch's mm_mat2_backward follows the weight's strides), so AccumulateGrad keeps it without a
    copy. With torch autocast (fp32 weights) ToCopyBackward then upcasts it to fp32 while the 16-bit
    one is alive: V*h*(c+4). Checked by the traced probe (tests/test_traced.py).
    """
    m, lay = ctx.model, ctx.layout
    vh, c = m.vocab_rows * m.hidden_size, lay.dtypes.compute
    if lay.adapter is not None:  # a frozen head: no weight gradient
        return 0
    return vh * (c + 4) if lay.autocast else vh * c


def head_gradient_bytes_per_element(ctx: PlanContext) -> int:
    """The head's whole gradient once backward has made it: the weight's dtype (FSDP: the unsharded
    parameters' dtype, until the root unit's reduce-scatter); 0 when an adapter trains (the head is
    frozen: its matmul backward makes the input gradient only)."""
    lay = ctx.layout
    if lay.adapter is not None:
        return 0
    return lay.gathered_bytes if ctx.engine == Engine.FSDP else lay.weight_bytes


def loss_forward_copies(c: int, path: LossPath) -> int:
    """Bytes per token and vocabulary entry alive at the standard loss's forward peak, by transformers'
    loss path (``c``: bytes of the head's output, the compute dtype).

    - pad-labels (>= 4.49): the head's logits (c), their fp32 upcast (4) and log_softmax's saved
      output (4): c + 8. ``ForCausalLMLoss`` pads the labels, so no logits copy is shifted.
    - shift-logits (4.46 - 4.48): also ``logits[..., :-1, :].contiguous()``, one more fp32 copy
      alive until the loss returns: c + 12.
    - fp32-logits (<= 4.45): the model rebinds ``logits = logits.float()``, which frees the
      head's output (c + 4 at the upcast), then copies the shifted logits and log_softmax saves its
      output: 4 + 4 + 4 = 12.
    Unit: bytes per (token x V). Assumption: causal-LM heads written like Llama's (every family in
    the catalog). Source: transformers releases 4.44.2, 4.46.3 and 4.49.0, modeling_llama.py
    ``LlamaForCausalLM.forward`` and loss/loss_utils.py ``ForCausalLMLoss``; tests/test_loss_path.py
    measures each op sequence on real CPU tensors.
    """
    if path == LossPath.FP32_LOGITS:
        return max(c + 4, 12)
    return c + (12 if path == LossPath.SHIFT_LOGITS else 8)


def held_output_bytes_per_token(ctx: PlanContext) -> int:
    """Bytes per token of the model output a training loop holds (``--model-output held``): the
    logits it returns, V x the compute dtype (fp32 under the fp32-logits path), alive through
    backward and the optimizer step and, where the loop rebinds ``out = model(...)``, until the next
    forward returns; 0 when the loop drops it (the Trainer's ``compute_loss`` returns the loss
    alone) or the chunked loss returns no logits. Source: transformers Trainer.compute_loss; PEFT
    method_comparison/MetaMathQA/run.py and Answer.AI fsdp_qlora train.py hold ``outputs``."""
    cfg, m = ctx.config, ctx.model
    if cfg.loss != Loss.STANDARD or cfg.model_output != ModelOutput.HELD or fused_head(cfg):
        return 0
    per = activations.FP32 if cfg.loss_path == LossPath.FP32_LOGITS else ctx.layout.dtypes.compute
    return per * m.vocab_size


FUSED_FORWARD = "TRL's fused LM head (forward): projection buffer, per-token statistics, the hidden states' copy"
FUSED_BACKWARD = "TRL's fused LM head (backward): projection buffer, fp32 hidden-state and head gradients"


def fused_head_moments(ctx: PlanContext, cached: int, norm: float, norm_label: str) -> dict[str, float]:
    """DPO's and GRPO's log-probabilities as TRL >= 1.15 computes them, without logits
    (planner/cost/preference.py): the fused head's forward (the projection buffer, the per-token
    statistics and the scored positions' hidden states gathered by the label mask, with the cache-
    only casts and, under autocast, one vocabulary chunk of the head's weight cast to the compute
    dtype) and its backward at the start of backward (the buffer again, the hidden states'
    gradient and, when the head trains, its weight gradient, both accumulated in fp32 and cast
    back to their tensors' dtypes on return: V*h*(4 + w) where the weight is not fp32), then the
    final norm's backward as for the other losses. Unit: bytes."""
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    tokens, c, h = cfg.tokens_per_micro_batch, lay.dtypes.compute, m.hidden_size
    chunk_cast = min(m.vocab_size, preference.VOCAB_CHUNK) * h * c if lay.autocast else 0
    trained = lay.adapter is None
    w = head_gradient_bytes_per_element(ctx)
    head_cast = m.vocab_size * h * w if trained and w != activations.FP32 else 0
    return {
        FUSED_FORWARD: cached + chunk_cast + preference.fused_forward_bytes(tokens, h, c, c),
        FUSED_BACKWARD: chunk_cast + preference.fused_backward_bytes(m, tokens, c, trained) + head_cast + tokens * h * c,
        norm_label: norm,
    }


def loss_moment_bytes(ctx: PlanContext) -> tuple[int, str, int, bool]:
    """The loss's largest moment, bytes, above the saved activations and saved weight casts; its
    label; of those bytes, the FSDP all-gather output held (below); whether the moment is in the
    loss's forward.

    Standard loss (per token: V fp32 elements = 4V bytes; T tokens; hc = the head's autocast cast
    V*h*c, 0 without autocast):
    - end of forward, inside autocast: the casts only the cache holds, hc, and the loss forward
      (``loss_forward_copies`` x V T: (c + 8) V T under transformers >= 4.49); FSDP2:
      also the last layer's all-gather output, held until the root's forward returns
      (``FSDPState._post_forward``; the model computes its loss inside its forward). Resharding,
      the moments below hold one too: the top layer's, all-gathered ahead by the root's
      pre-backward and held until that layer's backward copies it out (traced: Phi-3-mini,
      Mixtral; fsdp-grad-op gathers nothing in backward);
    - start of backward: hc and 12 V T (logits_bytes);
    - the head's backward: hc with the logits gradient and the 16-bit weight gradient
      (c V T + V h c), then the weight gradient's own moment (head_gradient_moment_bytes).
    Chunked loss (Liger): inside autocast, the cache-only casts, hc, one more uncached cast of the
    transposed head weight per chunk matmul (V*h*c), the weight gradient Liger makes in forward
    (V*h, weight dtype) and the chunk (chunked_loss_bytes); FSDP2: the all-gather output too.
    Both: the final norm's backward, with the head's gradient (V*h in the weight's dtype; FSDP: the
    unsharded one) and the norm's temporaries (final_norm_backward_bytes, less what the ledger
    already counts for the final norm). Checked by the traced probe.
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    tokens, c = cfg.tokens_per_micro_batch, lay.dtypes.compute
    vh = m.vocab_rows * m.hidden_size
    # autocast's cast of the head: of the trained fp32 weights; of a k-bit prepared base's fp32 head,
    # frozen, which autocast casts at each use without caching it
    hc = vh * c if lay.autocast or (lay.adapter is not None and lay.adapter.fp32_embeddings) else 0
    cached = cache_only_casts(ctx)
    w = head_gradient_bytes_per_element(ctx)
    norm = vh * w + (activations.final_norm_backward_bytes(m, lay.dtypes) - activations.final_norm_bytes(m, lay.dtypes)) * tokens
    norm_label = "final norm backward: the head's gradient and the norm's fp32 temporaries"
    units, g = outer_units(ctx), lay.gathered_bytes
    output = loss_forward_output(ctx) * g
    prefetch = gathered_bytes(ctx, Instant.LOSS_BACKWARD) if units.loss_backward_prefetch else 0
    held = {True: output + units.loss_held * g, False: prefetch + units.loss_held * g}
    forward = ("chunked loss: one chunk, the head weight gradient made in forward, weight casts",
               "loss forward inside autocast", FUSED_FORWARD)
    if fused_head(cfg):
        moments = fused_head_moments(ctx, cached, norm, norm_label)
    elif cfg.loss == Loss.CHUNKED:
        moments = {
            forward[0]: cached + 2 * hc + vh * w + activations.chunked_loss_bytes(m, lay.dtypes, tokens),
            norm_label: norm,
        }
    else:
        v_t = m.vocab_size * tokens
        softcap = c * v_t if m.final_logit_softcapping else 0
        # a full-logits DPO computes no cross-entropy: its own upcast and log-softmax (preference.py)
        copies = (preference.full_logprobs_forward_bytes(v_t, c, 0) if full_logits(cfg)
                  else loss_forward_copies(c, cfg.loss_path) * v_t)
        moments = {
            forward[1]: cached + hc + copies + softcap,
            "start of backward: fp32 log-softmax output, its gradient and input gradient":
                hc + activations.logits_bytes(m, lay.dtypes) * tokens,
            "head backward: logits gradient and head weight gradient":
                max(hc + c * v_t + (vh * c if lay.adapter is None else 0), head_gradient_moment_bytes(ctx)),
            norm_label: norm,
        }
    # FSDP: the forward's held all-gather output; the backward's, the top layer's prefetched one
    moments = {k: v + held[k in forward] for k, v in moments.items()}
    label = max(moments, key=lambda k: moments[k])
    return int(moments[label]), label, held[label in forward], label in forward


def embedding_backward_bytes(ctx: PlanContext) -> tuple[int, str]:
    """Bytes beyond the finished gradients at the embeddings' backward (phase ``backward_end``), the
    larger of its two moments.

    - ``embedding_dense_backward``: its input, the residual-stream gradient (r*h per token), is
      alive while it makes the embedding's gradient. Untied, that output is the parameter's gradient
      itself; tied, the head's gradient (V*h*g) waits beside it in the autograd input buffer, so
      one more V*h*g.
    - Tied, when the two gradients meet: the engine adds them in place when the waiting one is a
      fresh tensor it alone holds (the autocast upcast; the chunked loss's own buffer), else out of
      place, so the waiting one, the new one and their sum: two more V*h*g
      (torch/csrc/autograd/input_buffer.cpp ``can_accumulate_inplace``).
    Measured on real CPU tensors by the allocator in tests/test_traced.py. Under ZeRO-2/3 the
    embeddings' new gradients are full-size beside the rank's partition (an assumption). With an
    adapter the embeddings are frozen and their input (token ids) needs no gradient: no backward.
    """
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    if ctx.engine == Engine.FSDP:
        return 0, "the root unit's gradients under FSDP (strategies/fsdp_memory.py)"
    if lay.adapter is not None:
        return 0, "no embedding backward: an adapter's frozen embeddings need no gradient"
    vhg = m.vocab_rows * m.hidden_size * lay.grad_bytes if m.tie_word_embeddings else 0
    # ZeRO-2/3 (assumption; DeepSpeed is not traced): the gradients row holds the rank's partition,
    # so the embeddings' new full-size gradients count until DeepSpeed's hooks copy them to buckets
    full = params.late_gradient_parameters(m) * lay.grad_bytes if ctx.layout.gradients_sharded else 0
    moments = {"embedding backward: its input gradient" + (" and the head's waiting gradient" if vhg else ""):
               lay.dtypes.residual * m.hidden_size * cfg.tokens_per_micro_batch + vhg + full}
    if vhg and not (lay.autocast or cfg.loss == Loss.CHUNKED):
        moments["tied embedding: the head's and the embedding's gradients added out of place"] = 2 * vhg
    label = max(moments, key=lambda k: moments[k])
    return int(moments[label]), label


def loss_saved_bytes(ctx: PlanContext) -> int:
    """Bytes the loss keeps from its forward to its backward: the standard loss's fp32 log-softmax
    output (4 V per token; Gemma-2's soft-capping also its tanh output, c V); Liger's gradients
    made in forward, the head's (V*h in the weight's dtype, unsharded under FSDP) and the head
    input's (r*h per token)."""
    m, lay, cfg = ctx.model, ctx.layout, ctx.config
    tokens, vh = cfg.tokens_per_micro_batch, m.vocab_rows * m.hidden_size
    if fused_head(cfg):  # the fused head keeps the scored hidden states' copy and each token's log-normaliser
        return tokens * (m.hidden_size * lay.dtypes.compute + 4)
    if cfg.loss == Loss.CHUNKED:
        return vh * head_gradient_bytes_per_element(ctx) + lay.dtypes.residual * m.hidden_size * tokens
    softcap = lay.dtypes.compute if m.final_logit_softcapping else 0
    return (activations.FP32 + softcap) * m.vocab_size * tokens


def logits_hole_bytes_per_token(ctx: PlanContext) -> int:
    """Bytes per token the caching allocator keeps reserved, unallocated, after the standard loss:
    the head's logits in the compute dtype (V x c), freed once the loss has upcast them to fp32.

    The fp32 copies (upcast, log-softmax) are allocated above the 16-bit block while it is alive,
    so its freed block is a hole the later, differently sized tensors of the step do not fill:
    torch's reserved peak stays one 16-bit logits block above its allocated peak. Unit: bytes per
    token. Assumption: transformers' loss path (``logits.float()`` before cross-entropy, as
    ``ForCausalLMLoss`` does) under expandable segments; none for the chunked loss (no full
    logits) or fp32 compute (the upcast is the same tensor). Source: H100 measurements
    (docs/measured.md), reserved less allocated peak with no checkpointing and no adapter:
    1.03-1.06 GiB over seven Llama-3.2-1B plans (V=128,256, 4,096 tokens: V x 2 B x T = 0.98 GiB)
    and 1.20 / 2.40 GiB for Qwen2.5-0.5B (V=151,936; 4,096 / 8,192 tokens: 1.16 / 2.32 GiB),
    whatever the allocated peak (19.5-32.6 GiB); 0.01 GiB under Liger's chunked loss."""
    c = ctx.layout.dtypes.compute
    if ctx.config.loss != Loss.STANDARD or c >= activations.FP32 or fused_head(ctx.config):
        return 0
    if held_output_bytes_per_token(ctx) and ctx.config.loss_path != LossPath.FP32_LOGITS:
        return 0  # the loop holds the 16-bit logits: not freed, no hole
    return ctx.model.vocab_size * c


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    m, fwd = ctx.model, frozenset({Phase.FORWARD})
    if ctx.layout.resharding:
        # backward starts: the root unit is all-gathered again (its output buffer beside the
        # unsharded parameters, strategies/fsdp_memory.py) while the loss's and the final norm's
        # saved tensors wait
        lay = ctx.layout
        units = outer_units(ctx)
        ledger.add("gathered_parameters", "FSDP root unit: all-gather output for backward (or the kept head unit)",
                   units.regather_output + units.loss_held, lay.gathered_bytes, phases=fwd, moment=ROOT_REGATHER)
        ledger.add("logits", "the loss's tensors saved for backward", loss_saved_bytes(ctx), 1, phases=fwd,
                   moment=ROOT_REGATHER)
        ledger.add("activations", "final norm and head input", activations.final_norm_bytes(m, lay.dtypes),
                   ctx.config.tokens_per_micro_batch, phases=fwd, moment=ROOT_REGATHER)
    end, end_label = embedding_backward_bytes(ctx)
    ledger.add("activations", end_label, end, 1, phases=frozenset({Phase.BACKWARD_END}),
               note="the larger of the embeddings' backward moments")
    hole = logits_hole_bytes_per_token(ctx)
    if hole:
        ledger.add("allocator_reserve", "the 16-bit logits' hole: freed under their fp32 upcast", hole,
                   ctx.config.tokens_per_micro_batch, note="reserved, never reused at the peak (measured)")
    output = held_output_bytes_per_token(ctx)
    if output:
        ledger.add("logits", "the model's output (logits), held by the training loop", output,
                   ctx.config.tokens_per_micro_batch, note="--model-output held: alive through backward and the step")
    moment, label, held, in_forward = loss_moment_bytes(ctx)
    ledger.add("logits", label, moment - held, 1, phases=fwd,
               note=f"the largest of the loss's moments (V={m.vocab_size:,})", moment=LOSS_MOMENT)
    if held:
        what, note = (("the last layer's all-gather output", "held until the root's forward returns") if in_forward
                      else ("the top layer's all-gather output", "prefetched by the root's pre-backward"))
        if outer_units(ctx).loss_held:  # transformers' units (strategies/fsdp_units.py)
            what, note = "the head's unsharded weights and the last all-gather's output", "kept from its forward"
        ledger.add("gathered_parameters", f"FSDP at the loss: {what}", held, 1, phases=fwd, moment=LOSS_MOMENT,
                   note=note)


#: fp32 bytes per token x vocabulary the loss moves: forward upcast and log-softmax (~12V),
#: backward NLL gradient, log-softmax backward and the cast back (~22V). A fused or chunked
#: loss moves about the same bytes (it never keeps them). Assumption, calibrated in issue 7.
LOSS_TRAFFIC_FORWARD_PER_VOCAB = 12
LOSS_TRAFFIC_BACKWARD_PER_VOCAB = 22


def chunked_head_gradient_traffic(ctx: PlanContext) -> tuple[float, int]:
    """(bytes, chunks): what the chunked loss moves to make the head's weight gradient, one
    micro-batch. Liger's fused linear cross-entropy accumulates that gradient chunk by chunk with
    ``torch.addmm(grad_weight, grad_logits_chunk.t(), input_chunk, out=grad_weight)``: each chunk
    reads and writes the whole V x h gradient (in the weight's dtype: fp32 under autocast), so
    2 V h w bytes a chunk, over ceil(T / chunk) chunks of ``liger_chunk_tokens``. 0 bytes when an
    adapter trains (the head is frozen: no weight gradient). Unit: bytes. Source: Liger-Kernel
    0.8.5 ops/fused_linear_cross_entropy.py ``fused_linear_cross_entropy_forward``. Measured on an
    H100 (Llama-3.2-1B, 2 x 2048, bf16-mixed: 32 chunks of 128 tokens, 67 GB, ~24 ms): the chunked
    loss's step 0.156 s against 0.123 s for the standard loss's (benchmarks/results/H100-SXM-80)."""
    w = head_gradient_bytes_per_element(ctx)
    m, tokens = ctx.model, int(rates.tokens(ctx))
    chunks = -(-tokens // activations.liger_chunk_tokens(tokens, m.vocab_size, m.hidden_size))
    return 2.0 * m.vocab_size * m.hidden_size * w * chunks, chunks


#: Bytes per token x vocabulary TRL's fused LM head (DPO, GRPO) moves per compute-dtype byte c: forward, the
#: projection tile written by the matmul and read by the fold (2c); backward, the tile recomputed
#: and read, turned into the logits' gradient in place and read by the two gradient matmuls (~5c).
#: From the kernel's structure (trl/kernels/chunked_logprob.py, TRL 1.16); not measured.
FUSED_TRAFFIC_FORWARD_PER_BYTE, FUSED_TRAFFIC_BACKWARD_PER_BYTE = 2, 5


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    per = ctx.model.vocab_size * rates.tokens(ctx) / rates.bandwidth(ctx)
    if fused_head(ctx.config):  # the fused LM head: no logits; its backward projects the head again
        c = ctx.layout.dtypes.compute
        draft.compute("loss", "TRL's fused LM head: projection tiles (forward)", FUSED_TRAFFIC_FORWARD_PER_BYTE * c * per,
                      Window.FORWARD)
        draft.compute("loss", "TRL's fused LM head: tiles recomputed, gradients (backward)",
                      FUSED_TRAFFIC_BACKWARD_PER_BYTE * c * per + rates.head_matmul_forward_seconds(ctx), Window.BACKWARD)
        return
    draft.compute("loss", "cross-entropy over the vocabulary (forward)", LOSS_TRAFFIC_FORWARD_PER_VOCAB * per, Window.FORWARD)
    draft.compute("loss", "cross-entropy over the vocabulary (backward)", LOSS_TRAFFIC_BACKWARD_PER_VOCAB * per, Window.BACKWARD)
    if ctx.config.loss == Loss.CHUNKED and head_gradient_bytes_per_element(ctx):
        traffic, chunks = chunked_head_gradient_traffic(ctx)
        draft.compute("loss", "chunked loss: the head's weight gradient, read and written per chunk",
                      traffic / rates.bandwidth(ctx), Window.FORWARD, note=f"{chunks:,} chunks (Liger)")


#: Liger's layer kernels, all off: the chunked loss is its fused linear cross-entropy alone. The
#: Trainer's ``use_liger_kernel`` passes ``liger_kernel_config`` to Liger's
#: ``_apply_liger_kernel_to_instance``, which keeps the keys its model's patch function takes; with
#: no config every kernel of that function runs (RoPE, RMSNorm, SwiGLU/GeGLU, LayerNorm), whose
#: saved tensors are not transformers' modules' that planner counts. The fused linear
#: cross-entropy is left to Liger's default (on): TRL's SFTTrainer refuses a config that names it
#: on, and turns it off for its own fused LM head (trl 1.16 ``sft_trainer.py``), which is a chunked
#: loss too. Sources: transformers 5.24 ``integrations/liger.py``, ``training_args.py``
#: (``liger_kernel_config``); Liger-Kernel ``transformers/monkey_patch.py``.
LIGER_LAYER_KERNELS_OFF = {"rope": False, "rms_norm": False, "swiglu": False, "geglu": False, "layer_norm": False,
                           "cross_entropy": False}


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    chunked = ctx.config.loss == Loss.CHUNKED
    files.training_args["use_liger_kernel"] = chunked
    if chunked:
        files.training_args["liger_kernel_config"] = dict(LIGER_LAYER_KERNELS_OFF)
        files.extras.add("liger")


#: TRL's SFTConfig ``loss_type`` values as the loss they hold: "chunked_nll" projects the head in
#: chunks of 256 non-ignored tokens and never holds the full logits (trl/trainer/sft_trainer.py
#: ``_chunked_cross_entropy_loss``), modelled as the chunked loss; "nll" and "dft" go through the
#: model's full logits (the DPO and GRPO losses the key also names are refused: planner/check/methods.py).
TRL_LOSS_TYPES = {"nll": Loss.STANDARD, "dft": Loss.STANDARD, "chunked_nll": Loss.CHUNKED}
#: The first TRL whose SFTConfig defaults ``loss_type`` to "chunked_nll" (unless use_liger_kernel):
#: TRL 1.6 says "The default value of `loss_type` will change from "nll" to "chunked_nll" in TRL
#: 1.7"; 1.7's sft_config.py sets it (option since 1.4, PR #5575).
TRL_CHUNKED_DEFAULT = (1, 7)
#: Keys only TRL's SFTConfig has among the recipes planner reads: such a recipe runs TRL's SFT
#: trainer, whose loss default then depends on the TRL version.
SFT_KEYS = ("dataset_text_field", "packing", "completion_only_loss", "assistant_only_loss", "max_seq_length",
            "padding_free", "loss_type")


#: The Trainer's per_device_eval_batch_size when a recipe leaves it out (transformers
#: TrainingArguments); its eval_strategy values that evaluate while training.
TRAINER_EVAL_BATCH = 8
EVALUATING = ("steps", "epoch")


def _read_evaluation(d: dict, where: str, r: Reading) -> None:
    """Whether the Trainer evaluates while it trains (``eval_strategy``, or transformers 4's
    ``evaluation_strategy``, steps or epoch), and its eval rows per GPU."""
    strategy = d.get("eval_strategy", d.get("evaluation_strategy"))
    if str(strategy).lower() not in EVALUATING:
        return
    rows = r.typed(d, "per_device_eval_batch_size", (int,), where, default=TRAINER_EVAL_BATCH)
    if isinstance(rows, int) and rows >= 1:
        key = "per_device_eval_batch_size" if "per_device_eval_batch_size" in d else "the Trainer's default eval batch"
        r.evaluation = (rows, f"{where}: eval_strategy {strategy}, {key} {rows}")


def evaluation_logits_bytes(model, config, rows: int) -> int:
    """Bytes of the loss at an evaluation micro-batch of ``rows`` x seq_len tokens over the full
    logits: the Trainer's prediction_step runs the model with labels under no_grad, so the loss's
    forward copies (``loss_forward_copies``: (c + 8) V per token under transformers >= 4.49) exist
    at once, as in training. Liger's patched forward (``use_liger_kernel``) computes the fused loss
    only while training and materialises the full logits otherwise, so this holds for the chunked
    loss too; TRL's ``chunked_nll`` chunks whenever labels are given (the caller leaves it out).
    Unit: bytes. Assumption: eval rows as long as the training's (the Trainer pads them alike).
    Source: transformers Trainer.prediction_step; Liger-Kernel transformers/model/llama.py
    ``lce_forward`` ("if in training mode, don't materialize logits"); TRL sft_trainer.py
    ``_patch_chunked_ce_lm_head``."""
    c = DTYPE_BYTES[PRECISIONS[config.precision].compute]
    return loss_forward_copies(c, config.loss_path) * model.vocab_size * rows * config.seq_len


def _read(job: JobFiles, r: Reading) -> None:
    """The Trainer's (and TRL's) use_liger_kernel: Liger's fused linear cross-entropy; TRL SFT's
    loss_type, and its default per TRL version where a Trainer/TRL recipe leaves it out; the loss
    path of the transformers installed here (the job's environment, as for TRL)."""
    tf = job_module.installed_release("transformers")
    if tf is not None and len(tf) == 2:
        r.set("loss_path", loss_path_of((tf[0], tf[1])), f"transformers {tf[0]}.{tf[1]} installed here")
    if not job.training_args_where:
        return
    _read_evaluation(job.training_args, job.training_args_where, r)
    r.set("model_output", ModelOutput.DROPPED, f"the Trainer that runs {job.training_args_where}: its compute_loss keeps "
                                               "the loss alone")
    d, where = job.training_args, job.training_args_where
    if grpo_recipe(d):  # GRPOTrainer turns Liger's fused linear cross-entropy off for its own fused head
        r.set("loss", Loss.STANDARD, f"{where}: a GRPO recipe: TRL's fused LM head"
              + (" (GRPOTrainer turns use_liger_kernel's fused linear cross-entropy off)" if d.get("use_liger_kernel")
                 else ""))
        return
    liger = r.typed(d, "use_liger_kernel", (bool,), where)
    if liger is not None:
        kernels = r.section(d, "liger_kernel_config", where) if liger else {}
        fused = kernels.get("fused_linear_cross_entropy", True) is not False
        r.set("loss", Loss.CHUNKED if liger and fused else Loss.STANDARD,
              f"{where}: use_liger_kernel" + ("" if fused else " with liger_kernel_config fused_linear_cross_entropy false"))
        if on := [k for k in LIGER_LAYER_KERNELS_OFF if k != "cross_entropy" and kernels.get(k, True) is not False]:
            r.warnings.append(f"{where}: use_liger_kernel also runs Liger's layer kernels where the model has them "
                              f"({', '.join(on)} unless liger_kernel_config turns them off); planner counts "
                              "transformers' own modules, which hold more: the activations are an upper bound")
    if "loss_type" in d:
        # (DPO's and GRPO's configs use the key for their own losses, "sigmoid", "dr_grpo", ...: check
        # refuses those recipes before this reader, planner/check/methods.py)
        kind = TRL_LOSS_TYPES.get(str(d["loss_type"]), Loss.STANDARD)
        if kind == Loss.CHUNKED and liger:
            r.problems.append(f"contradiction: {where} sets loss_type chunked_nll with use_liger_kernel "
                              "(TRL refuses the two together)")
        else:
            r.set("loss", kind, f"{where}: loss_type {d['loss_type']}")
        return
    if liger is not None or not any(k in d for k in SFT_KEYS) or job.framework:
        # LLaMA-Factory and axolotl train SFT with transformers' Trainer (LLaMA-Factory's
        # CustomSeq2SeqTrainer, axolotl's AxolotlTrainer), not TRL's SFTTrainer: TRL's default
        # loss_type is not theirs
        return
    trl = job_module.installed_release("trl")
    if trl is not None and trl >= TRL_CHUNKED_DEFAULT:
        r.set("loss", Loss.CHUNKED, f"{where}: TRL {'.'.join(map(str, trl))}'s SFT default loss_type chunked_nll")
    elif trl is None:
        r.warnings.append(f"{where}: no loss_type: TRL >= 1.7's SFT trainer computes the loss in chunks by default "
                          "(chunked_nll), older ones over the full logits; TRL is not installed here, so the "
                          "standard loss is planned (the larger); set loss_type in the recipe to plan the other")


def _check(ctx: PlanContext, out: Check) -> None:
    """Say when the standard loss is planned as an older transformers or a loop holding the output
    runs it: the files planner writes run neither (the Trainer or planner's launch, transformers of
    the ``train`` extra), so their run holds less than this plan."""
    cfg = ctx.config
    if cfg.loss == Loss.STANDARD and (cfg.loss_path != LossPath.PAD_LABELS or cfg.model_output != ModelOutput.DROPPED):
        out.warnings.append(f"the loss is planned as {describe(lambda k: getattr(cfg, k))}: your script's transformers "
                            "and loop; the launch files planner writes drop the output and run transformers >= 4.49 "
                            "(pad-labels), which hold less")


def _savers(c, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    return [("loss standard -> chunked", {"loss": Loss.CHUNKED})] if c.loss == Loss.STANDARD else []


_STANDARD = (str(Loss.STANDARD),)
SETTINGS = (
    Setting("loss_path", LossPath, LossPath.PAD_LABELS,
            "the standard loss as your transformers computes it: pad-labels (>= 4.49), shift-logits "
            "(4.46-4.48: one more fp32 copy), fp32-logits (<= 4.45: the model returns fp32 logits)",
            used_at=_STANDARD),
    Setting("model_output", ModelOutput, ModelOutput.DROPPED,
            "the model's output (its logits) during backward: dropped (the Trainer, TRL, planner's launch) or "
            "held (a loop that keeps `outputs` while it calls backward)", used_at=_STANDARD),
)


def describe(get) -> str:
    """The loss, with the settings that differ from today's Trainer ("standard (fp32-logits, output
    held)")."""
    loss = get("loss")
    extra = [str(get("loss_path"))] if str(get("loss_path") or LossPath.PAD_LABELS) != LossPath.PAD_LABELS else []
    extra += ["output held"] if str(get("model_output") or ModelOutput.DROPPED) == ModelOutput.HELD else []
    return f"{loss} ({', '.join(extra)})" if extra and str(loss) == Loss.STANDARD else str(loss)


STRATEGY = Strategy(
    "loss", Loss, Loss.STANDARD, order=5, short="loss",
    help="the loss: standard cross-entropy over fp32 logits, or chunked (Liger's fused linear cross-entropy)",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, savers=_savers, runtime="planner.runtime.loss",
    records=CHOICES, settings=SETTINGS, describe=describe,
)
