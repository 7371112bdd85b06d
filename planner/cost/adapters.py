"""Adapters: the weights LoRA and DoRA wrap, the tensors they add, QLoRA's 4-bit storage, the
matmul FLOPs of a step that trains an adapter on a frozen model, and what a LoRA layer saves for
backward.

Exact, tensor by tensor, as peft builds them on transformers 5 models (peft 0.21: ``LoraConfig``
with ``target_modules``; ``tuners_utils._maybe_include_all_linear_layers`` for "all-linear";
``utils/transformers_weight_conversion.py`` for MoE experts) and as bitsandbytes stores NF4
weights (``functional.quantize_4bit``). Tests (tests/test_adapters.py) build every family with
peft on the meta device and compare the trainable count exactly, load tiny models in 4 bits with
bitsandbytes, and count a real peft step's FLOPs with torch's FlopCounterMode.
"""

from dataclasses import dataclass
from functools import cache
from math import ceil, prod

from planner.core.specs import MlpKind, ModelSpec, NormKind
from planner.cost import activations, compute, params

#: The target sets (``--lora-targets``): every decoder-layer matmul, the attention's only, its
#: query and value projections only (peft's own default ``target_modules`` for the Llama, Mistral,
#: Mixtral, Qwen2/3, Gemma and StarCoder2 families: ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``),
#: or the MLP's only.
ALL_LINEAR = "all-linear"
ATTENTION = "attention"
QV = "qv"
MLP = "mlp"
TARGETS = (ALL_LINEAR, ATTENTION, QV, MLP)
#: The weights the ``qv`` set wraps, by their names in ``params.layer_matmuls``.
QV_WEIGHTS = ("self_attn.q_proj.weight", "self_attn.v_proj.weight")


@dataclass(frozen=True)
class AdapterSpec:
    """The adapter a plan trains on its frozen base (the plan layout's ``adapter``)."""

    targets: str  # one of TARGETS
    rank: int
    dropout: float
    dora: bool = False  # DoRA: a magnitude vector per wrapped weight
    nf4: bool = False  # QLoRA: the wrapped weights stored in NF4 (double quantization)
    int8: bool = False  # LoRA over bitsandbytes' LLM.int8() base (``load_in_8bit``)
    nf4_keeps_input: bool = False  # QLoRA under bitsandbytes < 0.43.2 (``NF4_FREES_INPUT_SINCE``)
    fp32_norms: bool = False  # peft's prepare_model_for_kbit_training: norms and biases fp32 (see kbit_prepared_fp32_elements)
    fp32_embeddings: bool = False  # and the embeddings and head left fp32 too (no cast back to 16 bit)

    @property
    def base_keeps_inputs(self) -> bool:
        """Whether the quantized base's matmuls keep their inputs on the autograd context
        (``kept_input_bytes``): LLM.int8() always, NF4 before bitsandbytes 0.43.2."""
        return self.int8 or (self.nf4 and self.nf4_keeps_input)


@dataclass(frozen=True)
class AdapterTensor:
    """One trainable tensor an adapter adds to a decoder layer, beside the frozen weight it wraps."""

    name: str  # "<wrapped weight>.lora_A" / ".lora_B" / ".magnitude"
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return prod(self.shape)


def wrapped(m: ModelSpec, targets: str) -> tuple[params.ParamTensor, ...]:
    """The decoder-layer matmul weights peft wraps, per layer.

    - ``all-linear``: every ``nn.Linear``/``Conv1D`` but the output head (peft's shorthand); on a
      MoE model also the router and the fused expert tensors, which peft reaches through
      ``target_parameters`` (the transformers 5 checkpoint conversion maps the v4 per-expert
      linears ``w1``/``w3``/``w2`` and the router ``gate`` onto ``gate_up_proj``, ``down_proj`` and
      ``gate.weight``).
    - ``attention``: the attention's projections (q, k, v and the output; Phi-3's and GPT-2's
      fused qkv).
    - ``qv``: the query and value projections (``q_proj``, ``v_proj``). A model that fuses q, k and
      v into one matmul has no such pair (``supports``; the check refuses the set there): its fused
      qkv stands in, so that a refused plan's figures can still be shown.
    - ``mlp``: the MLP's projections (gate, up and down; Phi-3's fused gate_up; GPT-2's and
      StarCoder2's fc in and out).
    Embeddings, norms and the head are never wrapped."""
    if targets not in TARGETS:
        raise ValueError(f"lora targets {targets!r}: one of {', '.join(TARGETS)}")
    matmuls = params.layer_matmuls(m)
    if targets in (ATTENTION, MLP):
        return tuple(t for t in matmuls if t.name.startswith("self_attn." if targets == ATTENTION else "mlp."))
    if targets == QV:
        names = QV_WEIGHTS if supports(m, QV) else ("self_attn.qkv_proj.weight",)
        return tuple(t for t in matmuls if t.name in names)
    return matmuls


def supports(m: ModelSpec, targets: str) -> bool:
    """Whether ``m`` has the weights of the target set as peft's ``target_modules`` reach them:
    every model has its linears and its attention projections; only models with separate query and
    value projections have ``qv``; a MoE's MLP is a router and fused expert parameters, which
    ``all-linear`` alone reaches (through ``target_parameters``), so it has no ``mlp``."""
    if targets == QV:
        return {t.name for t in params.layer_matmuls(m)} >= set(QV_WEIGHTS)
    return targets != MLP or not m.is_moe


