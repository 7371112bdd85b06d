"""Parameter inventory: every parameter tensor of a model, as transformers builds it.

Counting is exact, tensor by tensor, so that per-tensor rules (bitsandbytes' small-tensor
exemption, ZeRO-3's persistence threshold, Adafactor's factored moments) can be applied.
Source for the layouts: the transformers modeling files of each family (modeling_llama.py,
modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_mixtral.py,
modeling_gemma2.py, modeling_phi3.py, modeling_starcoder2.py, modeling_gpt2.py). A test builds every catalog model on the
meta device with transformers and compares the total exactly.
"""

from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from math import prod

from planner.core.specs import MlpKind, ModelSpec, NormKind


class Part(StrEnum):
    EMBEDDING = "embedding"
    LAYER = "layer"  # one decoder layer; repeated num_layers times
    FINAL_NORM = "final_norm"
    HEAD = "head"


@dataclass(frozen=True)
class ParamTensor:
    name: str
    shape: tuple[int, ...]
    part: Part
    matmul: bool = False  # used as a matmul operand (FLOPs, autocast casts)
    experts: int = 1  # copies, one per MoE expert
    routed: bool = False  # an expert tensor: only experts_per_token of `experts` see each token

    @property
    def numel(self) -> int:
        return prod(self.shape) * self.experts


def _norm(name: str, m: ModelSpec, part: Part, width: int | None = None) -> list[ParamTensor]:
    w = width or m.hidden_size
    out = [ParamTensor(f"{name}.weight", (w,), part)]
    if m.norm_kind == NormKind.LAYER:
        out.append(ParamTensor(f"{name}.bias", (w,), part))
    return out


def _linear(name: str, out_f: int, in_f: int, bias: bool, experts: int = 1) -> list[ParamTensor]:
    routed = experts > 1
    out = [ParamTensor(f"{name}.weight", (out_f, in_f), Part.LAYER, True, experts, routed)]
    if bias:
        out.append(ParamTensor(f"{name}.bias", (out_f,), Part.LAYER, False, experts, routed))
    return out


def _attention(m: ModelSpec) -> list[ParamTensor]:
    h, q, kv = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    if m.fused_qkv:
        out = _linear("self_attn.qkv_proj", q + 2 * kv, h, m.qkv_bias)
    else:
        out = (
            _linear("self_attn.q_proj", q, h, m.qkv_bias)
            + _linear("self_attn.k_proj", kv, h, m.qkv_bias)
            + _linear("self_attn.v_proj", kv, h, m.qkv_bias)
        )
    out += _linear("self_attn.o_proj", h, q, m.o_bias)
    if m.qk_norm:
        out += _norm("self_attn.q_norm", m, Part.LAYER, m.head_dim)
        out += _norm("self_attn.k_norm", m, Part.LAYER, m.head_dim)
    return out


def fused_gate_up(m: ModelSpec) -> bool:
    """Whether a gated MLP's gate and up projections are one matrix: Phi-3's ``gate_up_proj``, and
    every MoE layer's experts in transformers 5 (one fused ``gate_up_proj`` and one ``down_proj``
    tensor per layer). Their output gradients are then concatenated (2f wide) before the weight
    gradient. Source: the transformers 5 modeling files (phi3, mixtral, qwen2_moe)."""
    return m.mlp_kind == MlpKind.GATED and (m.fused_qkv or m.is_moe)


def _mlp(m: ModelSpec) -> list[ParamTensor]:
    h, f, e, b = m.hidden_size, m.intermediate_size, m.num_experts, m.mlp_bias
    if m.mlp_kind == MlpKind.PLAIN:
        return _linear("mlp.fc_in", f, h, b, e) + _linear("mlp.fc_out", h, f, b, e)
    if fused_gate_up(m):
        up = _linear("mlp.gate_up_proj", 2 * f, h, b, e)
    else:
        up = _linear("mlp.gate_proj", f, h, b, e) + _linear("mlp.up_proj", f, h, b, e)
    out = up + _linear("mlp.down_proj", h, f, b, e)
    if m.is_moe:  # the router: a bias-free linear from hidden to expert logits
        out += _linear("mlp.router", e, h, False)
    return out


@cache
def layer_tensors(m: ModelSpec) -> tuple[ParamTensor, ...]:
    """The parameter tensors of one decoder layer."""
    norms = [t for i in range(m.norms_per_layer) for t in _norm(f"norm{i}", m, Part.LAYER)]
    return tuple(_attention(m) + _mlp(m) + norms)


@cache
def model_tensors(m: ModelSpec) -> tuple[ParamTensor, ...]:
    """All parameter tensors; layer tensors appear once (multiply by ``num_layers``)."""
    emb = [ParamTensor("embed_tokens.weight", (m.vocab_rows, m.hidden_size), Part.EMBEDDING, m.tie_word_embeddings)]
    if m.learned_position_embeddings:
        emb.append(ParamTensor("embed_positions.weight", (m.max_position_embeddings, m.hidden_size), Part.EMBEDDING))
    head = [] if m.tie_word_embeddings else [ParamTensor("lm_head.weight", (m.vocab_rows, m.hidden_size), Part.HEAD, True)]
    return tuple(emb) + layer_tensors(m) + tuple(_norm("norm", m, Part.FINAL_NORM)) + tuple(head)


