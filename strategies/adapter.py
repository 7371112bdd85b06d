"""Adapters: train low-rank adapters on a frozen base model instead of the model itself.

- none: full fine-tuning (every parameter trained).
- lora: peft LoRA (Hu et al. 2021, arXiv:2106.09685): each wrapped weight W (out, in) gains
  trainable A (r, in) and B (out, r); the output is W x + (alpha / r) B A dropout(x).
- qlora: LoRA over a base whose decoder-layer linears are stored in NF4 with double quantization
  (Dettmers et al. 2023, arXiv:2305.14314; bitsandbytes ``Linear4bit``), computed in 16 bit.
- dora: LoRA with a trained magnitude per output row (Liu et al. 2024, arXiv:2402.09353; peft
  ``use_dora``).
- lora-int8: LoRA over a base whose decoder-layer linears are stored in int8 with a scale per row
  (LLM.int8(), Dettmers et al. 2022, arXiv:2208.07339; transformers ``load_in_8bit``, bitsandbytes
  ``Linear8bitLt``), computed as int8 matmuls with fp16 outliers and dequantized in backward.

What the memory model counts (the rules live in planner/cost/adapters.py): the frozen base in the
load dtype (16 bit under the mixed precisions and bf16-pure, fp32 under fp32; QLoRA: NF4 plus 16-bit
embeddings, norms and head), the adapters' weights, gradients and optimizer states in their own
dtype (fp32 under the mixed precisions: peft's ``autocast_adapter_dtype``), their autocast casts,
the activations a LoRA layer keeps (``adapter_layer_saved``), QLoRA's dequantized weight and DoRA's
weight-norm work per wrapped weight; LLM.int8()'s int8 weights with their row scales, the inputs
its matmuls keep for backward, their forward temporaries and the weight dequantized in backward.
Step time: the frozen matmuls' forward and input gradients (no weight gradients), the adapters'
matmuls (``adapter_matmul_flops_per_token``), QLoRA's dequantization and LLM.int8()'s quantize /
dequantize passes (memory bound; its int8 matmuls are timed at the 16-bit rate, which bitsandbytes'
outlier decomposition does not beat: uncalibrated, no GPU measurement yet).

Modelled for dense models on one GPU, under DDP, DeepSpeed ZeRO-1/2/3 and FSDP (the sharding
strategy divides the frozen base and the adapters' states as each engine does: ZeRO-3 and FSDP
shard and gather the frozen base too, and reduce only the adapters' gradients; FSDP-QLoRA and
ZeRO-3 QLoRA keep the NF4 codes in the 16-bit quant storage the engine shards, the quantization
state whole on every rank; under ZeRO-3 each GPU first loads the whole 4-bit base, which the
allocator keeps cached: ``whole_load_bytes``).
FSDP's CPU offload (optimizer+params) puts every sharded row on the host, the frozen base's
included, as ``fsdp_offload_params`` does (Answer.AI's FSDP-QLoRA trains Llama-2-70B so on two
24 GB GPUs); strategies/offload.py times its copies from those rows and steps only the adapters.
Refused with a reason until they are modelled: an int8 base under ZeRO-3 or FSDP
(FSDP cannot shard bitsandbytes' ``Int8Params``), MoE experts, selective checkpointing, offload
under DeepSpeed.
An adapter is a different training method (numerics: DESIGN.md), so the search uses one only when
the user names it (``--adapter lora``, or ``--adapter any``).
"""

from dataclasses import dataclass
from enum import StrEnum

from planner.core import job as job_module
from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo, Phase
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import Setting
from planner.cost import activations, adapters, compute, overheads, params
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy
from planner.strategies.moments import FROZEN_BASE, FROZEN_EVERY_RANK, LAST_LAYER_FORWARD
from planner.strategies.precision import load_dtype
from planner.strategies.sharding import engine_of


class Adapter(StrEnum):
    NONE = "none"
    LORA = "lora"
    QLORA = "qlora"
    DORA = "dora"
    LORA_INT8 = "lora-int8"


@dataclass(frozen=True)
class AdapterChoice(Choice):
    """One adapter value: the LoRA adapters it trains over a frozen base (``trains``), the base's
    quantization (``nf4``: QLoRA's NF4 with double quantization; ``int8``: LLM.int8()) and DoRA's
    magnitudes (``dora``)."""

    trains: bool
    nf4: bool = False
    int8: bool = False
    dora: bool = False


#: The allocator reserve an adapter adds (``Choice.reserve``): many small adapter tensors beside the
#: frozen base. Reserved less allocated peak, less the loss's logits hole and the base reserve, was
#: 2.1 % (LoRA) and 2.4 % (QLoRA) of the allocated peak on an H100 (Llama-3.2-1B, 2 x 2048, no
#: checkpointing; docs/measured.md); DoRA and LoRA over int8 take LoRA's (not measured).
RESERVE = 0.025
#: Every adapter value. A different training method from full fine-tuning, so searched only when
#: asked (--adapter any). The adapters are peft's, built by the runtime (runtime.json ``lora``).
CHOICES: dict[Adapter, AdapterChoice] = {
    Adapter.NONE: AdapterChoice("full fine-tuning: every parameter trains", False),
    Adapter.LORA: AdapterChoice("LoRA over the 16-bit base", True, reserve=RESERVE, runtime_only=True, searched=False),
    Adapter.QLORA: AdapterChoice("LoRA over an NF4 base (bitsandbytes)", True, nf4=True, complexity=1, reserve=RESERVE,
                                 runtime_only=True, searched=False),
    Adapter.DORA: AdapterChoice("LoRA with learned magnitudes (peft DoRA)", True, dora=True, complexity=1,
                                reserve=RESERVE, runtime_only=True, searched=False),
    Adapter.LORA_INT8: AdapterChoice("LoRA over an LLM.int8() base (bitsandbytes)", True, int8=True, complexity=1,
                                     reserve=RESERVE, runtime_only=True, searched=False),
}


class LoraTargets(StrEnum):
    ALL_LINEAR = adapters.ALL_LINEAR
    ATTENTION = adapters.ATTENTION
    QV = adapters.QV
    MLP = adapters.MLP