def lora_rank(m: ModelSpec, t: params.ParamTensor, rank: int) -> int:
    """The rank peft gives a wrapped weight: ``rank``, doubled on a MoE's fused ``gate_up_proj``
    (peft's conversion fuses the w1 and w3 adapters, so ``rank_pattern`` sets r * 2 and
    ``alpha_pattern`` alpha * 2, keeping alpha / r)."""
    return rank * 2 if t.routed and t.name.startswith("mlp.gate_up_proj") else rank


@cache
def adapter_tensors(m: ModelSpec, targets: str, rank: int, dora: bool) -> tuple[AdapterTensor, ...]:
    """The trainable tensors one decoder layer gains. A wrapped (out, in) weight gains lora_A
    (r, in) and lora_B (out, r); a MoE expert tensor of E experts one pair over all experts,
    (r*E, in) and (out, r*E) (peft ``ParamWrapper``); DoRA adds a magnitude vector of out
    elements per wrapped weight (``lora_magnitude_vector``). Biases stay frozen (``bias="none"``)."""
    if dora and not dora_supported(m, targets):
        raise ValueError(f"DoRA cannot wrap {m.id}'s expert tensors (peft: ParamWrapper does not work with use_dora)")
    out: list[AdapterTensor] = []
    for t in wrapped(m, targets):
        name = t.name.removesuffix(".weight")
        d_out, d_in = t.shape
        r = lora_rank(m, t, rank) * (t.experts if t.routed else 1)
        out += [AdapterTensor(f"{name}.lora_A", (r, d_in)), AdapterTensor(f"{name}.lora_B", (d_out, r))]
        if dora:
            out.append(AdapterTensor(f"{name}.magnitude", (d_out,)))
    return tuple(out)


def dora_supported(m: ModelSpec, targets: str) -> bool:
    """peft applies DoRA to linear layers only: not to a MoE's expert or router parameters, which
    ``all-linear`` wraps as parameters (``lora.ParamWrapper``)."""
    return not (m.is_moe and targets == ALL_LINEAR)


@cache
def trainable_tensors(m: ModelSpec, spec: AdapterSpec | None) -> tuple[params.ParamTensor, ...]:
    """The tensors a plan trains, as parameter tensors (layer tensors once; multiply by
    ``params.multiplicity``): every model tensor in full fine-tuning, else the adapter's."""
    if spec is None:
        return params.model_tensors(m)
    dora = spec.dora and dora_supported(m, spec.targets)
    return tuple(params.ParamTensor(t.name, t.shape, params.Part.LAYER)
                 for t in adapter_tensors(m, spec.targets, spec.rank, dora))


@cache
def trained_elements(m: ModelSpec, spec: AdapterSpec) -> tuple[int, int]:
    """(elements of one decoder layer's adapters, elements of every adapter in the model): the
    adapter's ``trainable_tensors``, all of them in the decoder layers."""
    tensors = trainable_tensors(m, spec)
    return sum(t.numel for t in tensors), sum(t.numel * params.multiplicity(m, t) for t in tensors)


@cache
def nf4_packing_saving(m: ModelSpec, storage_bytes: int) -> int:
    """Elements one decoder layer's quantized weights save when stored as packed NF4 codes in a
    dtype of ``storage_bytes`` (``nf4_storage_elements``) instead of one element each."""
    return sum(t.numel - nf4_storage_elements(t.numel, storage_bytes) for t in layer_quantized(m))


def adapter_parameters(m: ModelSpec, targets: str, rank: int, dora: bool = False) -> int:
    """Trainable parameters of the adapter over the whole model, elements (Llama-3.1-8B, rank 16,
    all-linear: 41,943,040)."""
    return m.num_layers * sum(t.numel for t in adapter_tensors(m, targets, rank, dora))


#: bitsandbytes NF4: elements per absmax block (``blocksize``, transformers' default 64), and with
#: double quantization the blocks per second-level fp32 absmax (``functional.quantize_4bit``).
NF4_BLOCK = 64
NF4_NESTED_BLOCK = 256
#: The quantization maps a quantized tensor's state holds: the 16-entry fp32 NF4 table (64 B), and
#: with double quantization the 256-entry fp32 dynamic map (1,024 B) and an fp32 offset (4 B).
NF4_CODE_BYTES = 64
NF4_NESTED_CODE_BYTES = 1024 + 4


def nf4_bytes(numel: int, double_quant: bool) -> int:
    """Bytes one weight of ``numel`` elements takes stored in NF4 (QLoRA), whatever the storage
    dtype (``bnb_4bit_quant_storage`` reinterprets the same packed bytes): two 4-bit codes per
    byte, then per block of 64 elements an fp32 absmax, or with double quantization an 8-bit one
    plus an fp32 absmax per 256 blocks. Each tensor's state counts its own maps (bitsandbytes may
    share them; at most 1,092 B a tensor). Source: bitsandbytes ``functional.quantize_4bit``;
    a test quantizes real tensors and sums the parts."""
    blocks = ceil(numel / NF4_BLOCK)
    packed = ceil(numel / 2)
    if double_quant:
        return packed + blocks + 4 * ceil(blocks / NF4_NESTED_BLOCK) + NF4_CODE_BYTES + NF4_NESTED_CODE_BYTES
    return packed + 4 * blocks + NF4_CODE_BYTES


def bnb_quantized(m: ModelSpec, t: params.ParamTensor) -> bool:
    """Whether transformers' bitsandbytes loading quantizes this weight (NF4 under ``load_in_4bit``,
    QLoRA; int8 under ``load_in_8bit``): a decoder layer's ``nn.Linear``/``Conv1D`` weight (biases,
    norms, embeddings and the head stay 16-bit: ``get_keys_to_not_convert`` keeps the output
    embedding). A MoE's fused expert tensors and its router are plain parameters in transformers 5,
    so they stay 16-bit too (checked by loading tiny models with ``BitsAndBytesConfig`` on the CPU,
    both widths)."""
    return t.part == params.Part.LAYER and t.matmul and not t.routed and not t.name.startswith("mlp.router")


