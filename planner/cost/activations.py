"""Activation memory: the tensors autograd saves for backward, per token, per decoder layer.

Unit: bytes per token (multiply by micro_batch_size * seq_len). Each list names the tensors a
family's transformers forward actually saves, so the dtype of each can differ; ``fused`` is fused
attention (SDPA's flash / memory-efficient kernels), else eager attention:

* ``c``: bytes of the compute dtype (2 for bf16/fp16, 4 for fp32),
* ``r``: bytes of the residual stream. Under torch autocast with fp32 parameters (bf16-mixed
  without sharding) the embedding output and every residual add stay fp32 (``r = 4``) while
  matmul outputs are bf16; with bf16 parameters (DeepSpeed, FSDP param_dtype, bf16-pure) r = c.

Sources: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), Sec. 4 (the s*b*h*(34 + 5*a*s/h) GPT block); the transformers
modeling files (RMSNorm upcasts to fp32 and saves the fp32 input; SDPA with ``enable_gqa``
saves un-repeated k/v; eager attention repeats k/v and saves fp32 softmax probabilities);
torch's SDPA flash/efficient kernels save q, k, v, output and a fp32 log-sum-exp per head and
query. Assumptions are stated where a list is not a direct reading of the code; issue 6's traced
probes check every list against FakeTensorMode + MemTracker.
"""

from dataclasses import dataclass
from functools import cache

from planner.core.specs import MlpKind, ModelSpec, NormKind
from planner.cost import params, sequence
from planner.cost.params import ParamTensor

FP32 = 4
#: Bytes per element of a dropout mask in training: CUDA's fused ``native_dropout`` saves a boolean
#: mask (aten/native/Dropout.cpp ``is_fused_kernel_acceptable``: CUDA, XPU, lazy and privateuse1
#: tensors). On the CPU torch's ``_dropout_impl`` saves a noise tensor in the input's dtype instead
#: (the traced probe sends dropout to ``native_dropout``: probes/model_setup.py ``gpu_dropout``).
DROPOUT_MASK_BYTES = 1


@dataclass(frozen=True)
class DTypes:
    """Byte sizes in force for one configuration."""

    compute: int  # c: matmul outputs, attention tensors
    residual: int  # r: the residual stream between blocks

    @property
    def upcast(self) -> bool:
        """Autocast over fp32 parameters: the residual stream and the norms' outputs stay fp32
        while matmuls run in 16 bit, so every matmul casts its own copy of a norm's output
        (autocast caches the casts of leaf tensors, the weights, only) and ops autocast lists as
        fp32 (softmax, layer_norm) return fp32. Source: torch.amp autocast op reference."""
        return self.residual > self.compute


Saved = list[tuple[str, float]]  # (tensor, bytes per token)

# The public functions below are memoized: the search calls them with the same
# (model, dtypes, fused attention, seq_len) for every candidate that shares them. They return tuples.


def korthikanti_layer_bytes(seq_len: int, micro_batch: int, hidden: int, heads: int) -> float:
    """Bytes one GPT block saves with 16-bit activations, eager attention and dropout.

    s*b*h*(34 + 5*a*s/h). Source: Korthikanti et al. 2022, Eq. (1). A reference formula: the
    gpt2 family with eager attention, dropout and 16-bit activations reproduces it exactly.
    """
    s, b, h, a = seq_len, micro_batch, hidden, heads
    return s * b * h * (34 + 5 * a * s / h)


def _norm(m: ModelSpec, width: int, input_bytes: int, rows: int = 1) -> Saved:
    """What one norm over ``rows`` rows of ``width`` per token saves (excluding its output, which
    its consumer saves).

    RMSNorm (Llama): ``x.to(fp32)`` (saved by pow; a no-op when x is fp32), the fp32 rsqrt of
    each row's mean square (saved by the product) and the normalised tensor cast back to x's
    dtype (saved by the weight multiply).
    Gemma RMSNorm: computes in fp32 and multiplies by (1 + weight): fp32 input, fp32 rsqrt per
    row and fp32 normalised tensor are saved (the (1 + weight) sum is weight-sized, per layer,
    not per token: omitted). LayerNorm (GPT-2, StarCoder2): its input and native_layer_norm's fp32
    mean and rstd per row. Traced (benchmarks/traced_matrix.py, one layer's activations).
    """
    if m.norm_kind == NormKind.RMS:
        return [("norm fp32 input", FP32 * width * rows), ("norm rsqrt fp32", FP32 * rows),
                ("norm normalised", input_bytes * width * rows)]
    if m.norm_kind == NormKind.RMS_GEMMA:
        return [("norm fp32 input", FP32 * width), ("norm rsqrt fp32", FP32 * rows),
                ("norm fp32 normalised", FP32 * width)]
    return [("layernorm input", input_bytes * width), ("layernorm mean, rstd fp32", 2 * FP32 * rows)]


