"""Tensor parallelism in a training process (strategies/tensor_parallel.py): the model is loaded
with transformers' ``DistributedConfig``, which builds the device mesh from the launcher's
environment, shards each layer over ``tp_size`` ranks and applies FSDP2 over the rest
(``fsdp_size`` ranks; hybrid: a node's, replicated across the ``dp_replicate_size`` nodes), bf16
parameters with fp32 reductions under bf16-mixed (``fsdp_mixed_precision``: the model is loaded in
fp32, planner/runtime/precision.py). Nothing else applies it: the Trainer reads the degrees off the
model and leaves it unwrapped."""

import os

from planner.strategies.precision import Precision
from planner.strategies.sharding import Sharding


def degrees(config, world: int, per_node: int) -> dict[str, int]:
    """DistributedConfig's sizes for ``config`` over ``world`` processes, ``per_node`` a node:
    ``tp_size``, ``fsdp_size`` (the ranks holding the same share: all of them, or a node's under
    hybrid sharding) and ``dp_replicate_size`` (the nodes, under hybrid sharding; else 1)."""
    t = config.tensor_shards
    replicas = world // per_node if config.sharding == Sharding.FSDP_HYBRID else 1
    return {"tp_size": t, "fsdp_size": world // replicas // t, "dp_replicate_size": replicas}


def distributed_config(config, world: int, per_node: int):
    """transformers' ``DistributedConfig`` of ``config`` over ``world`` processes (``degrees``),
    bf16 parameters with fp32 reductions under bf16-mixed."""
    from transformers.distributed import DistributedConfig

    return DistributedConfig(**degrees(config, world, per_node),
                             fsdp_mixed_precision=config.precision == Precision.BF16_MIXED)


def load_kwargs(config) -> dict:
    """``from_pretrained``'s ``distributed_config`` over the launcher's processes (its environment)."""
    if config.tensor_shards == 1:
        return {}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    return {"distributed_config": distributed_config(config, world, per_node)}
