"""Adapters in a training process: the 4-bit base of QLoRA at load time, and the peft wrapper.

QLoRA loads the base with transformers' ``BitsAndBytesConfig`` (strategies.adapter
``quantization_config``); every adapter wraps the loaded model with ``peft.get_peft_model`` and
the plan's ``LoraConfig`` (``lora_config``), adapters in fp32 under the mixed precisions (peft's
``autocast_adapter_dtype``), in the parameters' dtype otherwise. planner does not call peft's
``prepare_model_for_kbit_training``: it would upcast the embeddings, norms and head to fp32
(4.2 GB more on Llama-3.1-8B) beyond what the plan counts.
"""

from planner.runtime import Site
from strategies.adapter import Adapter, lora_config, quantization_config
from strategies.precision import MIXED


def model_kwargs(config) -> dict:
    """``quantization_config`` for QLoRA (bitsandbytes NF4, double quantization)."""
    q = quantization_config(config)
    if q is None:
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(**q | {"bnb_4bit_compute_dtype": getattr(torch, q["bnb_4bit_compute_dtype"])})}


def wrap(model, config, site: Site):
    """The model with the plan's adapter (a peft ``PeftModel``), and a note; the model itself and
    None for full fine-tuning."""
    if config.adapter == Adapter.NONE:
        return model, None
    import peft

    lora = peft.LoraConfig(**lora_config(config, model.config.model_type))
    wrapped = peft.get_peft_model(model, lora, autocast_adapter_dtype=config.precision in MIXED)
    trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    return wrapped, f"{config.adapter}: peft r{config.lora_rank} {config.lora_targets}, {trainable:,} trainable parameters"