class AdapterDtype(StrEnum):
    """The adapters' parameter dtype: ``auto`` is planner's layout (fp32 under the mixed
    precisions, the weights' 16 bit under bf16-pure, as planner's launch builds them); ``fp32``
    under bf16-pure is peft's default ``autocast_adapter_dtype=True`` with no autocast (peft >=
    0.12): fp32 adapters over the 16-bit base, each wrapped matmul casting its input to fp32."""

    AUTO = "auto"
    FP32 = "fp32"


class Nf4Matmul(StrEnum):
    """What bitsandbytes' 4-bit matmul (``MatMul4Bit``) keeps for backward, per release
    (planner.cost.adapters ``NF4_FREES_INPUT_SINCE``): the packed weight alone from 0.43.2 (what
    planner's launch installs), its input too before."""

    FREES_INPUT = "frees-input"
    KEEPS_INPUT = "keeps-input"


class KbitPrep(StrEnum):
    """How the quantized base is prepared before peft wraps it: ``none`` (planner's launch: every
    unquantized parameter in the 16-bit load dtype); ``fp32-norms``: peft's
    ``prepare_model_for_kbit_training`` with the embeddings and head cast back to 16 bit (TRL up
    to 0.25 under ``bf16``: ``peft_module_casting_to_bf16``), its norms and biases fp32; ``fp32``:
    peft's preparation as it leaves it, the embeddings and head fp32 too (planner.cost.adapters
    ``kbit_prepared_fp32_elements``). Its fp32 norms make the residual stream, the norms' outputs
    and the projections' outputs fp32 (``adapter_layer_saved``'s ``prepared``)."""

    NONE = "none"
    FP32_NORMS = "fp32-norms"
    FP32 = "fp32"


#: TRL's defaults (trl ModelConfig: lora_r 16, lora_alpha 32, lora_dropout 0.05).
SETTINGS = (
    Setting("lora_rank", int, 16, "LoRA rank r of every adapter", ge=1, le=4096),
    Setting("lora_targets", LoraTargets, LoraTargets.ALL_LINEAR,
            "the weights LoRA wraps: all-linear (every decoder-layer linear), attention (q, k, v, o), qv "
            "(q and v: peft's default on Llama, Mistral, Qwen and Gemma) or mlp (the MLP's projections)"),
    Setting("lora_alpha", int, 32, "LoRA alpha: the update is scaled by alpha / r", ge=1, le=1_000_000),
    Setting("lora_dropout", float, 0.05, "dropout on each adapter's input (0: none, and less memory)", ge=0.0, le=0.9),
    Setting("adapter_dtype", AdapterDtype, AdapterDtype.AUTO,
            "the adapters' dtype under bf16-pure: auto (16 bit, as planner's launch builds them) or fp32 (peft's "
            "default autocast_adapter_dtype: fp32 adapters, each casting its input to fp32)", used_at=("lora",)),
    Setting("nf4_matmul", Nf4Matmul, Nf4Matmul.FREES_INPUT,
            "what QLoRA's 4-bit matmuls keep for backward: frees-input (bitsandbytes >= 0.43.2) or keeps-input "
            "(older: each matmul's input too, out of a non-reentrant checkpoint's reach)", used_at=("qlora",)),
    Setting("kbit_prep", KbitPrep, KbitPrep.NONE,
            "peft's prepare_model_for_kbit_training on the 4-bit base: none (planner's launch), fp32-norms (TRL <= 0.25 "
            "under bf16: fp32 norms, an fp32 residual stream) or fp32 (embeddings and head fp32 too)",
            used_at=("qlora",)),
)
FORWARD_AND_BACKWARD = frozenset({Phase.FORWARD, Phase.BACKWARD})
#: The ledger row of QLoRA's dequantized weight (bitsandbytes does not run on fake tensors, so a
#: traced comparison leaves it out: probes/compare.py).
NF4_DEQUANTIZED = "QLoRA: one weight dequantized to 16 bit"
#: The ledger rows of LLM.int8()'s transients (bitsandbytes does not run on fake tensors either).
INT8_DEQUANTIZED = "LLM.int8(): one weight dequantized to 16 bit (backward)"
INT8_TEMPORARIES = "LLM.int8(): one matmul's int8 input, int32 product and fp16 output"


#: The other techniques' values an adapter plan may take: field -> (allowed values, rejection code,
#: why). The check refuses the rest; a search for adapter plans only (suggest's one-line adapter
#: option) narrows its space to them.
ALLOWS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "offload": (("none", "optimizer+params"), "adapter with offload",
                "use offload none, or optimizer+params with fsdp (the adapters' states are small; the frozen base is "
                "what takes the memory, and FSDP's CPU offload keeps its shard on the host)"),
    "checkpointing": (("none", "full"), "adapter with selective checkpointing",
                      "which outputs the per-op policy keeps around the adapters' matmuls is not modelled yet; use "
                      "checkpointing none or full"),
    "precision": (("fp32", "fp16-mixed", "bf16-mixed", "bf16-pure"), "adapter with fp8",
                  "torchao's Float8Linear and peft's LoRA layers do not wrap each other; use bf16-mixed"),
}


def spec_of(config) -> adapters.AdapterSpec | None:
    """The adapter ``config`` trains (None: full fine-tuning)."""
    choice = CHOICES[config.adapter]
    if not choice.trains:
        return None
    return adapters.AdapterSpec(targets=str(config.lora_targets), rank=config.lora_rank, dropout=config.lora_dropout,
                                dora=choice.dora, nf4=choice.nf4, int8=choice.int8,
                                nf4_keeps_input=choice.nf4 and config.nf4_matmul == Nf4Matmul.KEEPS_INPUT,
                                fp32_norms=choice.nf4 and config.kbit_prep != KbitPrep.NONE,
                                fp32_embeddings=choice.nf4 and config.kbit_prep == KbitPrep.FP32)


def _storage(ctx: PlanContext, decided: dict) -> dict:
    """What is trained: the whole model, or the adapter's tensors on the whole base frozen
    (LayerNorm biases included: peft's ``bias="none"``); per decoder layer, what has gradients and
    what a sharded engine gathers (the layer's weights and its adapters)."""
    spec, m = spec_of(ctx.config), ctx.model
    layer = params.layer_parameters(m)
    if spec is None:
        return {"frozen_parameters": 0, "adapter": None, "layer_trained": layer, "layer_gathered": layer,
                "root_trained": params.root_parameters(m)}
    per_layer, trained = adapters.trained_elements(m, spec)  # (adapters live in the decoder layers only)
    gathered = layer + per_layer
    if spec.nf4:  # FSDP-QLoRA gathers the packed NF4 codes in their 16-bit storage dtype
        gathered -= adapters.nf4_packing_saving(m, DTYPE_BYTES[compute_dtype(ctx.config)])
    return {"trainable_parameters": trained, "frozen_parameters": params.total_parameters(m), "adapter": spec,
            "layer_trained": per_layer, "layer_gathered": gathered, "root_trained": 0}