@cache
def nf4_state_bytes(numel: int) -> int:
    """Bytes of one NF4 weight's quantization state with double quantization (``nf4_bytes`` less
    the packed codes): the 8-bit absmax per block, the fp32 absmax per 256 blocks and the maps."""
    return nf4_bytes(numel, True) - ceil(numel / 2)


def nf4_storage_elements(numel: int, storage_bytes: int) -> int:
    """Elements of the tensor holding one weight's packed NF4 codes in a storage dtype of
    ``storage_bytes`` (``bnb_4bit_quant_storage``: bitsandbytes views the ceil(numel / 2) code
    bytes as that dtype, a (n, 1) tensor), which FSDP shards and gathers like any parameter."""
    return ceil(ceil(numel / 2) / storage_bytes)


@cache
def nf4_stored_parts(m: ModelSpec, storage_bytes: int) -> tuple[int, int]:
    """The whole model's NF4 base as FSDP-QLoRA and ZeRO-3 QLoRA store it: (elements of the packed
    codes in the storage dtype of ``storage_bytes``, ``nf4_storage_elements`` per weight; bytes of
    their quantization state, ``nf4_state_bytes`` per weight), over every decoder layer."""
    quantized = layer_quantized(m)
    return (sum(nf4_storage_elements(t.numel, storage_bytes) for t in quantized) * m.num_layers,
            sum(nf4_state_bytes(t.numel) for t in quantized) * m.num_layers)


def layer_quantized(m: ModelSpec) -> tuple[params.ParamTensor, ...]:
    """One decoder layer's weights a bitsandbytes load quantizes (``bnb_quantized``)."""
    return tuple(t for t in params.layer_tensors(m) if bnb_quantized(m, t))


def _weight_parts(m: ModelSpec, size) -> tuple[int, int]:
    """The frozen base model loaded quantized, in two parts: bytes of its quantized weights
    (``size(tensor)`` each where ``bnb_quantized``) and elements of every other parameter (kept in
    the 16-bit load dtype)."""
    packed = sum(size(t) * params.multiplicity(m, t) for t in params.model_tensors(m) if bnb_quantized(m, t))
    rest = sum(t.numel * params.multiplicity(m, t) for t in params.model_tensors(m) if not bnb_quantized(m, t))
    return packed, rest


@cache
def qlora_weight_parts(m: ModelSpec, double_quant: bool) -> tuple[int, int]:
    """The frozen base model loaded in 4 bits: bytes of its NF4 weights (``nf4_bytes``) and
    elements of every other parameter (``_weight_parts``)."""
    return _weight_parts(m, lambda t: nf4_bytes(t.numel, double_quant))


def qlora_weight_bytes(m: ModelSpec, double_quant: bool, other_bytes: int = 2) -> int:
    """Bytes of the frozen base model loaded in 4 bits: its NF4 weights and every other parameter
    in ``other_bytes`` (``qlora_weight_parts``)."""
    nf4, rest = qlora_weight_parts(m, double_quant)
    return nf4 + rest * other_bytes


#: bitsandbytes LLM.int8() (Dettmers et al. 2022, arXiv:2208.07339): the fp32 scale per output row
#: (``Int8Params.SCB``) beside the int8 weight.
INT8_SCALE_BYTES = 4


def kbit_prepared_fp32_elements(m: ModelSpec, spec: "AdapterSpec") -> int:
    """Elements of the quantized base's unquantized parameters (``_weight_parts``' second part)
    that a k-bit preparation keeps in fp32 (0 without one).

    peft's ``prepare_model_for_kbit_training`` casts every fp16/bf16 parameter that is not a
    ``Params4bit`` to fp32 (peft utils/other.py; an ``Int8Params`` is int8 and stays): norms,
    biases, embeddings and head. TRL up to 0.25 then, under ``bf16`` with a 4-bit base, casts the
    modules named ``lm_head``/``embed_tokens``/``wte``/``wpe`` back to bf16 and every ``*norm*``
    module to fp32 (trl ``peft_module_casting_to_bf16``): ``fp32_embeddings`` False. Unit: elements."""
    if not spec.fp32_norms:
        return 0
    _, rest = quantized_weight_parts(m, spec)
    if spec.fp32_embeddings:
        return rest
    return rest - sum(t.numel for t in params.model_tensors(m) if t.part in (params.Part.EMBEDDING, params.Part.HEAD))


def kbit_prep_supported(m: ModelSpec) -> str:
    """Why a k-bit prepared base's activations are not modelled on ``m`` ('' where they are):
    the prepared list (``adapter_layer_saved``'s ``prepared``) is read for dense decoders with
    Llama's RMSNorm (its fp32 weight makes its output fp32), separate q, k and v and a gated MLP.
    Gemma's norm returns its input's dtype and LayerNorm runs in fp32 under autocast: other lists."""
    if m.is_moe or m.norm_kind != NormKind.RMS or m.fused_qkv or m.mlp_kind != MlpKind.GATED:
        return (f"{m.family}'s layer under peft's prepare_model_for_kbit_training is not modelled (modelled: dense "
                "Llama-style layers: RMSNorm, separate q, k, v, a gated MLP)")
    return ""