def _inputs(name: str, dt: DTypes, width: int, readers: int) -> Saved:
    """The 16-bit input a block's projections save: one tensor shared by all ``readers`` matmuls,
    or, under autocast over fp32 parameters (``DTypes.upcast``), each matmul's own cast of the
    fp32 norm output (Llama's q, k and v each save one)."""
    return [(f"{name} (x{readers} autocast casts)" if dt.upcast and readers > 1 else name,
             dt.compute * width * (readers if dt.upcast else 1))]


def masked_sdpa(m: ModelSpec, seq_len: int) -> bool:
    """Whether SDPA gets a materialised mask rather than the causal flag: a sliding window no longer
    than the sequence (transformers masking_utils ``_ignore_causal_mask_sdpa``: local attention
    with kv_length >= the window)."""
    return m.sliding_window is not None and seq_len >= m.sliding_window


def mask_bytes(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int) -> float:
    """Bytes per token of the attention masks the model materialises once per forward and
    checkpointing keeps (they are inputs of every checkpointed layer): (b, 1, s, s) per kind, so s
    per token of the micro-batch. Eager attention always builds one, additive, in the embeddings'
    dtype (the residual's, r); SDPA only with a sliding window (``masked_sdpa``), boolean (1 byte).
    Gemma-2 alternates sliding and global layers: two kinds from two layers on. Without
    checkpointing they are freed when the model's forward returns (before the loss's peak).
    Traced (benchmarks/traced_matrix.py)."""
    if fused and not masked_sdpa(m, seq_len):
        return 0.0
    kinds = 2 if m.family == "gemma2" and m.num_layers > 1 else 1
    return kinds * seq_len * (1 if fused else dt.residual)


#: eager attention's compute-dtype copy of the fp32 probabilities, which the value matmul saves
PROBS_COPY = "probs in compute dtype"


#: o_proj's input where it is a tensor of its own, not a view of the kernel's output
O_PROJ_COPY = "attn out made contiguous"


