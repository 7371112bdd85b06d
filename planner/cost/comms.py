"""Collective communication: bytes each rank sends, and the time over a link.

Ring algorithms (Patarasuk & Yuan 2009; NCCL performance notes, "bus bandwidth"): over n ranks,
an all-reduce of M bytes sends 2*(n-1)/n*M per rank; all-gather and reduce-scatter send
(n-1)/n*M. Unit: bytes per rank; seconds.
"""


def all_reduce_bytes(message_bytes: float, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks * message_bytes if ranks > 1 else 0.0


def all_gather_bytes(message_bytes: float, ranks: int) -> float:
    """Also reduce-scatter: each rank sends (n-1)/n of the full (unsharded) message."""
    return (ranks - 1) / ranks * message_bytes if ranks > 1 else 0.0


def all_to_all_bytes(message_bytes: float, ranks: int) -> float:
    """Each rank sends all of its ``message_bytes`` tensor but its own ``1/n`` (one send to each
    peer: NCCL's all-to-all, Ulysses' exchanges of planner/cost/sequence.py)."""
    return (ranks - 1) / ranks * message_bytes if ranks > 1 else 0.0


def transfer_seconds(n_bytes: float, bytes_per_s: float, efficiency: float, latency_s: float = 0.0) -> float:
    """Time to move ``n_bytes`` over a link of ``bytes_per_s`` at ``efficiency``, plus latency."""
    return n_bytes / (bytes_per_s * efficiency) + latency_s if n_bytes > 0 else 0.0
