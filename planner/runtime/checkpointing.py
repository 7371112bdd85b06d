"""Activation checkpointing in a training process: full (each decoder layer recomputed in
backward) and selective (torchtitan's op-level policy, strategies/checkpointing.py SELECTIVE_POLICY).

Full checkpointing is what the emitted files say (the Trainer's activation checkpointing in the
plan's implementation; under FSDP, FSDP's own, non-reentrant), so at the launch nothing is applied
here; the probes, which build the model and FSDP themselves, use HF gradient checkpointing in the
plan's implementation or, under FSDP, torch's checkpoint around each decoder layer (the same).
Selective checkpointing has no switch in accelerate or the Trainer (runtime.json names it): it is
applied here everywhere.
"""

from collections import Counter, defaultdict
from functools import partial
from typing import Any

from planner.runtime import Site
from planner.runtime.model import decoder_layers
from planner.strategies.checkpointing import SELECTIVE_POLICY, CheckpointImpl, Checkpointing
from planner.strategies.sharding import FSDP


def _op(name: str):
    """``torch.ops.<namespace>.<name>.default``, or None where this torch lacks it."""
    import torch

    namespace, op = name.split(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    return getattr(packet, "default", None)


def router_shapes(layer) -> set:
    """Right-hand-side shapes (in, out) of a decoder layer's MoE router matmuls: its modules named
    SELECTIVE_POLICY.router_module with a 2-D weight (torchtitan matches the router by fqn and
    recomputes every mm of its weight's shape)."""
    shapes = set()
    for name, module in layer.named_modules():
        weight = getattr(module, "weight", None)
        if name.rsplit(".", 1)[-1] == SELECTIVE_POLICY.router_module and weight is not None and weight.dim() == 2:
            shapes.add(tuple(weight.shape[::-1]))
    return shapes


def selective_context_fn(router: frozenset = frozenset(), saved: Counter | None = None):
    """A checkpoint ``context_fn`` applying SELECTIVE_POLICY (torchtitan ``_apply_op_sac``): each
    call (one per checkpointed layer call) gets fresh matmul counters, one for the forward and one
    for the recompute; MUST_SAVE the listed ops' outputs except every second counted matmul and the
    router's, PREFER_RECOMPUTE everything else. ``router``: router_shapes of the layer; ``saved``:
    counts the ops whose outputs the forward saves (what planner.launch.live reports), and the calls."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {op for op in map(_op, SELECTIVE_POLICY.save_ops) if op is not None}
    counted = {op for op in map(_op, SELECTIVE_POLICY.counted_ops) if op is not None}
    to_copy = torch.ops.aten._to_copy.default

    def policy(meta, ctx, func, *args, **kwargs):
        if func == to_copy and args[0].device.type == "cuda" and str(kwargs.get("device", "")) == "cpu":
            return CheckpointPolicy.MUST_SAVE  # activation offload: keep the host copy
        count = "recompute" if ctx.is_recompute else "forward"
        if func in counted:
            if tuple(args[-1].shape) in router:  # mm(x, w) / addmm(bias, x, w): w is the last argument
                return CheckpointPolicy.PREFER_RECOMPUTE
            meta[count] += 1
            if meta[count] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if func not in save:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if saved is not None and not ctx.is_recompute:
            saved[func.__name__] += 1
        return CheckpointPolicy.MUST_SAVE

    if saved is not None:
        saved["calls"] += 1
    return create_selective_checkpoint_contexts(partial(policy, defaultdict(int)))


def prepare(model, config, site: Site, **_) -> str | None:
    c = config.checkpointing
    if c == Checkpointing.NONE:
        return None
    if c == Checkpointing.FULL and site == Site.LAUNCH:
        return None  # the emitted files say it: the Trainer's activation_checkpointing, or FSDP's own
    reentrant = c == Checkpointing.FULL and config.checkpoint_impl == CheckpointImpl.REENTRANT
    if c == Checkpointing.FULL and config.sharding not in FSDP:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return None
    from torch.utils.checkpoint import checkpoint

    for layer in decoder_layers(model):
        layer._planner_saved_ops = Counter()  # what the policy saved, for planner.launch.live
        kw: dict[str, Any] = (
            {"context_fn": partial(selective_context_fn, frozenset(router_shapes(layer)), layer._planner_saved_ops)}
            if c == Checkpointing.SELECTIVE else {})
        layer.forward = partial(checkpoint, layer.forward, use_reentrant=reentrant, **kw)
        layer._planner_checkpointing = str(c)  # what planner.launch.live reads back
    return None