def _attention_core(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int, sp: int = 1, heads: int = 1) -> Saved:
    """Tensors the attention kernel saves, from post-RoPE q/k/v to its output. ``sp``: the ranks
    each sequence is split over (planner/cost/sequence.py), under which o_proj's input is a tensor
    of its own: Ulysses' all-to-all back to the rank's positions (DeepSpeed
    ``UlyssesSPAttentionHF._partition_global_sequence``'s contiguous copy; traced: a rank of P holds
    one q-sized tensor per layer more than a plan of seq/P without it, and its recomputed layer one
    more in backward; tests/test_traced.py), or ring attention's merged output, (b, a, s, d)-
    contiguous, which transformers' transpose back copies (benchmarks/ring_attention_transients.py):
    one more output-sized row, in place of Phi-3's contiguous copy. ``heads``: the ranks the heads
    are split over (Ulysses' degree), under which the kernel saves the exchanged k and v (key/value
    heads fewer than ``heads`` repeated: ``sequence.kv_elements``); ring attention saves the rank's
    own k and v. One key/value head for several query heads (a rank of a tensor-parallel group,
    planner/cost/tensor.py): transformers' ``repeat_kv`` (expand, then reshape) is a view of it, so
    the "repeated" k and v saved are that one head (traced: tests/test_tensor_parallel.py, Gemma-2
    eager at 4 ranks)."""
    c, a, q, kv = dt.compute, m.num_heads, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    s = seq_len
    repeated = kv if m.num_kv_heads == 1 else q  # (repeat_kv's view of a single head)
    saved: Saved
    if fused:
        # enable_gqa (no mask: the causal flag): k/v are not repeated. The kernel's output takes q's
        # memory layout: q made by RoPE from the transposed projection is (b, s, a, d)-strided, so
        # the output's transpose back is o_proj's input as a view; Phi-3's RoPE concatenates the
        # rotary and pass-through parts (q is (b, a, s, d)-contiguous), so that transpose is copied.
        # With a materialised mask (a sliding window no longer than the sequence: ``masked_sdpa``)
        # k/v are repeated (no enable_gqa with a mask) and SDPA turns the boolean mask into an additive
        # one in q's dtype, per call, which the (memory-efficient) kernel saves: c*s per token per layer.
        if masked_sdpa(m, s):
            saved = [("q", c * q), ("k repeated", c * repeated), ("v repeated", c * repeated), ("additive mask", c * s)]
        else:
            kv = sequence.kv_elements(m, heads) if heads > 1 else kv
            saved = [("q", c * q), ("k", c * kv), ("v", c * kv)]
        saved += [("attn out", c * q), ("logsumexp fp32", FP32 * a)]
        return saved + ([(O_PROJ_COPY, c * q)] if m.fused_qkv or sp > 1 else [])
    saved = [("q", c * q), ("k repeated", c * repeated), ("v repeated", c * repeated)]
    if m.attn_logit_softcapping:
        saved.append(("tanh(scores/cap)", c * a * s))
    saved.append(("softmax fp32", FP32 * a * s))
    if m.attention_dropout > 0:
        # dropout keeps its mask, the value matmul the dropped probabilities: the compute-dtype
        # copy of the softmax output (``.to(query.dtype)``) is dropout's input, which it does not save
        saved += [("attn dropout mask", DROPOUT_MASK_BYTES * a * s), ("dropped probs", c * a * s)]
    elif c != FP32:
        saved.append((PROBS_COPY, c * a * s))
    saved.append(("attn out (contiguous)", c * q))
    return saved


def _softmax_bytes(m: ModelSpec, dt: DTypes) -> int:
    """Bytes per element of eager attention's softmax: fp32 where the model asks for it
    (``softmax(..., dtype=float32)``: every family but GPT-2) or autocast puts it on its fp32 list
    (GPT-2 under autocast over fp32 parameters), else the compute dtype. Source: the transformers
    eager_attention_forward of each family; torch.amp's op lists."""
    return FP32 if m.family != "gpt2" or dt.upcast else dt.compute


def _gpt2_attention(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int) -> Saved:
    """Korthikanti's attention block list (eager) or the SDPA equivalent.

    Eager: ``softmax`` is on autocast's fp32 list, so under autocast over fp32 parameters it
    saves fp32 probabilities and ``.type(value.dtype)`` makes the 16-bit copy the value matmul
    (or, with dropout, the dropped probabilities) saves; otherwise softmax saves compute-dtype
    probabilities. Source: transformers modeling_gpt2.eager_attention_forward; traced."""
    c, h, a, s = dt.compute, m.hidden_size, m.num_heads, seq_len
    if fused:
        return [("q k v", 3 * c * h), ("attn out", c * h), ("logsumexp fp32", FP32 * a)]
    saved: Saved = [("q k", 2 * c * h), ("softmax", _softmax_bytes(m, dt) * a * s)]
    if m.attention_dropout > 0:
        saved += [("attn dropout mask", DROPOUT_MASK_BYTES * a * s), ("dropped probs", c * a * s)]
    elif dt.upcast:
        saved.append((PROBS_COPY, c * a * s))
    return saved + [("v", c * h), ("out-proj input", c * h)]