def int8_bytes(shape: tuple[int, ...]) -> int:
    """Bytes one (out, in) weight takes loaded with ``load_in_8bit``: one int8 per element and an
    fp32 absmax scale per output row (bitsandbytes ``Int8Params``: ``CB`` int8, ``SCB`` fp32 (out,);
    the matmul state shares both). A test loads a tiny model so on the CPU and sums the bytes."""
    return prod(shape) + INT8_SCALE_BYTES * shape[0]


@cache
def quantized_weight_parts(m: ModelSpec, spec: "AdapterSpec") -> tuple[int, int]:
    """The frozen base model loaded quantized, in two parts: bytes of its quantized weights
    (``bnb_quantized``: NF4 with double quantization, ``nf4_bytes``, or int8, ``int8_bytes``) and
    elements of every other parameter (kept in the 16-bit load dtype)."""
    if spec.int8:
        return _weight_parts(m, lambda t: int8_bytes(t.shape))
    return qlora_weight_parts(m, True)


#: The largest safetensors shard of a checkpoint (bytes), the most a quantizing load holds on the
#: host at once. Published 70B checkpoints: Llama-3.1-70B 30 shards, model-00001-of-00030 4.6 GiB
#: (index total_size 141,107,412,992); Llama-2-70b-hf 15 shards, ~9.2 GB each (total_size
#: 137,953,316,864). Assumption: 10 GB, above both (the checkpoint's own index is not read).
CHECKPOINT_SHARD_BYTES = 10 * 10**9


def quantized_load_host_bytes(m: ModelSpec, spec: "AdapterSpec", ranks_per_node: int, fsdp: bool) -> tuple[int, int]:
    """Host RAM per node while a quantized base (QLoRA's NF4, LLM.int8()) loads, in bytes: (the
    load's peak, the part of it still held when training's host state is allocated).

    transformers reads a checkpoint shard by shard (``load_shard_file`` per shard; its docs: "each
    shard is loaded sequentially after the previous shard is loaded") and the bitsandbytes
    quantizer turns each weight into ``Params4bit`` / ``Int8Params`` as it moves to the GPU
    (``create_quantized_param``), so a loading process holds at most one shard of the 16-bit
    checkpoint, never the whole model: min(16-bit model, ``CHECKPOINT_SHARD_BYTES``) per process,
    and every process of a node loads (a quantized model is read by every rank, FSDP included).
    Under FSDP with ``cpu_ram_efficient_loading`` (planner's FSDP files), local rank 0 then keeps
    the quantized model on the CPU (``param_to = "cpu"``) to broadcast it (``sync_module_states``):
    its quantized weights plus the other parameters in 16 bit, until FSDP has wrapped the model,
    beside the flat parameters FSDP's CPU offload allocates while wrapping (the second figure).
    Against PEFT's guide (Llama-2-70b-hf, 2x24 GB, FSDP + CPU offload, r 8, 2 x 2048: "CPU RAM
    usage is around 107 GB"), planner reads ~80 GB: the rest is not modelled. Sources: transformers
    modeling_utils.py and quantizers/quantizer_bnb_4bit.py (4.5x), accelerate docs "FSDP"
    (``fsdp_cpu_ram_efficient_loading``: "only the first process loads the pretrained model
    checkpoint"). Parallel shard loading (``HF_ENABLE_PARALLEL_LOADING``, off by default) would
    hold several shards: not modelled."""
    model_16bit = params.total_parameters(m) * 2
    per_process = min(model_16bit, CHECKPOINT_SHARD_BYTES)
    kept = 0
    if fsdp:
        packed, rest = quantized_weight_parts(m, spec)
        kept = packed + rest * 2
    return ranks_per_node * per_process + kept, kept


def int8_forward_temporaries(m: ModelSpec) -> int:
    """Bytes per token an LLM.int8() matmul of the frozen base allocates while it runs forward, the
    largest over the layer's quantized matmuls (bitsandbytes ``MatMul8bitLt.forward``): the input
    quantized row-wise to int8 (``int8_vectorwise_quant``, d_in), the int32 product
    (``int8_linear_matmul``, 4 d_out) and its fp16 dequantization (``int8_mm_dequant``, 2 d_out)
    coexist; the fp16 cast of a bf16 input is freed once quantized. Outlier columns (``threshold``
    6.0) add an fp16 matmul over the few outlier features: not counted (data dependent)."""
    return max(t.shape[1] + 6 * t.shape[0] for t in layer_quantized(m))


def int8_traffic(m: ModelSpec, compute_bytes: int) -> tuple[float, float]:
    """Memory traffic of the frozen base's LLM.int8() matmuls beyond the matmuls themselves, all
    layers: (bytes per token of one forward, bytes of one backward's weight dequantization).

    - Forward, per quantized (out, in) matmul and token: the input cast to fp16 (read c, write 2
      per input element), quantized (read 2, write 1), the int32 product dequantized (read 4,
      write 2 per output element) and cast back to the compute dtype where it is not fp16 (read 2,
      write c): (c + 5) d_in + (8 + c) d_out bytes (fp16 itself skips that last cast: counted anyway).
    - Backward: ``CB.to(dtype, copy=True).mul_(SCB / 127)``, the whole weight dequantized once per
      backward (read 1, write c, then read c and write c): (1 + 3 c) per element, per token none.
    Source: bitsandbytes 0.50 ``autograd/_functions.py`` ``MatMul8bitLt``. Unit: bytes."""
    quantized = layer_quantized(m)
    forward = sum((compute_bytes + 5) * t.shape[1] + (8 + compute_bytes) * t.shape[0] for t in quantized) * m.num_layers
    backward = sum((1 + 3 * compute_bytes) * t.numel for t in quantized) * m.num_layers
    return forward, backward


