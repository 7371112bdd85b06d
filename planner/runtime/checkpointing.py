"""Activation checkpointing in a training process: full (each decoder layer recomputed in
backward) and selective (strategies/checkpointing.py SELECTIVE_SAVE_OPS saved, the rest recomputed).

Full checkpointing outside FSDP is HF gradient checkpointing, non-reentrant (the emitted Trainer
arguments say so too). Under FSDP the emitted accelerate config switches on FSDP's own activation
checkpointing, so under ``accelerate launch`` nothing is applied here; the probes, which build FSDP
themselves, checkpoint each decoder layer with torch's non-reentrant checkpoint instead. Selective
checkpointing has no switch in accelerate or the Trainer: it is applied here everywhere.
"""

from functools import partial

from planner.runtime import Site
from planner.runtime.model import decoder_layers
from strategies.checkpointing import SELECTIVE_SAVE_OPS, Checkpointing
from strategies.sharding import FSDP


def selective_policy():
    """torch's checkpoint policy: MUST_SAVE the outputs of SELECTIVE_SAVE_OPS (those this torch
    has), PREFER_RECOMPUTE everything else."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    save = {getattr(aten, name).default for name in SELECTIVE_SAVE_OPS if hasattr(aten, name)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def prepare(model, config, site: Site, **_) -> str | None:
    c = config.checkpointing
    if c == Checkpointing.NONE:
        return None
    fsdp = config.sharding in FSDP
    if c == Checkpointing.FULL and not fsdp:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return None
    if c == Checkpointing.FULL and site == Site.LAUNCH:
        return None  # FSDP's own activation checkpointing (the emitted fsdp_activation_checkpointing)
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    kw = {"context_fn": partial(create_selective_checkpoint_contexts, selective_policy())} if c == Checkpointing.SELECTIVE else {}
    for layer in decoder_layers(model):
        layer.forward = partial(checkpoint, layer.forward, use_reentrant=False, **kw)
    return None