def mlp_intermediates(m: ModelSpec, dt: DTypes) -> Saved:
    """What one MLP's own ops save, bytes per token: its intermediate tensors (not its input)."""
    c, h, f, k, e = dt.compute, m.hidden_size, m.intermediate_size, m.experts_per_token, m.num_experts
    if m.mlp_kind == MlpKind.PLAIN:
        if m.activation == "gelu_new":
            # transformers NewGELUActivation: 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) in Python
            # ops; pow saves x, tanh its output, the final product both factors (0.5x and 1 + tanh)
            return [("act input", c * f), ("tanh output", c * f), ("0.5x", c * f), ("1 + tanh", c * f),
                    ("act output", c * f)]
        # one op (StarCoder2's gelu_pytorch_tanh: F.gelu(approximate="tanh")) saves its input; its
        # output is the second matmul's input
        return [("act input", c * f), ("act output", c * f)]
    gated: Saved = [("gate", c * f), ("act(gate)", c * f), ("up", c * f), ("act*up", c * f)]
    if not m.is_moe:
        return gated
    # Mixtral: fp32 router softmax; each token is gathered into k experts and their outputs
    # are scaled by the routing weight (the product saves the expert output).
    per_expert = [("expert input", c * h)] + gated + [("expert out", c * h)]
    # routing bookkeeping per token: top-k indices, their sort and expert/token indices (int64),
    # the routing weights, their gathered copy (fp32) and their sum (fp32); traced (Mixtral-8x7B
    # layer, transformers 5 grouped_mm experts: 84 B per token at k = 2)
    routing = [("routing indices and weights", (4 * 8 + 2 * FP32) * k + FP32)]
    return [("router softmax fp32", FP32 * e)] + routing + [(f"{n} x{k}", b * k) for n, b in per_expert]


def _residual_dropout(m: ModelSpec) -> Saved:
    """What a block's residual dropout saves, bytes per token: dropout on the attention's or the
    MLP's output before the residual add (GPT-2 ``resid_pdrop``: an ``nn.Dropout`` after each
    ``c_proj``; StarCoder2 ``residual_dropout``: ``nn.functional.dropout`` after ``o_proj`` and after
    ``c_proj``) keeps its mask, one per element of the hidden width (``DROPOUT_MASK_BYTES``); the
    add saves nothing. Source: transformers modeling_gpt2.py, modeling_starcoder2.py; traced
    (benchmarks/traced_matrix.py: GPT-2; tests/test_traced.py: StarCoder2)."""
    return [("resid dropout mask", DROPOUT_MASK_BYTES * m.hidden_size)] if m.residual_dropout > 0 else []


def embedding_dropout_bytes(m: ModelSpec) -> float:
    """Bytes per token dropout on the embeddings' output saves (GPT-2 ``embd_pdrop``: ``nn.Dropout`` on
    the token plus position embeddings; StarCoder2 ``embedding_dropout``):
    its mask (``DROPOUT_MASK_BYTES`` per element of the hidden width), held from the forward's start
    until the backward reaches the embeddings, beside every layer's saved tensors in every
    checkpointing mode (it is outside the layers). Its output is the first layer's input, which the
    layer lists count. 0 without embedding dropout. Over frozen embeddings (an adapter) autograd
    keeps the mask only where the embeddings' output is made to require grad (transformers'
    activation_checkpointing_enable calls enable_input_require_grads); it is counted in every case,
    an upper bound by h bytes per token. Source: transformers modeling_gpt2.py (``GPT2Model.drop``),
    modeling_starcoder2.py (``Starcoder2Model.forward``); traced (tests/test_traced.py)."""
    return DROPOUT_MASK_BYTES * m.hidden_size if m.embedding_dropout > 0 else 0.0


@cache
def attention_saved(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int,
                    sp: int = 1, heads: int = 1) -> tuple[tuple[str, float], ...]:
    """Bytes per token the attention half of one decoder layer saves (no checkpointing): its norm,
    projections' inputs and the attention kernel's tensors (Gemma-2: and the post-attention norm),
    and its residual dropout's mask. ``sp``, ``heads``: the sequence and head splits
    (``_attention_core``)."""
    c, r, h = dt.compute, dt.residual, m.hidden_size
    if m.family == "gpt2":  # GPT-2's own attention module: one Conv1D c_attn, its own eager softmax
        return tuple(_norm(m, h, r) + _inputs("qkv input", dt, h, 1) + _gpt2_attention(m, dt, fused, seq_len)
                     + _residual_dropout(m))
    saved = _norm(m, h, r) + _inputs("qkv input", dt, h, 1 if m.fused_qkv else 3)
    if m.qk_norm:  # Qwen3: RMSNorm over head_dim on q and k before RoPE (input is bf16 matmul output)
        saved += _norm(m, m.head_dim, c, m.num_heads) + _norm(m, m.head_dim, c, m.num_kv_heads)
    if m.fused_qkv and fused:  # Phi-3 SDPA: v is a view of qkv_proj's output, so all of it stays alive
        # (eager: the value matmul saves a contiguous copy of v, so the projection's output is freed)
        saved.append(("fused qkv (kept by v view)", c * (m.num_heads + m.num_kv_heads) * m.head_dim))
    saved += _attention_core(m, dt, fused, seq_len, sp, heads)
    if m.norms_per_layer == 4:  # Gemma-2: post-attention norm on o_proj output (c)
        saved += _norm(m, h, c)
    return tuple(saved + _residual_dropout(m))


