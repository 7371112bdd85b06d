"""Adapters in a training process: the quantized base (QLoRA's NF4, lora-int8's LLM.int8()) at
load time, and the peft wrapper.

QLoRA and lora-int8 load the base with transformers' ``BitsAndBytesConfig`` (strategies.adapter
``quantization_config``); every adapter wraps the loaded model with ``peft.get_peft_model`` and
the plan's ``LoraConfig`` (``lora_config``), adapters in fp32 under the mixed precisions (peft's
``autocast_adapter_dtype``) but DeepSpeed's, in the parameters' dtype otherwise
(strategies.precision ``fp32_adapters``). planner does not call peft's
``prepare_model_for_kbit_training``: it would upcast the embeddings, norms and head to fp32
(4.2 GB more on Llama-3.1-8B) beyond what the plan counts.
"""

from planner.runtime import Site
from planner.strategies.adapter import Adapter, KbitPrep, compute_dtype, lora_config, quantization_config
from planner.strategies.precision import fp32_adapters
from planner.strategies.sharding import engine_of


def model_kwargs(config) -> dict:
    """``quantization_config`` for QLoRA (bitsandbytes NF4, double quantization) or lora-int8
    (``load_in_8bit``)."""
    q = quantization_config(config)
    if q is None:
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    dtypes = {k: getattr(torch, v) for k, v in q.items() if k in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage")}
    return {"quantization_config": BitsAndBytesConfig(**q | dtypes)}


def prepare(model, config, site: Site, **_) -> str | None:
    """QLoRA where the model was built from a config (the measured probe): its decoder-layer
    linears replaced by bitsandbytes ``Linear4bit`` (NF4, double quantization, the plan's compute
    dtype), which quantize as they move to the model's device, as transformers' 4-bit load does.
    The launch loads with ``quantization_config`` instead; the traced probe computes the NF4 bytes
    (bitsandbytes does not run on fake tensors)."""
    if site != Site.MEASURED:
        return None
    if config.adapter == Adapter.LORA_INT8:
        return quantize_int8(model)
    if config.adapter != Adapter.QLORA:
        return None
    return quantize_nf4(model, config)


def frozen_linears(model):
    """(parent, name, linear) for each frozen linear of the decoder layers that a 4-bit load
    quantizes: ``nn.Linear`` and GPT-2's ``Conv1D``, not the output head or embeddings (outside the
    layers), not peft's adapters (``lora_*``) and, in a peft-wrapped model, the wrapper's base layer
    once (not the wrapper, which shows the base's weight)."""
    import torch

    from planner.runtime.model import decoder_layers

    for layer in decoder_layers(model):
        for path, parent in layer.named_modules():
            if "lora_" in path:
                continue
            for name, child in parent.named_children():
                if (name.startswith("lora_") or hasattr(child, "base_layer")
                        or not (isinstance(child, torch.nn.Linear) or type(child).__name__ == "Conv1D")):
                    continue
                yield parent, name, child


def _replace_frozen_linears(model, build) -> int:
    """Replace every ``frozen_linears`` layer by ``build(out_features, in_features, weight on the
    CPU, has_bias)``'s bitsandbytes layer on the same device, which quantizes as it moves there
    (Conv1D's (in, out) weight transposed to a linear's (out, in), as transformers' quantized load
    does); its bias stays a frozen 16-bit parameter. Returns how many were replaced."""
    import torch

    found = list(frozen_linears(model))
    for parent, name, child in found:
        weight = child.weight.data if isinstance(child, torch.nn.Linear) else child.weight.data.t().contiguous()
        device = weight.device
        q = build(*weight.shape, weight.to("cpu"), child.bias is not None)
        if child.bias is not None:
            q.bias = torch.nn.Parameter(child.bias.data.to("cpu"), requires_grad=False)
        setattr(parent, name, q.to(device))
    return len(found)


def quantize_nf4(model, config) -> str:
    """The frozen decoder linears as bitsandbytes NF4 ``Linear4bit`` (double quantization, the
    plan's compute and storage dtypes)."""
    import bitsandbytes as bnb
    import torch

    q = quantization_config(config)
    if q is None:
        raise ValueError(f"adapter {config.adapter}: no 4-bit base to quantize")
    compute = getattr(torch, q["bnb_4bit_compute_dtype"])
    storage = getattr(torch, q.get("bnb_4bit_quant_storage", "uint8"))

    def build(out_features, in_features, weight, bias):
        layer = bnb.nn.Linear4bit(in_features, out_features, bias=bias, compute_dtype=compute, compress_statistics=True,
                                  quant_type="nf4", quant_storage=storage)
        layer.weight = bnb.nn.Params4bit(weight, requires_grad=False, compress_statistics=True, quant_type="nf4",
                                         quant_storage=storage)
        return layer

    n = _replace_frozen_linears(model, build)
    return f"qlora: {n} decoder linears quantized to NF4 (double quantization) in place"


def quantize_int8(model) -> str:
    """The frozen decoder linears as bitsandbytes ``Linear8bitLt`` (int8 weights, no fp16 copy,
    outlier threshold 6.0: transformers' ``load_in_8bit`` defaults)."""
    import bitsandbytes as bnb

    def build(out_features, in_features, weight, bias):
        layer = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias, has_fp16_weights=False, threshold=6.0)
        layer.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
        return layer

    n = _replace_frozen_linears(model, build)
    return f"lora-int8: {n} decoder linears quantized to int8 (LLM.int8()) in place"


def wrap(model, config, site: Site):
    """The model with the plan's adapter (a peft ``PeftModel``), and a note; the model itself and
    None for full fine-tuning."""
    if config.adapter == Adapter.NONE:
        return model, None
    import peft

    prepared = kbit_prepare(model, config)
    lora = peft.LoraConfig(**lora_config(config, model.config.model_type))
    fp32 = fp32_adapters(config.precision, engine_of(config.sharding), config)
    wrapped = peft.get_peft_model(model, lora, autocast_adapter_dtype=fp32)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    return wrapped, (f"{config.adapter}: peft r{config.lora_rank} {config.lora_targets}, {trainable:,} trainable parameters"
                     + (f"; {prepared}" if prepared else ""))


def kbit_prepare(model, config) -> str | None:
    """The plan's ``kbit_prep`` on the loaded 4-bit base, before peft wraps it: peft's
    ``prepare_model_for_kbit_training`` (every unquantized 16-bit parameter to fp32; planner's
    checkpointing is its own runtime's), then for ``fp32-norms`` the embeddings and head back to
    the compute dtype, as TRL <= 0.25 does under bf16 (``peft_module_casting_to_bf16``). None for
    ``none``, planner's layout."""
    if str(getattr(config, "kbit_prep", KbitPrep.NONE)) == KbitPrep.NONE or config.adapter != Adapter.QLORA:
        return None
    import peft
    import torch

    peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if config.kbit_prep == KbitPrep.FP32_NORMS:
        dtype = getattr(torch, compute_dtype(config))
        for name, module in model.named_modules():
            if name.endswith(("embed_tokens", "lm_head")) and getattr(module, "weight", None) is not None:
                module.to(dtype)
    return f"kbit prep {config.kbit_prep} (peft's prepare_model_for_kbit_training)"
