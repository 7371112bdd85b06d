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