@cache
def mlp_saved(m: ModelSpec, dt: DTypes, tiled: bool = False) -> tuple[tuple[str, float], ...]:
    """Bytes per token the MLP half of one decoder layer saves (no checkpointing): its norm, input
    and intermediate tensors (Gemma-2: and the post-feedforward norm), and its residual dropout's
    mask. ``tiled`` (DeepSpeed's TiledMLP, strategies/tiled_mlp.py): of the MLP, only its input,
    which ``TiledMLP`` saves whole in the norm output's dtype (the residual's)."""
    c, r, h = dt.compute, dt.residual, m.hidden_size
    readers = 1 if m.fused_qkv or m.mlp_kind == MlpKind.PLAIN else 2  # gate_up, or gate and up (MoE: the router)
    if tiled:
        saved = _norm(m, h, r) + [("tiled MLP input", r * h)]
    else:
        saved = _norm(m, h, r) + _inputs("mlp input", dt, h, readers) + mlp_intermediates(m, dt)
    if m.norms_per_layer == 4:  # Gemma-2: post-feedforward norm on down_proj output
        saved += _norm(m, h, c)
    return tuple(saved + _residual_dropout(m))


@cache
def layer_saved(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int,
                sp: int = 1, heads: int = 1, tiled: bool = False) -> tuple[tuple[str, float], ...]:
    """Bytes per token one decoder layer saves with no checkpointing: its attention and MLP halves
    (``sp``, ``heads``: the sequence and head splits, ``_attention_core``; ``tiled``: a tiled MLP,
    ``mlp_saved``)."""
    return attention_saved(m, dt, fused, seq_len, sp, heads) + mlp_saved(m, dt, tiled)


@cache
def selective_matmuls(m: ModelSpec) -> tuple[tuple[ParamTensor, ...], tuple[ParamTensor, ...]]:
    """One decoder layer's matmul weights split by selective checkpointing: (kept, recomputed),
    kept: those whose outputs the layer keeps until its backward, recomputed: the rest.

    Policy (strategies/checkpointing.py SELECTIVE_POLICY, torchtitan's op-level selective AC): the
    layer's mm/addmm are counted in forward order (planner.cost.params.layer_matmuls) and the 1st,
    3rd, 5th ... kept; a MoE router's matmul is recomputed and not counted (torchtitan's default
    force-recompute of "moe.router.gate"). Assumption: MoE experts run transformers 5's default
    ``grouped_mm`` experts, an op the policy neither counts nor saves, so every expert matmul is
    recomputed. Llama, Mistral, Qwen2/3, Gemma-2: q, v, gate, down kept; k, o, up recomputed.
    Phi-3: qkv, gate_up kept; o, down recomputed. GPT-2: c_attn, c_fc kept; both c_proj recomputed.
    StarCoder2: q, v, c_fc kept; k, o, c_proj recomputed.
    Mixtral: q, v kept; k, o, router, experts recomputed. Traced (aten op order per family).
    """
    counted = [t for t in params.layer_matmuls(m) if not t.routed and t.name != "mlp.router.weight"]
    kept = tuple(counted[0::2])
    return kept, tuple(t for t in params.layer_matmuls(m) if t not in kept)