def _check(ctx: PlanContext, out: Check) -> None:
    a, cfg, m = ctx.config.adapter, ctx.config, ctx.model
    if a == Adapter.NONE:
        return
    for field, (allowed, code, why) in ALLOWS.items():
        if str(getattr(cfg, field)) not in allowed:
            out.reject(code, f"{a} with {field} {getattr(cfg, field)}: {why}")
    if a == Adapter.LORA_INT8 and cfg.precision == "bf16-pure":
        out.reject("lora-int8 with bf16-pure",
                   "lora-int8 with precision bf16-pure: peft keeps adapters over an int8 base in fp32 and, without "
                   "autocast, casts each one's input to fp32, which is not modelled; use bf16-mixed")
    if cfg.adapter_dtype == AdapterDtype.FP32 and cfg.precision == "bf16-pure" and (
            a != Adapter.LORA or ctx.engine == Engine.DEEPSPEED):
        out.reject("fp32 adapters under bf16-pure", f"{a} with adapter dtype fp32 under bf16-pure and {cfg.sharding}: "
                   "modelled for lora on torch or FSDP (DeepSpeed casts every parameter to 16 bit; a quantized base's or "
                   "DoRA's fp32 casts are not modelled); use adapter dtype auto, or bf16-mixed")
    if a == Adapter.LORA_INT8 and (ctx.engine == Engine.FSDP or cfg.sharding == "zero3"):
        out.reject("lora-int8 under a sharded engine",
                   f"lora-int8 with sharding {cfg.sharding}: FSDP cannot shard bitsandbytes' int8 weights and an int8 "
                   "base partitioned by ZeRO-3 is not modelled; use ddp or zero1/zero2, or qlora under fsdp or zero3")
    if cfg.offload != "none" and ctx.engine != Engine.FSDP:
        out.reject("adapter with offload", f"{a} with offload {cfg.offload} under {cfg.sharding}: DeepSpeed's offload "
                   "of a frozen base is not modelled yet; use offload optimizer+params with fsdp, or offload none")
    if m.is_moe:
        out.reject("adapter on a MoE model",
                   f"{a} on {m.id}: adapters on MoE experts (peft's ParamWrapper) are not modelled yet; "
                   "fine-tune it in full, or pick a dense model")
    if not adapters.supports(m, str(cfg.lora_targets)) and cfg.lora_targets == LoraTargets.QV:
        out.reject("lora targets qv on a fused qkv",
                   f"lora targets qv on {m.id}: its q, k and v are one matmul ({FUSED_QKV.get(m.family, 'qkv_proj')}), "
                   "which peft wraps whole; use lora targets attention (the fused qkv and the output) or all-linear")
        return
    # (the layout's counts, from the fields that decide them: the rule is remembered by what it reads)
    spec = spec_of(cfg)
    n, base = adapters.trained_elements(m, spec)[1], params.total_parameters(m)
    out.warnings.append(f"{a} trains {n:,} adapter parameters ({n / base:.2%} of {base:,}) on the frozen base: a "
                        "different method from full fine-tuning (its learning rate is typically 10x higher)")
    if cfg.checkpointing == "full" and cfg.checkpoint_impl == "non-reentrant" and spec and spec.base_keeps_inputs:
        c = DTYPE_BYTES[compute_dtype(cfg)]  # (the base's load dtype: its activations')
        kb = adapters.kept_input_bytes(m, activations.DTypes(c, c)) * m.num_layers / 1024
        out.warnings.append(f"{a}'s bitsandbytes matmuls keep their inputs out of the non-reentrant checkpoint's reach: "
                            f"every layer holds them until its backward ({kb:,.0f} KiB a token); --checkpoint-impl "
                            "reentrant keeps them for the recomputed layer only")
    if a == Adapter.QLORA and cfg.kbit_prep != KbitPrep.NONE:
        _check_kbit_prep(ctx, out)
    if cfg.lora_dropout > 0 and cfg.checkpointing == "none":
        out.warnings.append(f"lora_dropout {cfg.lora_dropout:g} keeps a mask and a dropped copy of the input of every "
                            "wrapped matmul until backward (no checkpointing); --lora-dropout 0 saves that memory")
    if a == Adapter.QLORA:
        out.warnings.append("qlora computes with the base's NF4-quantized weights (dequantized to 16 bit per "
                            "matmul): the forward is an approximation of the 16-bit model's")
        if cfg.nf4_matmul == Nf4Matmul.KEEPS_INPUT:
            out.warnings.append("bitsandbytes before 0.43.2 keeps each 4-bit matmul's input until its backward (planned "
                                "so); 0.43.2 and later free it: upgrade bitsandbytes")
    if a == Adapter.LORA_INT8:
        out.warnings.append("lora-int8 computes the base's matmuls in int8 (LLM.int8(): inputs cast to fp16 and "
                            "quantized per row, outlier features in fp16): an approximation of the 16-bit model's "
                            "forward; its speed is uncalibrated (the int8 matmuls are timed at the 16-bit rate)")


