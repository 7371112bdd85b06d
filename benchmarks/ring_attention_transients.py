"""What torch's ring attention (context parallelism) holds beyond one rank's plain SDPA: measured
on fake tensors, the source of planner's ring rows (planner/cost/sequence.py
``ring_transient_elements``).

torch's CP dispatcher cannot run on the CPU (DTensor has no sharding strategy for
``aten._scaled_dot_product_flash_attention_for_cpu``), but its own ring functions
(``_templated_ring_attention`` and ``..._backward`` in torch/distributed/tensor/experimental/
_context_parallel/_attention.py, the default all-gather rotater for k/v, the all-to-all one for
their gradients, fp32 merging and accumulation) run on fake tensors under a fake process group
with the CUDA flash kernel's fake implementation. torch's MemTracker records the peak live bytes
of a forward and a backward of one attention call over a rank's ``T`` local tokens, q of ``H``
heads and k, v of ``KV`` heads (GQA, as SDPA's enable_gqa passes them: the mask is dropped under
CP), each strided as transformers makes them (the projection's (b, s, h, d) output transposed),
against the same call without CP.

    python benchmarks/ring_attention_transients.py           # fake tensors, the CPU
    python benchmarks/ring_attention_transients.py --cuda    # real tensors and kernels on a GPU (the GPU window)

Prints, per degree P and head ratio, the forward peak (the inputs not counted), what stays after
it, the backward peak (the forward's outputs and the incoming gradient counted), whether
o_proj's input (the output transposed back) is a copy, in units of one local q (H x head_dim x T x
2 bytes), and planner's formula: the plain kernel's figures plus ``ring_transient_elements``.
"""

import subprocess
import sys

CHILD = r"""
import contextlib, sys, torch
from planner.probes.model_setup import fake_process_group
P, H, KV, D, T = (int(x) for x in sys.argv[1:6])
DEVICE = sys.argv[6]
fake_process_group(P)
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.tensor.experimental._context_parallel import _attention as A
aten = torch.ops.aten


class CudaTracker:
    # the caching allocator's own counts, from the bytes held before the call (its inputs)
    def __enter__(self):
        torch.cuda.synchronize()
        self.base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc):
        return False

    def get_tracker_snapshot(self, kind):
        torch.cuda.synchronize()
        held = torch.cuda.max_memory_allocated() if kind == "peak" else torch.cuda.memory_allocated()
        return {"cuda": {"Total": held - self.base}}


cuda = DEVICE == "cuda"
tracker = CudaTracker() if cuda else MemTracker()

def total(snapshot):
    return sum(v for d in snapshot.values() for k, v in d.items() if str(getattr(k, "value", k)) == "Total")

with contextlib.nullcontext() if cuda else FakeTensorMode(allow_non_fake_inputs=True):
    q = torch.randn(1, T, H, D, dtype=torch.bfloat16, device=DEVICE).transpose(1, 2)
    k, v = (torch.randn(1, T, KV, D, dtype=torch.bfloat16, device=DEVICE).transpose(1, 2) for _ in range(2))
    with tracker:
        if P > 1:
            out, lse, *rest = A._templated_ring_attention(dist.group.WORLD, 2, aten._scaled_dot_product_flash_attention,
                                                          q, k, v, is_causal=True)
        else:
            out, lse, *rest = aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)
        forward, after = total(tracker.get_tracker_snapshot("peak")), total(tracker.get_tracker_snapshot("current"))
        copied = not out.transpose(1, 2).is_contiguous()
        grad = torch.randn_like(out)
        if cuda:  # the backward's peak from here, the forward's outputs and the gradient held
            torch.cuda.reset_peak_memory_stats()
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
print(f"{forward / unit:.3f} {after / unit:.3f} {backward / unit:.3f} {copied}")
"""

HEAD_DIM, TOKENS = 64, 4096
#: (heads, key/value heads) x degrees the GPU window measures (benchmarks/gpu_validate.py): GQA 4:1, as Llama-3's
GPU_CASES = (((8, 2), (1, 2, 4, 8)),)


def measure(p: int, heads: int, kv_heads: int, device: str = "cpu", timeout: float = 120) -> tuple[float, float, float, bool]:
    """(forward peak, after the forward, backward peak, o_proj input copied) in local-q units; one
    process per run (the fake process group is per process). ``device`` cuda: real tensors and
    CUDA's kernels, the caching allocator's counts (the collectives of the fake group move nothing,
    their buffers are allocated as on a real ring)."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(p), str(heads), str(kv_heads), str(HEAD_DIM), str(TOKENS),
                           device], capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"P={p} {heads}:{kv_heads} on {device}: {done.stderr.strip()[-600:]}")
    out = done.stdout.split()
    return float(out[-4]), float(out[-3]), float(out[-2]), out[-1] == "True"


def formula(p: int, heads: int, kv_heads: int, plain: tuple[float, float, float, bool]) -> tuple[float, float]:
    """planner's forward and backward peaks in the same units: the plain kernel's (``plain``,
    measured at P=1 on the same device) plus ``ring_transient_elements`` (16-bit elements per local
    token, over q's)."""
    from planner.core.specs import ModelSpec
    from planner.cost.sequence import ring_transient_elements

    m = ModelSpec.model_construct(num_heads=heads, num_kv_heads=kv_heads, head_dim=HEAD_DIM)
    q = heads * HEAD_DIM
    return (plain[0] + ring_transient_elements(m, p, False) / q,
            plain[2] + ring_transient_elements(m, p, True) / q)


def rows(device: str, cases, deadline: float | None = None) -> list[dict]:
    """Each (heads, kv heads) x degree measured on ``device`` beside planner's formula; the rows
    before ``deadline`` (time.monotonic) only."""
    import time

    out = []
    for (heads, kv_heads), degrees in cases:
        plain = None
        for p in degrees:
            if deadline is not None and time.monotonic() > deadline:
                return out
            fwd, after, bwd, copied = measure(p, heads, kv_heads, device)
            plain = plain or (fwd, after, bwd, copied)
            f_fwd, f_bwd = formula(p, heads, kv_heads, plain) if p > 1 else (fwd, bwd)
            out.append({"p": p, "heads": heads, "kv_heads": kv_heads, "forward": round(fwd, 3),
                        "planner_forward": round(f_fwd, 3), "after": round(after, 3), "backward": round(bwd, 3),
                        "planner_backward": round(f_bwd, 3), "o_proj_copy": copied})
    return out


def table(found: list[dict]) -> list[str]:
    lines = [f"{'P':>3} {'heads':>6} {'fwd':>7} {'planner':>8} {'after':>6} {'bwd':>7} {'planner':>8} {'o_proj copy':>12}"]
    lines += [f"{r['p']:>3} {r['heads']:>3}:{r['kv_heads']:<2} {r['forward']:7.3f} {r['planner_forward']:8.3f} "
              f"{r['after']:6.3f} {r['backward']:7.3f} {r['planner_backward']:8.3f} {str(r['o_proj_copy']):>12}"
              for r in found]
    return lines


def main() -> None:
    device = "cuda" if "--cuda" in sys.argv else "cpu"
    print(f"one rank's attention on {device}, head_dim {HEAD_DIM}, {TOKENS:,} local tokens; unit: one local q")
    cases = GPU_CASES if device == "cuda" else tuple((hk, (1, 2, 4, 8, 16)) for hk in ((8, 8), (8, 4), (8, 2)))
    print("\n".join(table(rows(device, cases))))


if __name__ == "__main__":
    main()
