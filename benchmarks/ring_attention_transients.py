"""What torch's ring attention (context parallelism) holds beyond one rank's plain SDPA: measured
on fake tensors, groundwork for the ring-CP rows planner does not have yet (issue 38).

torch's CP dispatcher cannot run on the CPU (DTensor has no sharding strategy for
``aten._scaled_dot_product_flash_attention_for_cpu``), but its own ring functions
(``_templated_ring_attention`` and ``..._backward`` in torch/distributed/tensor/experimental/
_context_parallel/_attention.py, the default all-gather rotater for k/v, the all-to-all one for
their gradients, fp32 merging and accumulation) run on fake tensors under a fake process group
with the CUDA flash kernel's fake implementation. torch's MemTracker records the peak live bytes
of a forward and a backward of one attention call over a rank's ``T`` local tokens, q, k and v of
``H`` heads each (no GQA: the flash op takes equal heads), against the same call without CP.

    python benchmarks/ring_attention_transients.py           # P = 1 (plain), 2, 4, 8

Prints, per degree P, the forward and backward peaks and what stays after the forward, in units
of one local q (H x head_dim x T x 2 bytes); the inputs q, k, v are not counted.
"""

import subprocess
import sys

CHILD = r"""
import sys, torch
from planner.probes.model_setup import fake_process_group
P, H, D, T = (int(x) for x in sys.argv[1:5])
fake_process_group(P)
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor.experimental._context_parallel import _attention as A
aten = torch.ops.aten
tracker = MemTracker()

def total(snapshot):
    return sum(v for d in snapshot.values() for k, v in d.items() if str(getattr(k, "value", k)) == "Total")

with FakeTensorMode(allow_non_fake_inputs=True):
    q, k, v = (torch.randn(1, H, T, D, dtype=torch.bfloat16) for _ in range(3))
    with tracker:
        if P > 1:
            out, lse, *rest = A._templated_ring_attention(dist.group.WORLD, 2, aten._scaled_dot_product_flash_attention,
                                                          q, k, v, is_causal=True)
        else:
            out, lse, *rest = aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)
        forward, after = total(tracker.get_tracker_snapshot("peak")), total(tracker.get_tracker_snapshot("current"))
        grad = torch.randn_like(out)
        if P > 1:
            A._templated_ring_attention_backward(
                dist.group.WORLD, 2, aten._scaled_dot_product_flash_attention_backward.default, grad_out=grad,
                grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=True,
                cum_seq_q=None, cum_seq_k=None, max_q=T, max_k=T, dropout_p=0.0, philox_seed=rest[-2],
                philox_offset=rest[-1], scale=None)
        else:
            aten._scaled_dot_product_flash_attention_backward(grad, q, k, v, out, lse, None, None, T, T, 0.0, True,
                                                              rest[-2], rest[-1])
        backward = total(tracker.get_tracker_snapshot("peak"))
unit = H * D * T * 2
print(f"{P} {forward / unit:.2f} {after / unit:.2f} {backward / unit:.2f}")
"""


def main() -> None:
    heads, head_dim, tokens = 8, 64, 4096
    print(f"one rank's attention, {heads} heads x {head_dim}, {tokens:,} local tokens; unit: one local q "
          f"({heads * head_dim * tokens * 2:,} bytes)")
    print(f"{'P':>3} {'forward peak':>13} {'after forward':>14} {'backward peak':>14}")
    for p in (1, 2, 4, 8):  # one process per degree: the fake process group is per process
        out = subprocess.run([sys.executable, "-c", CHILD, str(p), str(heads), str(head_dim), str(tokens)],
                             capture_output=True, text=True, check=True).stdout.split()
        print(f"{out[-4]:>3} {out[-3]:>13} {out[-2]:>14} {out[-1]:>14}")


if __name__ == "__main__":
    main()