def _check_kbit_prep(ctx: PlanContext, out: Check) -> None:
    """Where a k-bit prepared base is modelled: a Llama-style dense layer
    (``kbit_prep_supported``), under autocast (bf16-mixed, fp16-mixed; without it the fp32 norm
    outputs would run the attention and the adapters in fp32), fused attention (eager attention's
    softmax follows the fp32 query), one GPU or DDP (a sharded engine's flat parameters would mix
    the dtypes; TRL and axolotl skip the preparation of a sharded base)."""
    cfg, m, why = ctx.config, ctx.model, []
    if reason := adapters.kbit_prep_supported(m):
        why.append(reason)
    if cfg.precision not in ("bf16-mixed", "fp16-mixed"):
        why.append(f"precision {cfg.precision} runs it without autocast, whose fp32 attention is not modelled; "
                   "use bf16-mixed")
    if not ctx.layout.fused_attention:
        why.append(f"attention {cfg.attention}: eager attention's softmax follows the fp32 query, not modelled; use sdpa")
    if ctx.engine != Engine.TORCH:
        why.append(f"sharding {cfg.sharding}: a prepared base under a sharded engine is not modelled (TRL and axolotl "
                   "do not prepare a sharded one); use one GPU or ddp, or kbit prep none")
    if why:
        out.reject("kbit prep not modelled", f"qlora with kbit prep {cfg.kbit_prep}: " + "; ".join(why))
        return
    out.warnings.append(f"kbit prep {cfg.kbit_prep}: peft's prepare_model_for_kbit_training leaves the norms fp32, so "
                        "the residual stream, the norms' and the MLP's projections' outputs are fp32 (planned so); "
                        "planner's own launch does not prepare the base: --kbit-prep none saves that memory")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The frozen base's weights; the adapters' autocast casts; QLoRA's and DoRA's per-weight
    transients (the adapters' weights, gradients and states are the precision and optimizer
    strategies' rows, over the layout's trainable parameters)."""
    spec, lay, m = ctx.layout.adapter, ctx.layout, ctx.model
    if spec is None:
        return
    wdt = {4: "fp32", 2: "16-bit"}[lay.frozen_bytes]
    place = lay.placement("weights")
    # FSDP2 and ZeRO-3 shard the codes (in the 16-bit quant storage); the state is every rank's
    if spec.nf4 and (ctx.engine == Engine.FSDP or ctx.config.sharding == "zero3"):
        c = lay.dtypes.compute
        codes, state = adapters.nf4_stored_parts(m, c)
        _, rest = adapters.qlora_weight_parts(m, True)
        ledger.add("weights", "frozen decoder linears: NF4 codes (16-bit quant storage)", codes, c, tag=FROZEN_BASE, place=place,
                   note="4 bits per weight, viewed as the 16-bit storage dtype the engine shards")
        ledger.add("weights", "frozen decoder linears: NF4 quantization state", state, 1, tag=FROZEN_EVERY_RANK,
                   place=place.replicated,
                   note="8-bit absmax per 64 + fp32 per 256 blocks: module attributes, not sharded")
        ledger.add("weights", f"frozen embeddings, norms, head ({wdt})", rest, lay.frozen_bytes, tag=FROZEN_BASE, place=place,
                   note=f"{rest:,} params x {lay.frozen_bytes} B")
    elif spec.nf4 or spec.int8:
        packed, rest = adapters.quantized_weight_parts(m, spec)
        what, note = (("int8, fp32 scale per row", "1 B per weight + 4 B per output row") if spec.int8 else
                      ("NF4, double quantization", "4 bits + 8-bit absmax per 64 + fp32 per 256 blocks"))
        ledger.add("weights", f"frozen decoder linears ({what})", packed, 1, tag=FROZEN_BASE, place=place, note=note)
        fp32 = adapters.kbit_prepared_fp32_elements(m, spec)
        if rest - fp32:
            ledger.add("weights", f"frozen embeddings, norms, head ({wdt})" if not fp32 else
                       f"frozen embeddings and head ({wdt})", rest - fp32, lay.frozen_bytes, tag=FROZEN_BASE,
                       place=place, note=f"{rest - fp32:,} params x {lay.frozen_bytes} B")
        if fp32:
            what = "embeddings, norms, head" if spec.fp32_embeddings else "norms and biases"
            ledger.add("weights", f"frozen {what} (fp32: kbit prep)", fp32, 4, tag=FROZEN_BASE, place=place,
                       note=f"{fp32:,} params x 4 B (peft's prepare_model_for_kbit_training)")
    else:
        ledger.add("weights", f"frozen base weights ({wdt})", lay.frozen_parameters, lay.frozen_bytes, tag=FROZEN_BASE,
                   place=place,
                   note=f"{lay.frozen_parameters:,} params x {lay.frozen_bytes} B")
    c = lay.dtypes.compute
    if lay.weight_bytes != c:  # fp32 adapters under autocast: their 16-bit casts, cached and saved
        ledger.add("autocast_weight_copies", "autocast casts of the adapters' weights", lay.trainable_parameters, c,
                   phases=FORWARD_AND_BACKWARD, note="torch.amp casts of the fp32 adapters")
    wrapped = adapters.wrapped(m, spec.targets)
    largest = max((t.numel for t in adapters.layer_quantized(m)), default=0)  # the widest weight bitsandbytes dequantizes
    if spec.nf4:
        ledger.add("autocast_weight_copies", NF4_DEQUANTIZED, largest, c,
                   phases=FORWARD_AND_BACKWARD, note="bitsandbytes dequantizes per matmul, forward and backward")
    if spec.int8:
        ledger.add("autocast_weight_copies", INT8_DEQUANTIZED, largest, c, phases=frozenset({Phase.BACKWARD}),
                   note="CB.to(dtype) * SCB / 127 per matmul's input gradient")
        ledger.add("activations", INT8_TEMPORARIES, adapters.int8_forward_temporaries(m), ctx.config.tokens_per_micro_batch,
                   phases=frozenset({Phase.FORWARD}), moment=LAST_LAYER_FORWARD,
                   note="the widest quantized matmul, at the top layer's forward")
    if spec.dora:
        work = max(dora_norm_bytes(t.shape, lay.weight_bytes, c) for t in wrapped)
        ledger.add("autocast_weight_copies", "DoRA: one weight's norm work", work, 1, phases=FORWARD_AND_BACKWARD,
                   note="identity, B A, the weight and W + s B A, per wrapped weight")


def whole_load_bytes(ctx: PlanContext) -> int:
    """Bytes of the frozen base each GPU holds whole while the model loads, before the engine
    shards it, where that exceeds its training share: a 4-bit base under DeepSpeed ZeRO-3.
    transformers builds a quantized model without ``deepspeed.zero.Init`` (modeling_utils: ``if
    is_deepspeed_zero3_enabled() and not is_quantized``) and its bitsandbytes quantizer places an
    unmapped model on the current GPU (``update_device_map``), so every rank loads the whole NF4
    base (codes in the 16-bit quant storage, their quantization state, the embeddings, norms and
    head in 16 bit) before DeepSpeed partitions it; the allocator keeps those blocks cached.
    A test loads a tiny NF4 model under a ZeRO-3 config on the CPU: nothing is partitioned. 0
    elsewhere (FSDP-QLoRA loads on the host and broadcasts per unit; one GPU and DDP train the
    whole base anyway)."""
    spec = ctx.layout.adapter
    if spec is None or not spec.nf4 or ctx.config.sharding != "zero3":
        return 0
    c = ctx.layout.dtypes.compute
    codes, state = adapters.nf4_stored_parts(ctx.model, c)
    _, rest = adapters.qlora_weight_parts(ctx.model, True)
    return codes * c + state + rest * ctx.layout.frozen_bytes


def dora_norm_bytes(shape: tuple[int, ...], adapter_bytes: int, compute_bytes: int) -> int:
    """Bytes peft's DoRA holds at once computing one wrapped weight's norm in a training forward
    (peft 0.21 ``DoraLinearLayer``: ``get_lora_weight`` multiplies an (in, in) identity in the
    adapters' dtype through A and B, giving B A (out, in) in the compute dtype; the base weight is
    cast to the input's dtype (the adapters' under peft's input cast); ``get_weight_norm`` forms
    W + s B A). Unit: bytes; assumption: the identity, B A, the cast weight and the sum coexist."""
    d_out, d_in = shape
    return d_in * d_in * adapter_bytes + d_out * d_in * (compute_bytes + 2 * adapter_bytes)


def nf4_dequantize_seconds(ctx: PlanContext) -> float:
    """One pass of dequantizing every NF4 decoder weight (each matmul's own, per forward): read
    0.5 B + scales, write c B per element, memory bound. Unit: seconds."""
    m = ctx.model
    elements = sum(t.numel for t in adapters.layer_quantized(m)) * m.num_layers
    return elements * (0.5 + ctx.layout.dtypes.compute) / rates.bandwidth(ctx)


def _adapter_passes(ctx: PlanContext) -> tuple[float, float, float, str]:
    """Per micro-batch: the adapters' matmuls in one forward (a third of their forward and backward
    FLOPs beyond the frozen base's), peft's LoRA path in the forward and in the backward, each in
    seconds, and the adapters' matmul dtype."""
    spec, m, lay = ctx.layout.adapter, ctx.model, ctx.layout
    assert spec is not None
    c = lay.dtypes.compute
    cast = adapters.casts_adapter_input(spec, lay.weight_bytes, c)
    full = adapters.adapter_matmul_flops_per_token(m, spec.targets, spec.rank)
    base = 2 * compute.matmul_flops_per_token(m)  # the frozen forward and input gradients (precision's rows)
    # fp32 adapters without autocast multiply in fp32: torch's default matmul precision ("highest")
    # runs them on the fp32 units, not as TF32
    dtype = "fp32" if cast and not lay.autocast else lay.compute_dtype
    forward = max(0.0, full - base) * rates.tokens(ctx) / rates.matmul_rate(ctx, dtype) / 3
    path = adapters.adapter_path_traffic(m, spec.targets, c, lay.weight_bytes, cast, lay.autocast, spec.dropout)
    per_layer = rates.tokens(ctx) * m.num_layers / rates.bandwidth(ctx)
    return forward, path.forward * per_layer, path.backward * per_layer, dtype


def adapter_forward_seconds(ctx: PlanContext) -> float:
    """The adapters' share of one forward pass of the policy over the micro-batch (their matmuls
    and peft's LoRA path: the forward rows ``_time`` writes); 0 without an adapter, or for a
    forward with the adapters disabled (a reference). Unit: seconds."""
    if ctx.layout.adapter is None:
        return 0.0
    forward, path, _, _ = _adapter_passes(ctx)
    return forward + path


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The adapters' own matmuls (forward and backward), the memory traffic of peft's LoRA path
    around them (planner.cost.adapters ``adapter_path_traffic``; DoRA takes LoRA's, less its own
    few passes over each output, which are not counted), QLoRA's dequantization of every NF4
    weight per pass (read 0.5 B + scales, write c B per element; backward dequantizes again), and
    DoRA's weight norms (B A and W + s B A per wrapped weight per forward); QLoRA's modules'
    host work per call (``overheads.NF4_MATMUL_HOST_SECONDS``, a dispatch floor; the recompute
    calls them again)."""
    spec, m = ctx.layout.adapter, ctx.model
    if spec is None:
        return
    c = ctx.layout.dtypes.compute
    forward, path_forward, path_backward, dtype = _adapter_passes(ctx)
    draft.compute("matmul", f"adapter matmuls ({ctx.config.adapter} r{spec.rank}, {dtype})", forward,
                  Window.FORWARD, note="2 r (in + out) FLOPs per wrapped weight per token")
    draft.compute("matmul", "adapter matmuls, backward", 2 * forward, Window.BACKWARD,
                  note="A and B weight and input gradients")
    recompute = ctx.config.checkpointing == "full"
    draft.compute("elementwise", "LoRA path: casts, dropout, scaling, sum (forward)", path_forward,
                  Window.FORWARD, note="memory bound, per wrapped module")
    draft.compute("elementwise", "LoRA path, backward" + (" and recompute" if recompute else ""),
                  path_backward + recompute * path_forward, Window.BACKWARD, note="memory bound, per wrapped module")
    if spec.nf4:
        once = nf4_dequantize_seconds(ctx)
        draft.compute("elementwise", "QLoRA dequantization (forward)", once, Window.FORWARD)
        draft.compute("elementwise", "QLoRA dequantization (backward" + (", recompute)" if recompute else ")"),
                      once * (2 if recompute else 1), Window.BACKWARD)
        calls = len(adapters.layer_quantized(m)) * m.num_layers * overheads.NF4_MATMUL_HOST_SECONDS
        draft.dispatch(calls, calls * (2 if recompute else 1),
                       f"the QLoRA modules' Python ({overheads.NF4_MATMUL_HOST_SECONDS * 1e3:.2f} ms a call, measured: H100, "
                       "16-CPU host)")
    if spec.int8:
        per_token, dequantize = adapters.int8_traffic(m, c)
        passes = 2 if ctx.config.checkpointing == "full" else 1  # the recompute quantizes again
        forward = per_token * rates.tokens(ctx) / rates.bandwidth(ctx)
        draft.compute("elementwise", "LLM.int8() input quantization and output dequantization", forward,
                      Window.FORWARD, note="memory bound, per quantized matmul")
        draft.compute("elementwise", "LLM.int8() weight dequantization (backward)" + (
            " and the recompute's quantization" if passes == 2 else ""),
            dequantize / rates.bandwidth(ctx) + (passes - 1) * forward, Window.BACKWARD)
    if spec.dora:
        wrapped = adapters.wrapped(m, spec.targets)
        flops = sum(2 * t.shape[0] * t.shape[1] * spec.rank for t in wrapped) * m.num_layers
        traffic = sum(dora_norm_bytes(t.shape, ctx.layout.weight_bytes, c) for t in wrapped) * m.num_layers
        rate = rates.matmul_rate(ctx, dtype)
        draft.compute("elementwise", "DoRA weight norms (forward)", flops / rate + traffic / rates.bandwidth(ctx),
                      Window.FORWARD, note="B A and W + s B A per wrapped weight")


def lora_config(config, family: str) -> dict:
    """peft ``LoraConfig`` keyword arguments of the plan's adapter (runtime.json ``lora``)."""
    return {"r": config.lora_rank, "lora_alpha": config.lora_alpha, "lora_dropout": config.lora_dropout,
            "target_modules": target_modules(str(config.lora_targets), family), "bias": "none",
            "use_dora": config.adapter == Adapter.DORA, "task_type": "CAUSAL_LM"}


#: The attention projections' module names per family (peft target_modules); "all-linear" is
#: peft's own shorthand for every linear but the output head.
ATTENTION_MODULES = {"gpt2": ["attn.c_attn", "attn.c_proj"], "phi3": ["qkv_proj", "o_proj"]}
LLAMA_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


#: peft's ``target_modules`` for the ``qv`` set (the module names of every family that has it).
QV_MODULES = ["q_proj", "v_proj"]
#: The fused q, k and v projection's module name, per family that has one.
FUSED_QKV = {"gpt2": "attn.c_attn", "phi3": "qkv_proj"}
#: The MLP projections' module names per family (peft target_modules for the ``mlp`` set).
MLP_MODULES = {"gpt2": ["mlp.c_fc", "mlp.c_proj"], "starcoder2": ["mlp.c_fc", "mlp.c_proj"],
               "phi3": ["gate_up_proj", "down_proj"]}
LLAMA_MLP = ["gate_proj", "up_proj", "down_proj"]


def target_modules(targets: str, family: str):
    if targets == adapters.ALL_LINEAR:
        return "all-linear"
    if targets == adapters.MLP:
        return list(MLP_MODULES.get(family, LLAMA_MLP))
    return list(QV_MODULES) if targets == adapters.QV else ATTENTION_MODULES.get(family, LLAMA_ATTENTION)


#: Bytes per element of the dtypes QLoRA computes and stores its codes in.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def compute_dtype(config) -> str:
    """The dtype QLoRA dequantizes to and computes in (and, under FSDP, stores its packed codes
    in): the frozen base's load dtype (strategies.precision ``load_dtype``)."""
    return load_dtype(config.precision, adapter=True)


def quantization_config(config) -> dict | None:
    """transformers ``BitsAndBytesConfig`` keyword arguments for QLoRA (runtime.json
    ``quantization``): NF4 with double quantization, computing in the plan's 16-bit dtype. The
    packed codes are stored in uint8 on one GPU or under DDP; under FSDP in the compute dtype
    (``bnb_4bit_quant_storage``, Answer.AI's FSDP-QLoRA): FSDP2 cannot shard uint8 4-bit weights
    (accelerate leaves them out of sharding), and the Trainer then sets FSDP's mixed precision to
    that dtype (transformers ``update_fsdp_plugin_peft``). lora-int8: ``load_in_8bit`` (LLM.int8()
    with transformers' defaults: outlier threshold 6.0, the head kept 16-bit)."""
    if config.adapter == Adapter.LORA_INT8:
        return {"load_in_8bit": True}
    if config.adapter != Adapter.QLORA:
        return None
    compute = compute_dtype(config)
    q = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
         "bnb_4bit_compute_dtype": compute}
    if engine_of(config.sharding) == Engine.FSDP or config.sharding == "zero3":
        q["bnb_4bit_quant_storage"] = compute
    return q


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """runtime.json's ``lora`` (peft LoraConfig) and ``quantization`` (BitsAndBytesConfig); the
    planner launch wraps the loaded model with them (planner/runtime/adapter.py)."""
    if ctx.config.adapter == Adapter.NONE:
        return
    files.runtime["lora"] = lora_config(ctx.config, ctx.model.family)
    files.runtime["adapter_dtype"] = str(ctx.config.adapter_dtype)
    if ctx.config.kbit_prep != KbitPrep.NONE:
        files.runtime["kbit_prep"] = str(ctx.config.kbit_prep)
    files.extras.add("adapters")
    if (q := quantization_config(ctx.config)) is not None:
        files.runtime["quantization"] = q
        files.extras.add("qlora")