@cache
def layer_selective(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int) -> tuple[tuple[str, float], ...]:
    """Bytes per token one layer keeps under selective checkpointing (SELECTIVE_POLICY).

    The layer input (r*h: the checkpoint's input, which recomputation starts from); the output of
    each kept matmul (``selective_matmuls``; c per output feature); fused attention's kernel
    outputs: out (c per head dimension) and the fp32 log-sum-exp (4 bytes per head). Eager
    attention keeps nothing of its own: its bmm are not in the policy's list. Everything else
    (norms, RoPE, activations, the recomputed matmuls) is recomputed in backward. fp8's amax
    (``aten.max``, saved) is one scalar per tensor: 0 per token. Source: torchtitan
    ``_apply_op_sac`` (see SELECTIVE_POLICY); the ops' outputs as traced under the policy
    (benchmarks/traced_matrix.py, one layer's activations).
    """
    c, r, h = dt.compute, dt.residual, m.hidden_size
    kept, _ = selective_matmuls(m)
    saved = [("layer input", r * h)] + [(f"{t.name.removesuffix('.weight')} out", c * t.shape[0]) for t in kept]
    if fused:
        saved += [("attn out", c * m.num_heads * m.head_dim), ("logsumexp fp32", FP32 * m.num_heads)]
    return tuple(saved)


def layer_input_bytes(m: ModelSpec, dt: DTypes) -> float:
    """Full checkpointing keeps only each layer's input: r*h bytes per token (2*s*b*h in bf16)."""
    return dt.residual * m.hidden_size


@cache
def eager_attention_instants(m: ModelSpec, dt: DTypes, seq_len: int) -> dict[str, float]:
    """Bytes per token of one layer's attention half at eager attention's two largest instants,
    its saved tensors included (without checkpointing; checkpointed layers hold less, so these
    bound them):
    - ``forward``, at the softmax: what the half saved before its scores (every saved tensor of
      the size of the scores, a*s, is made at the softmax or after it, but Gemma-2's tanh) and the
      scores in flight (``eager_forward_transient_bytes``, which holds the softmax output and tanh);
    - ``backward``, at the softmax's backward: the saved tensors less the compute-dtype copy of the
      probabilities (the value matmul's backward has run and released it) and the two probability
      gradients (``attention_backward_transient_bytes``).
    Traced (Llama-3.2-1B eager, 1 x 8192, bf16-pure and bf16-mixed, the top layer: the masked
    scores, their fp32 copy and the softmax output, 10 a*s bytes, at the forward instant)."""
    saved = attention_saved(m, dt, False, seq_len)
    # the score-sized part: what grows with the sequence (every other entry is per token only)
    scores = total(saved) - total(attention_saved(m, dt, False, 0))
    return {
        "forward": total(saved) - scores + eager_forward_transient_bytes(m, dt, seq_len),
        "backward": total(saved) - dict(saved).get(PROBS_COPY, 0)
        + attention_backward_transient_bytes(m, dt, False, seq_len),
    }


@cache
def eager_forward_transient_bytes(m: ModelSpec, dt: DTypes, seq_len: int) -> float:
    """Bytes per token in flight at eager attention's softmax beyond what the layer saves: the
    masked scores (fp32 under autocast over fp32 parameters, whose mask is fp32, else the compute
    dtype), their fp32 copy for ``softmax(..., dtype=float32)`` where they are not fp32 already,
    and the fp32 probabilities (saved, but before the layer's checkpoint drops them); Gemma-2's
    soft-capping adds its tanh output. Traced (Llama-3.2-1B eager, 8 x 1024, the top layer's
    forward: masked scores, fp32 copy and softmax, 10 a*s bytes in bf16). GPT-2 scores a*s in the
    compute dtype and its softmax follows autocast."""
    c, a, s = dt.compute, m.num_heads, seq_len
    if m.family == "gpt2":
        return (c + _softmax_bytes(m, dt)) * a * s
    masked = FP32 if dt.upcast else c
    copy = FP32 if masked != FP32 else 0
    softcap = c if m.attn_logit_softcapping else 0
    return (masked + copy + FP32 + softcap) * a * s


