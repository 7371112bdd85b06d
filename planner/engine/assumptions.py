"""What an answer assumed, in one list of short phrases: each says where its value came from
(a flag, or planner's default and why), so no default decides a plan unseen."""

from planner.core.specs import HardwareSpec
from planner.core.units import GB
from planner.cost.overheads import HOST_RESERVE_FRACTION


def assumptions(target, hardware: HardwareSpec, seq_len: int, global_batch: int, *,
                seq_given: bool, batch_given: bool, batch_words: str | None = None) -> list[str]:
    """``target``: the PlanTarget (its host RAM, network and margin flags). ``batch_words``: the
    batch as estimate states it (micro-batch x accumulation), instead of a global batch."""
    out = [f"seq {seq_len:,} tokens ({'--seq-len' if seq_given else 'default'})"]
    tokens = global_batch * seq_len
    batch = batch_words or f"global batch {global_batch:,} seq = {tokens:,} tokens"
    default = "default" if batch_words else "default: >= 131,072 tokens"
    out.append(f"{batch} ({'flags' if batch_given else default})")
    out.append("packed sequences (no padding)")
    host = hardware.host_memory_bytes_per_node / GB
    out.append(f"host RAM {host:,.0f} GB/node, {HOST_RESERVE_FRACTION:.0%} kept free "
               + ("(--host-memory-gb)" if target.host_memory_gb is not None else "(assumed: 2x GPU memory; --host-memory-gb)"))
    if hardware.nodes > 1:
        gbps = hardware.inter_node_bytes_per_s * 8 / 1e9
        out.append(f"network {gbps:,.0f} Gbit/s/node " + ("(--inter-node-gbps)" if target.inter_node_gbps is not None
                                                            else "(assumed; --inter-node-gbps)"))
    out.append(f"margin {target.margin:.0%} of GPU memory kept free")
    return out
