"""Precision in a training process: the parameters' dtype, autocast around forward, fp8 linears.

bf16-pure loads bf16 weights (no fp32 master); every other precision keeps fp32 parameters. The
mixed precisions autocast forward to bf16 (fp16 for fp16-mixed), as accelerate does, except under
FSDP2, whose MixedPrecisionPolicy casts the parameters itself. fp8-mixed converts the decoder
layers' linears to torchao Float8Linear with accelerate's own ``convert_model_to_fp8_ao`` (the
emitted fp8_config does this under accelerate launch; the probes do it themselves: Float8Linear's
casts, amax reductions and ``_scaled_mm`` run on fake CPU tensors, so the traced probe sees fp8's
memory).
"""

import contextlib

from planner.runtime import Site
from planner.strategies.precision import CHOICES, MIXED, TORCH_DTYPE, Precision, load_dtype
from planner.strategies.sharding import FSDP


def param_dtype(config):
    """The parameters' dtype as loaded (strategies.precision.load_dtype; an adapter's frozen base
    loads in the compute dtype)."""
    import torch

    return getattr(torch, load_dtype(config.precision, config.adapter != "none"))


def model_kwargs(config) -> dict:
    return {"dtype": param_dtype(config)}


def autocast_on(config) -> bool:
    """Autocast runs the matmuls in 16 bit for the mixed precisions; FSDP2 casts parameters itself."""
    return config.precision in MIXED and config.sharding not in FSDP


def autocast(config, device_type: str):
    """The autocast context of one forward (a null context where nothing is autocast)."""
    import torch

    if not autocast_on(config):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=compute_dtype(config))


def compute_dtype(config):
    """The torch dtype of the matmuls outside fp8 layers (the precision record's ``compute``)."""
    import torch

    return getattr(torch, TORCH_DTYPE[CHOICES[config.precision].compute])


def fsdp_policy(config):
    """FSDP2's MixedPrecisionPolicy: bf16 compute with fp32 gradient reduction for the mixed
    precisions (the layout's reduce dtype), the parameters' own dtype otherwise."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if config.precision in MIXED:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def prepare(model, config, site: Site, **_) -> str | None:
    if config.precision != Precision.FP8_MIXED or site == Site.LAUNCH:
        return None
    from accelerate.utils.ao import convert_model_to_fp8_ao

    convert_model_to_fp8_ao(model)
    return "fp8: torchao Float8Linear through accelerate's convert_model_to_fp8_ao"