def moe_combine_transient_bytes(m: ModelSpec) -> float:
    """Bytes per token in flight where a MoE layer combines its experts' outputs, beyond what the
    layer saves: the routing-weighted outputs, fp32 (the 16-bit expert output times the fp32
    routing weights) and their copy back in token order, 4*h per routed expert each
    (transformers integrations/moe.py ``grouped_mm_experts_forward``: ``proj_out * sample_weights``,
    then ``weighted_out[inv_perm]``; traced: Mixtral 8x7B, the top layer's forward). 0 when dense."""
    return 2 * FP32 * m.hidden_size * m.experts_per_token if m.is_moe else 0


@cache
def fp8_gradient_cast_bytes(m: ModelSpec) -> float:
    """Bytes per token torchao's Float8Linear holds while casting a matmul's output gradient to fp8
    in backward, for the layer's widest converted matmul (``params.fp8_converted``): the scaled
    gradient and its clamped copy in fp32 (4 + 4 bytes per output feature) and two e5m2 copies
    (one per backward matmul: 1 + 1), beside the 16-bit gradient itself. 0 where nothing is
    converted (GPT-2). Traced (Phi-3-mini fp8-mixed: gate_up_proj's 16,384-wide gradient at the
    backward peak; torchao float8 ``hp_tensor_and_scale_to_float8``)."""
    widths = [t.shape[0] for t in params.layer_matmuls(m) if params.fp8_converted(m, t)]
    return (FP32 + FP32 + 1 + 1) * max(widths, default=0)


@cache
def mlp_backward_transient_bytes(m: ModelSpec, dt: DTypes) -> float:
    """Gradient temporaries alive while one layer's MLP runs backward, bytes per token.

    Two residual-stream gradients in flight (r*h each) plus the MLP's intermediate gradients (3
    tensors of the intermediate size when gated, 2 when plain; per routed expert for MoE).
    Checked against traced probes (benchmarks/traced_matrix.py).
    """
    return 2 * dt.residual * m.hidden_size + mlp_gradient_bytes(m, dt)


def mlp_gradient_bytes(m: ModelSpec, dt: DTypes) -> float:
    """The MLP's intermediate gradients in its backward, bytes per token: 3 tensors of the
    intermediate size when gated, 2 when plain (per routed expert for MoE)."""
    return (3 if m.mlp_kind == MlpKind.GATED else 2) * dt.compute * m.intermediate_size * m.experts_per_token