def _first_matmuls(m: ModelSpec) -> tuple[params.ParamTensor, ...]:
    """The matmuls that read a decoder layer's input (through its first norm): q, k, v or the
    fused qkv."""
    return tuple(t for t in params.layer_matmuls(m) if t.name.startswith(("self_attn.q_proj", "self_attn.k_proj",
                                                                        "self_attn.v_proj", "self_attn.qkv_proj")))


def _inputs_without_gradient(m: ModelSpec, targets: str) -> tuple[params.ParamTensor, ...]:
    """Layer 0's matmuls whose input needs no gradient when the embedding is frozen (autograd
    computes an input gradient only for a tensor that depends on something trained): those reading
    the layer's input (``_first_matmuls``); where the target set wraps nothing in the attention
    (``mlp``), also its output projection (the attention then depends on frozen weights alone) and
    the MLP's input matmuls, which read the residual stream (gate and up, the fused gate_up, fc_in)."""
    first = _first_matmuls(m)
    if any(t.name.startswith("self_attn.") for t in wrapped(m, targets)):
        return first
    return first + tuple(t for t in params.layer_matmuls(m)
                         if t.name.startswith(("self_attn.o_proj", "mlp.gate", "mlp.up", "mlp.fc_in")))


def folded(t: params.ParamTensor) -> bool:
    """Whether peft reaches this wrapped weight as a parameter (``target_parameters``, a MoE's
    router and expert tensors: ``ParamWrapper`` adds B A to the weight each forward) rather than
    as a module whose input it multiplies by A and B."""
    return t.routed or t.name.startswith("mlp.router")


def adapter_matmul_flops_per_token(m: ModelSpec, targets: str, rank: int, input_grads: bool = False) -> float:
    """Matmul FLOPs per token of one training step (forward and backward) with the base model
    frozen and a LoRA adapter trained (one multiply-add = 2 FLOPs; routed experts: top-k).

    - Frozen weights, embeddings and head included: forward 2 per active matmul parameter;
      backward only the gradient with respect to their input, 2 more, and none where the input
      needs no gradient (``_inputs_without_gradient``: the first layer's q/k/v read the embeddings'
      output, which a frozen embedding leaves without one; with MLP-only adapters, the rest of
      that layer's attention and its MLP inputs too), unless ``input_grads``:
      ``enable_input_require_grads``, which Trainer calls for gradient checkpointing with peft.
      No weight gradients.
    - Each wrapped module weight (out, in): forward x A^T then B^T, 2 r (in + out); backward the
      weight gradients of A and B, 2 r (in + out), and the input gradients through B and A,
      2 r (in + out), less A's where its input needs none (as above).
    - A folded weight (``folded``: W + B A, per micro-batch in ``fold_flops_per_micro_batch``)
      runs the base matmul only, but its weight now needs a gradient: 2 more per active element.
    Checked against torch's FlopCounterMode on real peft models (tests/test_adapters.py)."""
    base = compute.matmul_flops_per_token(m)
    first = _inputs_without_gradient(m, targets)
    skipped = 0 if input_grads else 2 * sum(t.numel for t in first)  # layer 0's input gradients none needs
    adapter = 0.0
    for t in wrapped(m, targets):
        if folded(t):
            adapter += 2 * params.active_elements(m, t) * m.num_layers
            continue
        d_out, d_in = t.shape
        adapter += 6 * lora_rank(m, t, rank) * (d_in + d_out) * m.num_layers
        if t in first and not input_grads:
            skipped += 2 * rank * d_in  # layer 0's x A^T needs no input gradient either
    return 2 * base + adapter - skipped


def training_flops_per_token(m: ModelSpec, seq_len: float, spec: AdapterSpec | None) -> float:
    """Useful FLOPs per trained token, no recomputation (MFU's numerator): the 6N-style
    ``compute.model_flops_per_token`` in full fine-tuning; with an adapter, its step's matmuls
    (``adapter_matmul_flops_per_token``: no frozen weight gradients) and the attention's forward
    and backward (3x forward)."""
    if spec is None:
        return compute.model_flops_per_token(m, seq_len)
    return adapter_matmul_flops_per_token(m, spec.targets, spec.rank) + 3.0 * compute.attention_flops_per_token(m, seq_len)


def fold_flops_per_micro_batch(m: ModelSpec, targets: str, rank: int) -> float:
    """FLOPs per micro-batch of folding LoRA into the ``folded`` weights, all layers, independent
    of the tokens (0 where none is wrapped). Traced, peft 0.21:
    - expert tensors: ``_LoraFactorsProxy`` runs ``baddbmm(W, lhs, rhs)``, (E, out, r) x
      (E, r, in), 2 E out in r FLOPs, twice per forward (the experts' two wrappers are nested,
      gate_up's around down's, and each fold runs again under the other's parametrization), and
      its backward the gradients of both factors once: 8 E out in r;
    - the router: B A (2 out in r) once per forward, and the gradients of both factors: 6 out in r.
    Checked with torch's FlopCounterMode."""
    total = 0.0
    for t in wrapped(m, targets):
        if folded(t):
            d_out, d_in = t.shape
            total += (8 * t.experts if t.routed else 6) * d_out * d_in * lora_rank(m, t, rank)
    return total * m.num_layers