def multiplicity(m: ModelSpec, t: ParamTensor) -> int:
    return m.num_layers if t.part == Part.LAYER else 1


@cache
def layer_parameters(m: ModelSpec) -> int:
    """Elements of one decoder layer (all experts)."""
    return sum(t.numel for t in layer_tensors(m))


@cache
def total_parameters(m: ModelSpec) -> int:
    """Exact count of distinct parameters (tied embeddings counted once), elements."""
    return sum(t.numel * multiplicity(m, t) for t in model_tensors(m))


def active_elements(m: ModelSpec, t: ParamTensor) -> int:
    """Elements of ``t`` one token passes through: the top-k of a routed expert tensor's copies."""
    return t.numel // t.experts * m.experts_per_token if t.routed else t.numel


@cache
def active_parameters(m: ModelSpec) -> int:
    """Parameters one token passes through: all but the unrouted experts (Mixtral: top-2 of 8)."""
    return sum(active_elements(m, t) * multiplicity(m, t) for t in model_tensors(m))


@cache
def matmul_parameters(m: ModelSpec) -> int:
    """Elements of matmul weights (all experts), incl. the output head (tied or not)."""
    return sum(t.numel * multiplicity(m, t) for t in model_tensors(m) if t.matmul)


@cache
def layer_matmul_parameters(m: ModelSpec) -> int:
    """Elements of one decoder layer's matmul weights (all experts)."""
    return sum(t.numel for t in layer_tensors(m) if t.matmul)


@cache
def layer_matmuls(m: ModelSpec) -> tuple[ParamTensor, ...]:
    """One decoder layer's matmul weights in the order its forward multiplies by them: q, k, v (or
    the fused qkv), the output projection, then the MLP's (fc_in, fc_out; gate, up, down; fused
    gate_up, down), a MoE router before its experts. Source: the transformers modeling files;
    checked by tracing each family's aten mm/addmm order (transformers 5: Llama, Qwen2, Qwen3,
    Gemma-2, Phi-3, GPT-2)."""
    matmuls = [t for t in layer_tensors(m) if t.matmul]
    # stable sort: the attention's and the router's keep their order, the experts' go last
    return tuple(sorted(matmuls, key=lambda t: t.routed))


def fp8_converted(m: ModelSpec, t: ParamTensor) -> bool:
    """Whether accelerate's ``convert_model_to_fp8_ao`` makes this decoder-layer matmul weight a
    torchao Float8Linear: an ``nn.Linear`` (not GPT-2's Conv1D, not a MoE's grouped expert tensor)
    with both dimensions divisible by 16 (accelerate utils/ao.py ``filter_linear_layers``)."""
    return t.matmul and m.family != "gpt2" and not t.routed and all(d % 16 == 0 for d in t.shape)


@cache
def root_parameters(m: ModelSpec) -> int:
    """Parameters outside the decoder layers: embeddings, final norm, untied head (elements)."""
    return sum(t.numel for t in model_tensors(m) if t.part != Part.LAYER)


@cache
def late_gradient_parameters(m: ModelSpec) -> int:
    """Elements whose gradients autograd makes after every decoder layer's: the input embeddings'
    (token and learned position tables). A tied token table is excluded: the head's gradient for it
    exists from the loss on (it waits in the autograd input buffer). Backward runs in reverse
    order of forward, and the embeddings run first in forward (transformers modeling files)."""
    return sum(t.numel for t in model_tensors(m) if t.part == Part.EMBEDDING and not t.matmul)


@cache
def layer_block_parameters(m: ModelSpec, block: str, matmul_only: bool = False) -> int:
    """Elements of one decoder layer's ``block`` ("self_attn" or "mlp"; all experts), or of its
    matmul weights only."""
    return sum(t.numel for t in layer_tensors(m) if t.name.startswith(block + ".") and (t.matmul or not matmul_only))


@cache
def largest_mlp_matrix(m: ModelSpec) -> int:
    """Elements of one decoder layer's largest MLP weight (all experts of it)."""
    return max(t.numel for t in layer_tensors(m) if t.name.startswith("mlp.") and t.matmul)


@cache
def output_projection_parameters(m: ModelSpec) -> int:
    """Elements of one decoder layer's attention output projection (weight and bias)."""
    return sum(t.numel for t in layer_tensors(m) if t.name.startswith("self_attn.o_proj."))


@cache
def fsdp_rank0_elements(m: ModelSpec, world: int, tensors: tuple[ParamTensor, ...] | None = None) -> int:
    """Elements of rank 0's FSDP2 shards of ``tensors`` (default: the whole model): each parameter
    is split on dim 0 into ``world`` chunks of ceil(dim0 / world) rows (the last ranks' chunks
    padded or empty), so rank 0 holds ceil(dim0 / world) rows of every tensor (torch fully_shard,
    ``FSDPParam`` chunking)."""
    total = 0
    for t in model_tensors(m) if tensors is None else tensors:  # MoE experts as separate tensors (not traced)
        total += -(-t.shape[0] // world) * prod(t.shape[1:]) * t.experts * multiplicity(m, t)
    return total