#: Every decoder-layer linear of the dense families, by the names peft's target_modules use.
ALL_LINEAR_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


def targets_of(modules) -> tuple[LoraTargets, str | None]:
    """The target set a peft ``target_modules`` value means, and a note when it is only modelled
    as one: "all-linear", or a list naming every projection, is all-linear; q_proj and v_proj are
    qv, gate_proj, up_proj and down_proj mlp, and none at all is peft's per-architecture default, q_proj and v_proj on the Llama,
    Mistral, Qwen and Gemma families (a fused-qkv model is then refused by the check); any other
    list is modelled as attention."""
    if modules == "all-linear" or (isinstance(modules, list) and ALL_LINEAR_MODULES <= set(map(str, modules))):
        return LoraTargets.ALL_LINEAR, None
    if isinstance(modules, list) and set(map(str, modules)) == set(LLAMA_ATTENTION):
        return LoraTargets.ATTENTION, None
    if isinstance(modules, list) and set(map(str, modules)) == set(QV_MODULES):
        return LoraTargets.QV, None
    if isinstance(modules, list) and set(map(str, modules)) == set(LLAMA_MLP):
        return LoraTargets.MLP, None
    if modules is None:
        return LoraTargets.QV, ("none named: peft's default for the architecture, planned as q_proj and v_proj "
                                "(Llama, Mistral, Qwen, Gemma)")
    return LoraTargets.ATTENTION, f"target modules {modules!r} are modelled as attention (q, k, v, o)"