#: The activation-list names of norm tensors saved only for the norm weight's gradient: the
#: normalised input of RMSNorm's weight multiply (Gemma's fp32 one of ``1 + weight``).
#: LayerNorm's saved input, mean and rstd serve its input gradient too.
NORM_WEIGHT_INPUTS = ("norm normalised", "norm fp32 normalised")
#: The gated MLP's intermediates in planner.cost.activations' list: fp32 over a k-bit prepared base
#: (``adapter_layer_saved``'s ``prepared``).
MLP_INTERMEDIATES = ("gate", "act(gate)", "up", "act*up")


def _readers(m: ModelSpec) -> tuple[tuple[params.ParamTensor, ...], ...]:
    """A decoder layer's matmul weights grouped by the input they read, in order: q, k and v (or
    the fused qkv: ``_first_matmuls``), the attention's output projection, the MLP's input matmuls
    (gate and up, the fused gate_up, fc_in) and its output matmul."""
    matmuls = params.layer_matmuls(m)
    return (_first_matmuls(m),
            tuple(t for t in matmuls if t.name.startswith("self_attn.o_proj")),
            tuple(t for t in matmuls if t.name.startswith(("mlp.gate", "mlp.up", "mlp.fc_in"))),
            tuple(t for t in matmuls if t.name.startswith(("mlp.down", "mlp.fc_out"))))


@cache
def _weight_gradient_inputs(m: ModelSpec, fused: bool, sp: int = 1) -> dict[str, tuple[str, ...]]:
    """The tensors of planner.cost.activations' layer list that a decoder layer saves only for its
    matmuls' weight gradients, each with the weights of the matmuls that read it (a frozen matmul
    needs its weight, not its input, for the input gradient: ``linear``'s backward saves the input
    only when the weight requires grad; bitsandbytes' ``MatMul4Bit`` likewise).

    Not listed, because another op saves them too: SDPA's output (its own backward reads it; Llama-
    style o_proj reads it as a view), the gated MLP's gate and up (the product saves both), a plain
    MLP's activation input. The MLP's output matmul reads the plain MLP's activation output or the
    gated MLP's product. Source: the activation lists' own docstrings; traced per family
    (tests/test_adapters.py)."""
    first, (attn_out,), mlp_in, mlp_out = (tuple(t.name for t in group) for group in _readers(m))
    inputs = {"qkv input": first, "mlp input": mlp_in,
              "act output" if m.mlp_kind == MlpKind.PLAIN else "act*up": mlp_out}
    if m.family == "gpt2":  # GPT-2's own attention module (planner.cost.activations._gpt2_attention)
        if not fused:
            inputs["out-proj input"] = (attn_out,)
        return inputs
    if not fused:
        inputs["attn out (contiguous)"] = (attn_out,)
    elif m.fused_qkv or sp > 1:  # (``sp``: a split sequence, whose o_proj input is a copy of its own)
        inputs[activations.O_PROJ_COPY] = (attn_out,)
    return inputs


