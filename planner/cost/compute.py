"""FLOPs of a training step. Unit: FLOPs per token (one multiply-add = 2 FLOPs).

- Matmuls: 2 FLOPs per active matmul parameter per token forward, 4 backward (gradients with
  respect to inputs and weights): the 6*N rule (Kaplan et al. 2020, Sec. 2.1; Narayanan et al.
  2021, "Efficient Large-Scale Language Model Training on GPU Clusters", Appendix).
- Attention scores and weighted values: 2 * 2 * s * (a*d) per token per layer forward without a
  mask; a causal mask halves it for kernels that skip masked blocks (FlashAttention-2, Dao 2023,
  Sec. 4 FLOPs accounting); eager attention computes the full square.
- Backward of attention: 2x its forward (FlashAttention-2 counts 2.5x with recomputation
  of the scores inside the kernel; the extra 0.5x is in the efficiency figure).
- Model FLOPs (for MFU) count neither recomputation nor masked blocks (PaLM, Chowdhery et al.
  2022, Appendix B, with causal halving).
"""

from functools import cache

from planner.core.specs import ModelSpec
from planner.cost import params


@cache
def matmul_flops_per_token(m: ModelSpec, layers_only: bool = False) -> float:
    """Forward matmul FLOPs per token: 2 x active matmul parameters (routed experts: top-k)."""
    total = 0
    for t in params.model_tensors(m):
        if not t.matmul or (layers_only and t.part != params.Part.LAYER):
            continue
        n = t.numel // t.experts * m.experts_per_token if t.routed else t.numel
        total += n * params.multiplicity(m, t)
    return 2.0 * total


def attention_flops_per_token(m: ModelSpec, seq_len: float, causal_skip: bool = True) -> float:
    """Forward attention FLOPs per token, all layers: QK^T and PV, 2 * 2 * s * a * d per layer,
    halved when the kernel skips the masked upper triangle."""
    full = 4.0 * seq_len * m.num_heads * m.head_dim * m.num_layers
    return full / 2 if causal_skip else full


def model_flops_per_token(m: ModelSpec, seq_len: float) -> float:
    """Useful FLOPs per trained token, forward + backward (3x forward), no recomputation."""
    return 3.0 * (matmul_flops_per_token(m) + attention_flops_per_token(m, seq_len))