def _kind(four_bit: bool, dora: bool, where: str, r: Reading, eight_bit: bool = False) -> Adapter:
    """The adapter a LoRA over a (4-bit or 8-bit) base is; DoRA over a quantized base is not a
    planned one, nor a base asked to load in both widths (transformers refuses that)."""
    if four_bit and eight_bit:
        r.problems.append(f"{where}: load_in_4bit and load_in_8bit together: transformers refuses both; pick one")
    elif (four_bit or eight_bit) and dora:
        r.problems.append(f"{where}: use_dora over a quantized base is not a planned adapter (qlora, lora-int8 or "
                          "dora)")
    return (Adapter.DORA if dora else Adapter.QLORA if four_bit else Adapter.LORA_INT8 if eight_bit
            else Adapter.LORA)


#: peft's get_peft_model gained ``autocast_adapter_dtype`` (default True: fp32 adapters) in 0.12.
PEFT_FP32_ADAPTERS_SINCE = (0, 12)
#: TRL's trainers passed a quantized base through peft's ``prepare_model_for_kbit_training``
#: (trl/models/utils.py ``prepare_peft_model``, 0.22-0.25; the trainers' own code before) unless
#: it was sharded (FSDP or ZeRO-3 loading); 0.26 builds the peft model without it (trl 2af35fb,
#: #4577, "Clean up model preparation").
TRL_KBIT_PREPARED_BEFORE = (0, 26)


