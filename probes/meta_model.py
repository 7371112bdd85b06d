"""Build a catalog or user architecture with transformers on the meta device (no memory, no hub).

The traced probes (issue 6) start from this; the catalog tests use it to check parameter counts.
"""

import torch
import transformers

from planner.runtime.model import decoder_layers  # the same blocks FSDP wraps


def build_on_meta(config: dict, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The causal-LM module for a config.json dict, with meta tensors in ``dtype``."""
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)


def count_parameters(module: torch.nn.Module) -> int:
    """Distinct parameters: ``parameters()`` yields a tied weight once."""
    return sum(p.numel() for p in module.parameters())


__all__ = ["build_on_meta", "count_parameters", "decoder_layers"]
