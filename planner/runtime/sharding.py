"""FSDP2 in a process that builds it itself (the probes): ``fully_shard`` on every decoder layer,
then the root (embeddings, final norm, head), as the emitted accelerate config wraps it."""

from planner.runtime.model import decoder_layers
from planner.runtime.precision import fsdp_policy
from planner.strategies.offload import Offload
from planner.strategies.sharding import FSDP, Sharding


def refuse_fsdp1(config) -> None:
    """The probes build FSDP2 alone: an FSDP1 plan is bad input for them (PlannerInputError)."""
    from planner.core.errors import PlannerInputError

    if config.sharding in FSDP and config.fsdp_version == 1:
        raise PlannerInputError("FSDP1 plans are not probed: the probes build FSDP2 (fully_shard)",
                                hint="Probe the plan with --fsdp-version 2 (the same memory model but for FSDP2's "
                                     "rank-0 padding) and an optimizer FSDP2 can step.")


def apply_fsdp(model, config, mesh) -> None:
    """Reshard after forward unless fsdp-grad-op; offload optimizer+params with CPUOffloadPolicy (the
    emitted fsdp_offload_params: parameters, gradients and the optimizer step on the host)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    policy = fsdp_policy(config)
    reshard = config.sharding != Sharding.FSDP_GRAD_OP
    offload = CPUOffloadPolicy() if config.offload != Offload.NONE else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard, offload_policy=offload)