def _read_kbit_prep(d: dict, where: str, r: Reading, kind: Adapter) -> None:
    """How TRL prepares a recipe's quantized base that is not sharded: up to 0.25 with peft's
    ``prepare_model_for_kbit_training`` (every unquantized 16-bit parameter fp32), then under
    ``bf16`` with a 4-bit base ``peft_module_casting_to_bf16`` (the embeddings and head back to
    bf16, the norms fp32): ``kbit_prep`` fp32-norms, else fp32 (trl/models/utils.py
    ``prepare_peft_model``, 0.22-0.25; the trainers' own code from 0.8). The installed TRL says
    which release runs the job; without one, and for an 8-bit base (whose prepared layout is not
    modelled), a warning says the activation memory planned is a lower bound."""
    trl = job_module.installed_release("trl")
    if trl is not None and trl >= TRL_KBIT_PREPARED_BEFORE:
        return
    if trl is not None and kind == Adapter.QLORA:
        bf16 = d.get("bf16") is True
        r.set("kbit_prep", KbitPrep.FP32_NORMS if bf16 else KbitPrep.FP32,
              f"TRL {trl[0]}.{trl[1]} (installed here) prepares {where}'s 4-bit base with peft's "
              "prepare_model_for_kbit_training" + (", then casts its embeddings and head back to bf16" if bf16 else ""))
        return
    which, aside = (f"TRL {trl[0]}.{trl[1]} (installed here)", "") if trl else (
        "TRL before 0.26", " (TRL is not installed here to say which release runs the job; for TRL <= 0.25 "
        "with bf16 plan it with --kbit-prep fp32-norms)")
    r.warnings.append(f"{where}: {which} passes the quantized base through peft's prepare_model_for_kbit_training, "
                      "whose fp32 norms make the residual stream and the projections' outputs fp32; planner plans "
                      f"the base without that preparation: the activation memory is a lower bound{aside}")


def _read_trl(d: dict, where: str, r: Reading, sharded: bool = False, framework: str = "",
              deepspeed: bool = False) -> None:
    """A TRL recipe's ``ModelConfig`` (or alignment-handbook's ``ModelArguments``): ``use_peft``
    with ``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``, ``use_dora``,
    ``lora_modules_to_save`` (warned: not counted) and
    ``load_in_4bit`` (QLoRA) or ``load_in_8bit`` (lora-int8); TRL's defaults are planner's (16, 32,
    0.05). ``sharded``: the job runs FSDP, whose QLoRA base TRL loads on the host and does not
    prepare (``is_sharded_qlora``), or DeepSpeed, whose engine casts every floating parameter to
    its 16-bit dtype when it starts (``DeepSpeedEngine._configure_distributed_model``;
    ``_cast_module_mixed_precision`` in 0.19, ``module.bfloat16()`` before), undoing TRL's
    preparation; elsewhere a quantized base's preparation is read
    (``_read_kbit_prep``). ``framework``: the recipe's trainer when not TRL's (planner/check/
    frameworks.py): LLaMA-Factory's ``upcast_layernorm`` casts the norms to fp32 (kbit prep
    fp32-norms over a 4-bit base); it and axolotl (which casts the norms back) do not run TRL's
    preparation."""
    if not r.typed(d, "use_peft", (bool,), where, False):
        for key in ("load_in_4bit", "load_in_8bit"):
            if r.typed(d, key, (bool,), where, False):
                r.problems.append(f"{where}: {key} without use_peft: a quantized base trains only with an adapter")
        return
    kind = _kind(r.typed(d, "load_in_4bit", (bool,), where, False), r.typed(d, "use_dora", (bool,), where, False),
                 where, r, r.typed(d, "load_in_8bit", (bool,), where, False))
    r.set("adapter", kind, f"{where}: use_peft")
    if framework == "llamafactory" and d.get("upcast_layernorm") is True and not deepspeed:
        # LLaMA-Factory's prepare_model_for_training: its norms' 1-d weights to fp32, nothing else
        if kind == Adapter.QLORA:
            r.set("kbit_prep", KbitPrep.FP32_NORMS, f"{where}: upcast_layernorm (the norms' weights in fp32)")
        else:
            r.warnings.append(f"{where}: upcast_layernorm over a {kind} base: its fp32 norms' outputs are not modelled "
                              "there (modelled over a 4-bit base): the activation memory is a lower bound")
    elif kind in (Adapter.QLORA, Adapter.LORA_INT8) and not sharded and not framework:
        _read_kbit_prep(d, where, r, kind)
    peft = job_module.installed_release("peft")
    if kind == Adapter.LORA and (peft is None or peft >= PEFT_FP32_ADAPTERS_SINCE):
        r.set("adapter_dtype", AdapterDtype.FP32, f"peft's default autocast_adapter_dtype for {where}'s use_peft "
              "(get_peft_model: fp32 adapters, which bf16-pure trains without autocast)")
    for key, name, kinds in (("lora_r", "lora_rank", (int,)), ("lora_alpha", "lora_alpha", (int,)),
                             ("lora_dropout", "lora_dropout", (float, int))):
        value = r.typed(d, key, kinds, where)
        if value is not None:
            r.set(name, value, f"{where}: {key}")
    targets, note = targets_of(d.get("lora_target_modules"))
    r.set("lora_targets", targets, f"{where}: lora_target_modules")
    if note:
        r.warnings.append(f"{where}: lora_target_modules: {note}")
    saved = d.get("lora_modules_to_save")
    if saved:
        r.warnings.append(f"{where}: lora_modules_to_save {saved!r}: peft trains full copies of these modules beside "
                          "the adapters (their weights, gradients and optimizer states), which planner does not "
                          "count: the memory is a lower bound")


