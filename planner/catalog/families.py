"""Family adapters: a Hugging Face config.json (dict) -> ModelSpec.

Defaults mirror the transformers configuration classes for each model_type when a key is
absent (e.g. LlamaConfig.tie_word_embeddings=False, Gemma2Config=True, GPT2Config=True).
Source: transformers configuration_*.py and modeling_*.py of each family.
"""

from collections.abc import Callable

from pydantic import ValidationError

from planner.core.errors import PlannerInputError
from planner.core.specs import MlpKind, ModelSpec, NormKind


def _llama_like(c: dict) -> dict:
    h, a = c["hidden_size"], c["num_attention_heads"]
    bias = bool(c.get("attention_bias", False))
    return dict(
        hidden_size=h,
        num_layers=c["num_hidden_layers"],
        num_heads=a,
        num_kv_heads=c.get("num_key_value_heads") or a,
        head_dim=c.get("head_dim") or h // a,
        intermediate_size=c["intermediate_size"],
        vocab_size=c["vocab_size"],
        max_position_embeddings=c.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bool(c.get("mlp_bias", False)),
        attention_dropout=float(c.get("attention_dropout", 0.0) or 0.0),
        # Qwen2's sliding_window is inert unless use_sliding_window (its layer_types are full attention)
        sliding_window=c.get("sliding_window") if c.get("use_sliding_window", True) else None,
    )


def _qwen2(c: dict) -> dict:
    return _llama_like(c) | dict(qkv_bias=True, o_bias=False)  # q/k/v biased, o_proj not


def _qwen3(c: dict) -> dict:
    return _llama_like(c) | dict(qk_norm=True)


def _mixtral(c: dict) -> dict:
    return _llama_like(c) | dict(num_experts=c.get("num_local_experts", 8), experts_per_token=c.get("num_experts_per_tok", 2))


def _gemma2(c: dict) -> dict:
    return _llama_like(c) | dict(
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        head_dim=c.get("head_dim", 256),
        norm_kind=NormKind.RMS_GEMMA,
        norms_per_layer=4,
        final_logit_softcapping=c.get("final_logit_softcapping"),
        attn_logit_softcapping=c.get("attn_logit_softcapping"),
    )


def _gemma(c: dict) -> dict:
    """Gemma (v1): Gemma-2's layer without its post-norms, soft-capping and sliding window
    (transformers GemmaConfig: tie_word_embeddings True, head_dim 256; GemmaRMSNorm scales by
    1 + weight in fp32; the MLP is gated, gelu_pytorch_tanh)."""
    return _llama_like(c) | dict(
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        head_dim=c.get("head_dim", 256),
        norm_kind=NormKind.RMS_GEMMA,
    )


def _smollm3(c: dict) -> dict:
    """SmolLM3: Llama's layer (no biases, SiLU-gated MLP, RMSNorm) with RoPE skipped in every
    fourth layer (``no_rope_layers``: no parameters, no saved tensor of its own) and tied
    embeddings by default (transformers SmolLM3Config: tie_word_embeddings True)."""
    return _llama_like(c) | dict(tie_word_embeddings=bool(c.get("tie_word_embeddings", True)))


def _starcoder2(c: dict) -> dict:
    """StarCoder2: Llama's attention (GQA, RoPE) with GPT-2's LayerNorm (weight and bias) and plain
    MLP (``c_fc`` -> gelu_pytorch_tanh -> ``c_proj``); ``use_bias`` puts biases on q, k, v, o and
    both MLP matmuls; dropout on the attention probabilities, on both blocks' outputs before their
    residual adds (``residual_dropout``) and on the embeddings' output (``embedding_dropout``).
    Defaults of transformers Starcoder2Config: use_bias True, tie_word_embeddings True, hidden_act
    gelu_pytorch_tanh, every dropout 0.0. Source: transformers modeling_starcoder2.py."""
    bias = bool(c.get("use_bias", True))
    return _llama_like(c) | dict(
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        norm_kind=NormKind.LAYER,
        mlp_kind=MlpKind.PLAIN,
        activation=str(c.get("hidden_act", "gelu_pytorch_tanh")),
        residual_dropout=float(c.get("residual_dropout", 0.0) or 0.0),
        embedding_dropout=float(c.get("embedding_dropout", 0.0) or 0.0),
    )