@cache
def adapter_layer_saved(m: ModelSpec, dt, fused: bool, seq_len: int, targets: str, rank: int,
                        dropout: float, cast: bool, dora: bool = False,
                        keeps_inputs: bool = False, copy_bytes: int | None = None,
                        prepared: bool = False, sp: int = 1, heads: int = 1) -> tuple[tuple[str, float], ...]:
    """Bytes per token one decoder layer saves (no checkpointing) when its weights are frozen and
    the target set's matmuls carry LoRA adapters (peft ``LoraLayer.forward``: ``base(x) +
    B(A(dropout(x.to(A's dtype)))) * scaling``), in the activation dtypes ``dt``.

    - The full fine-tuning list (planner.cost.activations.layer_saved) less what is saved only for
      frozen weights' gradients: the norms' normalised inputs (``NORM_WEIGHT_INPUTS``) and the
      matmul inputs of ``_weight_gradient_inputs``. A matmul input stays only where a wrapped
      reader's A saves that very tensor: no dropout and no cast (q, k and v then share it).
    - ``cast``: the adapters' dtype is not the activations' (fp32 adapters over a 16-bit model).
      peft casts A's input to fp32 (``_cast_input_dtype``); under autocast, autocast casts it back
      to the compute dtype, so each wrapped matmul's A saves its own copy, c per input element.
      Without autocast (fp32 adapters under bf16-pure: peft's default ``autocast_adapter_dtype``)
      A computes in fp32 and saves its fp32 copy, and B A's fp32 output: ``copy_bytes`` (4) per
      element where the others are c.
    - ``dropout`` > 0: each wrapped matmul's own dropout saves its mask (``activations.DROPOUT_MASK_BYTES`` per
      element) and A saves the dropped input (c per element; under ``cast`` its 16-bit copy).
    - Every wrapped matmul: A's output, r elements in the compute dtype, which B saves.
    - ``dora``: peft's DoRA output ``(m - 1) * base + m * lora * s`` multiplies the trained magnitude
      by the base and the adapter outputs, so both are saved: 2 c per output element. Measured on
      tiny Llama, GPT-2 and Phi-3 layers on the CPU (bf16-mixed, bf16-pure, fp32, both target sets),
      the rest of DoRA's list differs from this by -10 % to +10 % of its size; not exact yet.
    - ``keeps_inputs``: the quantized base's matmuls keep their inputs (``kept_input_bytes``: an
      LLM.int8() base, bitsandbytes ``MatMul8bitLt``: ``ctx.tensors = (CAt, subA, A)`` whenever the
      input needs a gradient; NF4 before bitsandbytes 0.43.2), so the matmul inputs stay as in full
      fine-tuning; the norms' normalised inputs still go (their weights are frozen). A test walks a
      real int8 peft model's autograd graph.
    - ``prepared``: the quantized base went through peft's ``prepare_model_for_kbit_training``
      (``dt``: 16-bit compute under autocast, an fp32 residual stream). Its fp32 RMSNorm weights
      make each norm's output fp32 (``weight * hidden.to(input_dtype)``, fp32 from the first
      norm on); bitsandbytes' ``Linear4bit`` casts its input to the compute dtype and its output
      back to the input's dtype, so the projections reading a norm's output return fp32 and the
      residual stream turns fp32 at the first layer's MLP. The gated MLP's
      gate, activation and up are fp32 (``mlp_saved`` at 4 bytes); the attention kernel saves
      its own 16-bit casts of q, k and v (autocast's SDPA, transformers' flash-attention cast), as
      in the 16-bit list; the output projection reads the kernel's 16-bit output. Each wrapped
      matmul reading an fp32 input (q, k, v, gate, up, down) saves autocast's own 16-bit cast of
      it in its A (c per input element), whatever the dropout. Modelled where
      ``kbit_prep_supported`` says so, under autocast only.
    The adapters' weights (and under autocast their 16-bit casts) are per layer, not per token: the
    ledger counts them. Dense models only; a MoE's folded expert adapters are ledger rows of their
    own. Traced on real peft models (tests/test_adapters.py)."""
    if m.is_moe or (dt.upcast and not prepared) or (prepared and kbit_prep_supported(m)):
        raise ValueError("adapter_layer_saved: dense models over 16-bit or fp32 activations only (no autocast "
                         "over fp32 weights, whose per-matmul input casts are another list), or a k-bit prepared "
                         "base where kbit_prep_supported says so")
    c = dt.compute
    copy = copy_bytes or c  # A's input copy and output: the compute dtype, or fp32 without autocast
    on = {t.name: t for t in wrapped(m, targets)}
    own_copy = dropout > 0 or cast
    inputs = {} if keeps_inputs else _weight_gradient_inputs(m, fused, sp)
    full = activations.layer_saved(m, activations.DTypes(c, c), fused, seq_len, sp, heads)
    fp32_inputs: set[str] = set()
    if prepared:  # the MLP's intermediates in fp32, the rest of the list as at 16 bit
        mlp32 = dict(activations.mlp_saved(m, activations.DTypes(activations.FP32, activations.FP32)))
        full = tuple((name, mlp32.get(name, size) if name in MLP_INTERMEDIATES else size) for name, size in full)
        fp32_inputs = {t.name for group in _readers(m) for t in group if not t.name.startswith("self_attn.o_proj")}
    unknown = set(inputs) - {name for name, _ in full}
    if unknown:  # the activation lists renamed a tensor: fail loudly rather than keep it silently
        raise ValueError(f"adapter_layer_saved: {sorted(unknown)} not in {m.family}'s layer list")
    saved = []
    for name, size in full:
        if name in NORM_WEIGHT_INPUTS:
            continue
        readers = inputs.get(name)
        if readers is None or (not own_copy and any(r in on and r not in fp32_inputs for r in readers)):
            saved.append((name, size))
    for t in on.values():
        d_in = t.shape[1]
        short = t.name.removesuffix(".weight")
        if dropout > 0:
            saved.append((f"{short} dropout mask", activations.DROPOUT_MASK_BYTES * d_in))
        if own_copy or t.name in fp32_inputs:
            saved.append((f"{short} adapter input", (copy if cast else c) * d_in))
        saved.append((f"{short} lora_A output", (copy if cast else c) * lora_rank(m, t, rank)))
        if dora:
            saved.append((f"{short} DoRA base and adapter outputs", 2 * c * t.shape[0]))
    return tuple(saved)


#: The first bitsandbytes whose ``MatMul4Bit`` keeps only the packed weight for backward
#: (``ctx.tensors = (None, B)``): before it, ``(A, B)``, the input too, though the input gradient
#: needs only the weight (bitsandbytes PR #1270, "fix QLoRA mem bug: delete useless buffered
#: activation", 2024-07-16, first released in 0.43.2).
NF4_FREES_INPUT_SINCE = (0, 43, 2)


@cache
def kept_input_bytes(m: ModelSpec, dt) -> float:
    """Bytes per token one decoder layer's quantized base matmuls keep from their forward until
    their backward when they keep their inputs (``AdapterSpec.base_keeps_inputs``): one copy of
    each distinct input, in the compute dtype (q, k and v read one; gate and up one): the layer's
    normalised input, the attention output into the output projection, the normalised MLP input,
    and the MLP's output-projection input.

    bitsandbytes keeps these as attributes of the autograd context (``MatMul8bitLt``:
    ``ctx.tensors = (CAt, subA, A)``; ``MatMul4Bit`` before 0.43.2: ``(A, B)``), not through
    ``save_for_backward``, so a checkpoint's saved-tensor hooks never see them: non-reentrant
    checkpointing (planner's launch, the Trainer's ``use_reentrant: False``) keeps them for every
    layer, as no checkpointing does. Reentrant checkpointing runs the forward without a graph and
    keeps them for the recomputed layer only. Layer 0's q, k and v keep theirs only where the
    embedding output requires grad (``enable_input_require_grads``): counted for every layer (one
    input more at most). Unit: bytes per token per layer. Source: bitsandbytes 0.50
    autograd/_functions.py, 0.42.0 for ``MatMul4Bit``; tests/test_adapters.py walks a real
    checkpointed int8 model's graph."""
    return dt.compute * sum(group[0].shape[1] for group in _readers(m))


