"""The techniques planner can choose, one module each, in the order they write the ledger.

An explicit list, no import-time registration: precision writes the model-state rows,
optimizer the states, sharding divides and adds buffers, offload moves rows to the host,
checkpointing / attention / loss write activation rows.
"""

from strategies import attention, checkpointing, loss, offload, optimizer, precision, sharding
from strategies.base import Check, Engine, PlanContext, Strategy

REGISTRY: tuple[Strategy, ...] = (
    precision.STRATEGY,
    optimizer.STRATEGY,
    sharding.STRATEGY,
    offload.STRATEGY,
    checkpointing.STRATEGY,
    attention.STRATEGY,
    loss.STRATEGY,
)

__all__ = ["REGISTRY", "Check", "Engine", "PlanContext", "Strategy"]