def _phi3(c: dict) -> dict:
    return _llama_like(c) | dict(fused_qkv=True, qkv_bias=False, o_bias=False)


def _gpt2(c: dict) -> dict:
    h, a = c.get("n_embd", 768), c.get("n_head", 12)
    return dict(
        hidden_size=h,
        num_layers=c.get("n_layer", 12),
        num_heads=a,
        num_kv_heads=a,
        head_dim=h // a,
        intermediate_size=c.get("n_inner") or 4 * h,
        vocab_size=c.get("vocab_size", 50257),
        max_position_embeddings=c.get("n_positions", 1024),
        learned_position_embeddings=True,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        fused_qkv=True,  # Conv1D c_attn: one weight and one bias for q, k and v
        activation=str(c.get("activation_function", "gelu_new")),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        norm_kind=NormKind.LAYER,
        mlp_kind=MlpKind.PLAIN,
        attention_dropout=float(c.get("attn_pdrop", 0.1)),
        residual_dropout=float(c.get("resid_pdrop", 0.1)),
        embedding_dropout=float(c.get("embd_pdrop", 0.1)),  # nn.Dropout on token + position embeddings
    )


#: The decoder block class of each family in transformers: what FSDP wraps as one unit.
#: Source: each family's modeling file (``_no_split_modules``).
DECODER_LAYER_CLASS: dict[str, str] = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "smollm3": "SmolLM3DecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "starcoder2": "Starcoder2DecoderLayer",
    "gpt2": "GPT2Block",
}

ADAPTERS: dict[str, Callable[[dict], dict]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mixtral": _mixtral,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "smollm3": _smollm3,
    "phi3": _phi3,
    "starcoder2": _starcoder2,
    "gpt2": _gpt2,
}
SUPPORTED_FAMILIES = tuple(ADAPTERS)


#: config.json lists with one entry per decoder layer (transformers validates their length).
PER_LAYER_KEYS = ("layer_types", "no_rope_layers")


def with_depth(config: dict, layers: int | None) -> dict:
    """A copy of a config.json mapping at ``layers`` decoder layers (None: as it is). The depth key
    is ``num_hidden_layers``, GPT-2's ``n_layer`` (transformers GPT2Config); per-layer lists
    (``layer_types``, SmolLM3's ``no_rope_layers``), which transformers requires to have one entry
    per layer, keep their pattern from the first layer on."""
    out = dict(config)
    if layers is not None:
        out["n_layer" if out.get("model_type") == "gpt2" else "num_hidden_layers"] = layers
        for key in PER_LAYER_KEYS:
            if isinstance(out.get(key), list) and out[key]:
                out[key] = [out[key][i % len(out[key])] for i in range(layers)]
    return out


def spec_from_config(
    config: dict, model_id: str, source: str, published: tuple[int | None, str | None] = (None, None)
) -> ModelSpec:
    family = config.get("model_type")
    if not isinstance(family, str) or family not in ADAPTERS:
        raise PlannerInputError(
            f"{model_id}: model_type {family!r} is not supported",
            hint=f"Supported model types: {', '.join(SUPPORTED_FAMILIES)}.",
        )
    try:
        fields = ADAPTERS[family](config)
        return ModelSpec(
            id=model_id, family=family, source=source, decoder_layer_class=DECODER_LAYER_CLASS[family],
            published_parameters=published[0], published_parameters_source=published[1], **fields,
        )
    except KeyError as e:
        raise PlannerInputError(f"{model_id}: config.json lacks {e.args[0]!r}, which a {family} model needs") from None
    except (TypeError, ValueError, ArithmeticError, ValidationError) as e:
        msg = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        raise PlannerInputError(f"{model_id}: config.json has an unusable value: {msg}") from None
