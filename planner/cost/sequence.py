"""Ulysses sequence parallelism (DeepSpeed's ALST, through accelerate's ``sp_backend: deepspeed``):
what each rank of a sequence-parallel group holds and exchanges.

A group of ``p`` ranks runs one micro-batch: each rank holds ``seq_len / p`` positions of every
sequence for the whole layer but attention, whose inputs an all-to-all regroups from "my positions,
every head" to "every position, my heads", and whose output a second all-to-all returns. Every tensor
of a rank's layer is therefore that of ``seq_len / p`` tokens, attention's included (``heads / p``
heads over ``seq_len`` positions: the same elements); attention's FLOPs per local token stay those
of the full sequence (planner/cost/compute.py reads the full length).

Source: DeepSpeed 0.19 ``deepspeed/runtime/sequence_parallel/ulysses_sp.py``
``UlyssesSPAttentionHF``: q, k and v are made contiguous in ``[p, s/p, b, h/p, d]`` and exchanged
(``_combine_local_sequences``), then made contiguous in ``[b, h/p, s, d]`` for the attention
kernel; the output is exchanged back (``_partition_global_sequence``). Key and value heads fewer
than ``p`` are first repeated to ``p`` heads (``kv_replication_factor = p // kv_heads``, one head
a rank). Unit: elements per local token unless stated.
"""

from planner.core.specs import ModelSpec


def ulysses_refusal(m: ModelSpec, p: int) -> str | None:
    """Why ``UlyssesSPAttentionHF`` refuses ``m`` at degree ``p``, or None: query heads divisible
    by ``p``; key/value heads divisible by ``p`` or ``p`` by them (its ``__init__``)."""
    if m.num_heads % p:
        return f"{m.num_heads} attention heads are not divisible by --sp-size {p}"
    if m.num_kv_heads % p and p % m.num_kv_heads:
        return f"{m.num_kv_heads} key/value heads and --sp-size {p}: neither divides the other"
    return None


def kv_elements(m: ModelSpec, p: int) -> int:
    """Elements of one of key or value per local token as exchanged: ``kv_heads x head_dim``, or
    ``p x head_dim`` where fewer heads than ``p`` are repeated to one a rank."""
    return max(m.num_kv_heads, p) * m.head_dim


def exchanged_elements(m: ModelSpec, p: int) -> tuple[int, int, int, int]:
    """(q, k, v, output) elements per local token that one layer's all-to-alls move each way:
    the query and the output are ``heads x head_dim`` wide."""
    q = m.num_heads * m.head_dim
    kv = kv_elements(m, p)
    return q, kv, kv, q


def exchange_transient_elements(m: ModelSpec, p: int) -> int:
    """Elements per local token one layer's attention holds beyond what it holds without sequence
    parallelism, at the largest instant of its forward or backward: the exchanged q, k and v
    (``[b, h/p, s, d]`` copies the kernel reads; the originals stay referenced by the model's
    attention forward until it returns) and two copies of the largest in flight (the contiguous
    ``[p, s/p, ...]`` input of an all-to-all and its output). Backward mirrors it with the
    gradients. An upper reading of ``UlyssesSPAttentionHF.forward``: in traces of Llama-3.2-1B (and
    of a 2-layer model with a 256-wide MLP) the attention's instants stay below the MLP's and the
    loss's, so no traced phase reaches it (tests/test_traced.py); what a rank saves beyond a plan
    of seq/p tokens is planner/cost/activations.py ``_attention_core``'s rows."""
    q, k, v, _ = exchanged_elements(m, p)
    return q + k + v + 2 * max(q, k)



# Ring attention (torch context parallelism, accelerate's ``cp_backend: torch`` on FSDP2): each rank
# of a group of ``p`` holds ``seq_len / p`` positions of every sequence (two chunks of 1/(2p) each,
# head and tail, so causal work is balanced: the sequence must divide by 2p) and every head. Its
# attention all-gathers the group's keys and values (one buffer of ``p`` ranks' k and v, the default
# "allgather" strategy) and merges each block's output and logsumexp in fp32; its backward gathers
# them again and passes the fp32 gradients of k and v around the ring (``p`` point-to-point sends).
# Source: torch 2.13 ``distributed/tensor/experimental/_context_parallel/_attention.py``
# (``_templated_ring_attention``, ``..._backward``, ``_AllGatherRotater``, ``_SDPAMerger``,
# ``_AllToAllRotater`` for the gradients).

#: Ring attention's forward beyond the plain kernel's, in local query tensors (16-bit, heads x
#: head_dim per local token): the fp32 merged output and its block terms. Measured on fake tensors
#: (benchmarks/ring_attention_transients.py: q, k, v strided as transformers makes them, 1-16 ranks,
#: GQA 1:1 to 4:1): forward peak = 7.5 q + 2p kv over the inputs, of which the output (1 q) and
#: its logsumexp stay saved; backward peak = max(6 q + 20 kv, 7.5 q + 16 kv) + 2p kv over the
#: saved tensors and the incoming gradient, of which the plain kernel's q, k, v gradients (q + 2 kv)
#: are ``activations.attention_backward_transient_bytes``'.
RING_FORWARD_Q = 6.5
#: Ring attention's backward beyond the plain kernel's (same units): (q, kv) coefficients of the two
#: instants whose larger is the peak (fp32 accumulators of dq, dk, dv and the gradients in flight).
RING_BACKWARD_TERMS = ((3.0, 18.0), (4.5, 14.0))


def ring_transient_elements(m: ModelSpec, p: int, backward: bool) -> float:
    """Elements (16-bit) per local token one layer's ring attention holds beyond the plain fused
    kernel's, at the largest instant of its forward or ``backward``: the gathered keys and values
    of the ``p`` ranks (``2 p kv``) and the merge's fp32 terms (``RING_FORWARD_Q``,
    ``RING_BACKWARD_TERMS``) and a block's fp32 logsumexp. Measured against torch's functions
    (benchmarks/ring_attention_transients.py, 1-16 ranks, GQA 1:1 to 4:1): the forward within 0.01
    of a local q; the backward within 0.04 from p = 4 on, an upper reading at p = 2 (up to 1.5 q
    above). For 16-bit compute (fp32 compute: the same elements count double, an upper bound)."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    gathered = 2 * p * kv + 2 * m.num_heads  # (and a block's fp32 logsumexp: 2 16-bit elements a head)
    if not backward:
        return RING_FORWARD_Q * q + gathered
    return max(a * q + b * kv for a, b in RING_BACKWARD_TERMS) + gathered


def ring_exchanged_bytes(m: ModelSpec, p: int, compute_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes each rank receives per local token of one layer: the k/v
    all-gather ((p - 1) ranks' k and v in the compute dtype), and in backward the same gather and
    ``p`` sends of the fp32 k and v gradients to the next rank."""
    kv = 2 * m.num_kv_heads * m.head_dim
    gather = (p - 1) * kv * compute_bytes
    return gather, gather + p * kv * 4