def _read(job: JobFiles, r: Reading) -> None:
    """runtime.json's ``lora`` and ``quantization``, or a TRL recipe's ``use_peft`` and LoRA
    settings: the adapter and its settings; what the bitsandbytes installed here keeps in QLoRA's
    matmuls (the job's environment, as for transformers' loss path)."""
    bnb = job_module.installed_release("bitsandbytes", parts=3)
    if bnb is not None:
        kept = Nf4Matmul.KEEPS_INPUT if bnb < adapters.NF4_FREES_INPUT_SINCE else Nf4Matmul.FREES_INPUT
        r.set("nf4_matmul", kept, f"bitsandbytes {'.'.join(map(str, bnb))} installed here")
    if job.training_args_where:
        # (DeepSpeed casts the whole module to 16 bit when its engine starts, undoing any preparation)
        deepspeed = bool(job.deepspeed or job.accelerate_inline_deepspeed or job.distributed_type == "DEEPSPEED"
                         or job.training_args.get("deepspeed"))
        _read_trl(job.training_args, job.training_args_where, r,
                  sharded=job.distributed_type == "FSDP" or bool(job.fsdp) or deepspeed, framework=job.framework,
                  deepspeed=deepspeed)
    if not job.runtime_where:
        return
    lora, quant, where = job.runtime.get("lora"), job.runtime.get("quantization"), job.runtime_where
    if lora is None:
        if quant is not None:
            r.problems.append(f"{where}: quantization without lora: a quantized base trains only with an adapter")
        r.set("adapter", Adapter.NONE, f"{where}: no lora")
        return
    if not isinstance(lora, dict):
        r.problems.append(f"{where}: lora must be a mapping of peft LoraConfig arguments")
        return
    for key, enum in (("adapter_dtype", AdapterDtype), ("kbit_prep", KbitPrep)):  # (each enum's first: the default)
        value = job.runtime.get(key, str(next(iter(enum))))
        if isinstance(value, str) and value in set(enum):
            r.set(key, enum(value), f"{where}: {key} {value}" if key in job.runtime
                  else f"{where}: no {key} (planner's layout)")
        else:
            r.problems.append(f"{where}: {key} {value!r}: one of {', '.join(enum)}")
    four_bit = isinstance(quant, dict) and quant.get("load_in_4bit") is True
    eight_bit = isinstance(quant, dict) and quant.get("load_in_8bit") is True
    r.set("adapter", _kind(four_bit, bool(lora.get("use_dora")), where, r, eight_bit),
          f"{where}: lora" + (" over a 4-bit base" if four_bit else " over an 8-bit base" if eight_bit else ""))
    storage = quant.get("bnb_4bit_quant_storage", "uint8") if four_bit and isinstance(quant, dict) else None
    fsdp = job.distributed_type == "FSDP" or bool(job.fsdp)
    if fsdp and storage not in (None, *DTYPE_BYTES):
        r.warnings.append(f"{where}: qlora under FSDP with bnb_4bit_quant_storage {storage}: accelerate leaves "
                          "such 4-bit weights out of FSDP's sharding (every GPU holds the whole base), which is not "
                          "the FSDP-QLoRA planned; set quantization.bnb_4bit_quant_storage to the compute dtype")
    for key, name in (("r", "lora_rank"), ("lora_alpha", "lora_alpha"), ("lora_dropout", "lora_dropout")):
        if key in lora:
            r.set(name, lora[key], f"{where}: lora.{key}")
    modules = lora.get("target_modules")
    if modules != "all-linear" and not (isinstance(modules, list) and modules and all(isinstance(x, str) for x in modules)):
        r.problems.append(f"{where}: lora.target_modules {modules!r}: 'all-linear' or the attention projections")
    targets, note = targets_of(modules)
    r.set("lora_targets", targets, f"{where}: lora.target_modules")
    if note and modules not in ATTENTION_MODULES.values():
        r.warnings.append(f"{where}: lora.target_modules: {note}")


def describe(get) -> str:
    """"lora r16 all-linear" (a dropout other than TRL's 0.05 is named); "none" for full fine-tuning."""
    a = get("adapter")
    if a is None or str(a) == Adapter.NONE:
        return str(a)
    dropout = get("lora_dropout")
    words = f"{a} r{get('lora_rank')} {get('lora_targets')}"
    return words + (f" dropout {dropout:g}" if dropout is not None and dropout != 0.05 else "")


def _savers(c, hardware) -> list[tuple[str, dict]]:
    """A k-bit prepared base without its preparation (TRL from 0.26 and planner's launch do not
    prepare it; the callers keep a change only where it lowers the peak)."""
    if c.adapter == Adapter.QLORA and c.kbit_prep != KbitPrep.NONE:
        return [(f"kbit-prep {c.kbit_prep} -> {KbitPrep.NONE}", {"kbit_prep": KbitPrep.NONE})]
    return []


STRATEGY = Strategy(
    "adapter", Adapter, Adapter.NONE, order=7, short="adapter",
    help="what trains: none (full fine-tuning), lora, qlora (LoRA over an NF4 base), dora (LoRA with magnitudes), "
         "lora-int8 (LoRA over an LLM.int8() base)",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, storage=_storage, savers=_savers,
    settings=SETTINGS, describe=describe, any_choice=True, runtime="planner.runtime.adapter", records=CHOICES,
)