def casts_adapter_input(spec: AdapterSpec, adapter_bytes: int, compute_bytes: int) -> bool:
    """Whether each wrapped matmul's adapter input is a cast copy (``adapter_layer_saved``'s
    ``cast``): peft's LoRA layer casts the input to the adapters' dtype (``_cast_input_dtype``), a
    copy where fp32 adapters run under autocast over 16-bit activations. Its bitsandbytes layers
    (``Linear4bit``, QLoRA; ``Linear8bitLt``, lora-int8) cast only without autocast
    (``requires_conversion = not torch.is_autocast_enabled()``, CUDA's autocast), where the adapters
    are in the activations' dtype: never a copy. Source: peft 0.21 ``tuners/lora/bnb.py``."""
    return adapter_bytes != compute_bytes and not (spec.nf4 or spec.int8)


@dataclass(frozen=True)
class PathTraffic:
    """Bytes per token the LoRA path moves through memory outside its matmuls' arithmetic,
    forward and backward (``lora_module_traffic``, ``adapter_path_traffic``)."""

    forward: float
    backward: float


def lora_module_traffic(d_in: int, d_out: int, compute_bytes: int, adapter_bytes: int, cast: bool,
                        autocast: bool, dropout: float) -> PathTraffic:
    """Memory traffic of peft's LoRA path around one wrapped matmul, bytes per token, forward and
    backward: every tensor of a token's width an element-wise kernel reads or writes, and the
    activations the adapter matmuls read or write (their weights and the rank-wide tensors, ``r``
    elements a token, are left out; so is the base matmul, the frozen model's own). Unit: bytes
    per token; assumption: each kernel reads and writes its tensors once (eager PyTorch, no
    fusion), dropout is CUDA's fused ``native_dropout`` (read x; write the output and a 1-byte
    mask) and its backward reads the gradient and the mask.

    Source: peft 0.13-0.21 ``tuners/lora/layer.py`` ``Linear.forward``: ``result = base(x)``;
    ``x = x.to(A's dtype)`` (a copy where fp32 adapters sit over 16-bit activations: ``cast``);
    ``result = result + B(A(dropout(x))) * scaling``; ``result.to(result's dtype)``. With c the
    activations' bytes and a the adapter input's (the adapters' own where cast, else c); under
    autocast the cast input is cast back to c for A and B writes c; without autocast B writes the
    adapters' dtype, which the sum promotes, then casts back:
    - forward: cast (read c, write a) d_in; dropout (read a, write a + mask) d_in; autocast's
      recast (read a, write c) d_in; A reads its input d_in; B writes d_out; scaling reads and
      writes d_out; the sum reads both outputs and writes the wider; where promoted, the cast
      back reads and writes d_out;
    - backward: the promotion's two gradient casts d_out; scaling d_out; B's weight and input
      gradients each read the output gradient d_out; A's weight gradient reads its input and its
      input gradient writes one, d_in; the recast, dropout and cast mirrored, d_in; and the
      input's two gradients (the base matmul's and the adapter's) summed: read 2, write 1, d_in.
    The bitsandbytes layers (QLoRA, lora-int8) cast only without autocast, where the adapters are
    in the activations' dtype: there ``cast`` is False (``casts_adapter_input``). Counted against
    the aten operations of a real peft layer on the CPU (tests/test_adapters.py)."""
    c = compute_bytes
    a = adapter_bytes if cast else c
    recast = cast and autocast
    mm_in = c if (recast or not cast) else a  # what A reads
    q = a if (cast and not autocast) else c  # what B writes
    wide = max(c, q)
    drop = dropout > 0
    mask = activations.DROPOUT_MASK_BYTES
    fwd_in = cast * (c + a) + drop * (2 * a + mask) + recast * (a + c) + mm_in
    fwd_out = q + 2 * q + (c + q + wide) + (q != c) * (wide + c)
    bwd_in = 2 * mm_in + recast * (c + a) + drop * (2 * a + mask) + cast * (a + c) + 3 * c
    bwd_out = (q != c) * 2 * (c + q) + 2 * q + 2 * q
    return PathTraffic(fwd_in * d_in + fwd_out * d_out, bwd_in * d_in + bwd_out * d_out)


@cache
def adapter_path_traffic(m: ModelSpec, targets: str, compute_bytes: int, adapter_bytes: int, cast: bool,
                         autocast: bool, dropout: float) -> PathTraffic:
    """``lora_module_traffic`` summed over one decoder layer's wrapped matmuls (a MoE's folded
    expert and router adapters, added to their weights, have no such path), bytes per token."""
    forward = backward = 0.0
    for t in wrapped(m, targets):
        if folded(t):
            continue
        d_out, d_in = t.shape
        one = lora_module_traffic(d_in, d_out, compute_bytes, adapter_bytes, cast, autocast, dropout)
        forward += one.forward
        backward += one.backward
    return PathTraffic(forward, backward)


def adapter_backward_transient_bytes(m: ModelSpec, targets: str, adapter_bytes: int, compute_bytes: int) -> float:
    """Gradient temporaries an adapter adds while a layer runs backward, bytes per token: where
    peft casts the adapter's input to the adapters' dtype (fp32 adapters under autocast), the
    widest wrapped matmul's input gradient comes back through A's autocast copy and peft's cast in
    that dtype: two tensors of d_in elements at the adapters' bytes. 0 where the adapters compute
    in the activations' dtype. Fitted to the traced matrix (benchmarks/adapter_traced_matrix.py:
    full checkpointing, bf16-mixed, where a layer's recompute and backward is the backward phase's
    peak; with dropout and without, bf16-pure adds nothing measurable)."""
    if adapter_bytes == compute_bytes:
        return 0.0
    return 2.0 * adapter_bytes * max(t.shape[1] for t in wrapped(m, targets))