def tiled_mlp_tiles(seq_len: int, hidden: int) -> int:
    """How many tiles DeepSpeed's recipe cuts a rank's sequence into for ``TiledMLP``:
    ``ceil(seqlen / hidden)`` (docs/_tutorials/ulysses-alst-sequence-parallelism.md,
    ``tiled_mlp_forward_common``; all ranks take the largest). ``seq_len``: the positions the rank's
    MLP sees (its share of a split sequence)."""
    return max(1, -(-seq_len // hidden))


def tiled_mlp_tile_tokens(seq_len: int, micro_batch: int, hidden: int) -> int:
    """Tokens of one tile in ``TiledMLP``'s backward, which cuts the flattened (batch x sequence)
    rows into ``tiled_mlp_tiles`` chunks (``torch.chunk``: ceil-sized, the last shorter)."""
    return -(-(seq_len * micro_batch) // tiled_mlp_tiles(seq_len, hidden))


@cache
def attention_backward_transient_bytes(m: ModelSpec, dt: DTypes, fused: bool, seq_len: int) -> float:
    """Gradient temporaries alive while one layer's attention runs backward, bytes per token.

    Two residual-stream gradients in flight (r*h each) plus, for eager attention, two gradients of
    the probabilities in the softmax's dtype (a*s each): the incoming one, cast up to the softmax's
    dtype, and softmax's backward output (``_softmax_backward_data``), alive together at the
    layer's peak. The softmax runs in fp32 (``softmax(..., dtype=float32)``; GPT-2: under autocast
    over fp32 parameters), else in the compute dtype. For SDPA the kernel's q, k and v gradients.
    Traced (benchmarks/traced_matrix.py: Llama-3.2-1B eager, 8 x 1024, the top layer's backward).
    """
    c, r, h, a = dt.compute, dt.residual, m.hidden_size, m.num_heads
    if not fused:
        return 2 * r * h + 2 * _softmax_bytes(m, dt) * a * seq_len
    return 2 * r * h + c * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim


@cache
def norm_bytes(m: ModelSpec, dt: DTypes) -> float:
    """What one hidden-width norm on the residual stream saves, bytes per token."""
    return total(tuple(_norm(m, m.hidden_size, dt.residual)))


@cache
def final_norm_backward_bytes(m: ModelSpec, dt: DTypes) -> float:
    """Bytes per token alive at the peak of the final norm's backward, from the norm itself.

    RMSNorm (Llama, Gemma): its saved fp32 input and five fp32 tensors of the width (the gradient
    through the rsqrt product, mean-backward's division, pow-backward's x and 2x and their product
    with the incoming gradient); traced (benchmarks/traced_matrix.py). LayerNorm: its saved input,
    the incoming gradient and the input gradient (native_layer_norm_backward).
    """
    h = m.hidden_size
    if m.norm_kind == NormKind.LAYER:
        return (2 * dt.residual + dt.compute) * h
    return 6 * FP32 * h


@cache
def final_norm_bytes(m: ModelSpec, dt: DTypes) -> float:
    """The final norm and the head's input, saved outside the checkpointed layers (bytes/token).
    Under autocast over fp32 parameters the norm's output is fp32 and the head saves its 16-bit
    cast, while the fp32 output stays alive as the model output's ``last_hidden_state`` until the
    loss returns (r*h more; traced: Phi-3-mini, bf16-mixed, the loss's forward)."""
    h = m.hidden_size
    return norm_bytes(m, dt) + dt.compute * h + (dt.residual * h if dt.upcast else 0)


@cache
def logits_bytes(m: ModelSpec, dt: DTypes) -> float:
    """Peak bytes per token of the output head and standard cross-entropy loss.

    The HF loss upcasts the logits to fp32 and log_softmax saves its fp32 output (4V). Training
    loops keep only ``outputs.loss`` (the Trainer's compute_loss, accelerate scripts), so the
    returned logits are freed when forward returns; at the start of backward the saved output,
    its incoming gradient and log_softmax's input gradient coexist: 3 * 4V = 12V. (At the loss's
    forward the compute-dtype logits, their fp32 copy and the saved output make at most 10V.)
    Checked by the traced probe (tests/test_traced.py). Gemma-2's final soft-capping (divide, tanh,
    multiply) adds the tanh output, which tanh saves, in the compute dtype (c*V). Source: transformers loss_utils.ForCausalLMLoss;
    DESIGN.md ("4*s*b*V bytes and their gradient").
    """
    v = m.vocab_size
    softcap = dt.compute * v if m.final_logit_softcapping else 0
    return 3 * FP32 * v + softcap


def chunked_loss_bytes(m: ModelSpec, dt: DTypes, tokens: int) -> float:
    """Bytes (total, not per token) of a fused linear + cross-entropy loss (Liger-Kernel FLCE),
    excluding the head's weight gradient it makes in forward (strategies/loss.py adds that).

    Never materialises the full logits: it walks the tokens in chunks of
    min(next_pow2(ceil(tokens / ceil(V / h))), tokens) and keeps one chunk's logits, which its
    kernel overwrites with their gradient (c * V per chunk token), and the chunk's input gradient
    (c * h per chunk token); for the whole micro-batch, the head-input gradient in the input's dtype
    (r * h per token: the final norm's output) and an fp32 loss per token.
    Source: Liger-Kernel ops/fused_linear_cross_entropy.py (reduction "mean", chunk_mem_const 1).
    """
    h, v = m.hidden_size, m.vocab_size
    chunk = liger_chunk_tokens(tokens, v, h)
    return dt.compute * (v + h) * chunk + (dt.residual * h + 4) * tokens


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy: min(next_pow2(ceil(T / ceil(V/h))), T),
    so one chunk's logits stay near T*h elements (Liger-Kernel ops/fused_linear_cross_entropy.py)."""
    inc = -(-vocab // hidden)
    return min(1 << max(0, (-(-tokens // inc) - 1).bit_length()), tokens)


@cache
def total(saved: tuple[tuple[str, float], ...]) -> float:
    """Bytes per token of a saved set (the tuples above, memoized: the search sums the same few
    sets for every candidate)."""
    return sum(b for _, b in saved)
