"""Tensor parallelism as transformers 5 trains with it: what one rank of a tensor-parallel group of
``t`` holds, saves and exchanges.

transformers shards a model at load time (``from_pretrained(distributed_config=DistributedConfig(
tp_size=t, ...))``) by its ``base_model_tp_plan`` and the head's ``_tp_plan``; in training every
sharded linear runs on DTensors (transformers/distributed/tensor_parallel.py, 5.24):
- ``colwise`` (q, k, v, gate, up; StarCoder2's ``c_fc``): weight and bias ``Shard(0)``, the input
  made ``Replicate`` (saved whole by the matmul), the output this rank's ``Shard(-1)`` slice;
- ``rowwise`` (o, down; ``c_proj``): weight ``Shard(-1)``, bias replicated, the partial output
  all-reduced to ``Replicate``;
- ``embedding_rowwise``: the input embeddings split on the vocabulary (added by
  ``init_parallel_plans`` whenever a plan exists), the partial lookups all-reduced;
- ``colwise_gather_output`` (the LM head): the weight split on the vocabulary, the logits
  all-gathered, whole on every rank;
- ``replicated_with_grad_allreduce`` (Qwen3's q/k norms) and every other parameter (the decoder
  norms, the final norm): whole on every rank.
A tied head shares the embeddings' ``Shard(0)`` parameter. Nothing here is sequence-parallel: the
default plans name no norm ``sequence_parallel``, so each rank holds every position of the
residual stream (``DistributedConfig.enable_sequence_parallel`` is "not wired up yet").

The families modelled (``TP_FAMILIES``) are those whose plan is that pattern; Phi-3's fused
projections gather their outputs (``colwise_gather_output``, ``rowwise_split_input``), MoE plans
shard experts, GPT-2 has no plan (``from_pretrained`` raises): refused with the reason.
"""

from functools import cache

from planner.core.specs import MlpKind, ModelSpec

#: Families whose transformers 5.24 ``base_model_tp_plan`` shards q, k, v and the MLP's input
#: projections column-wise, o and the MLP's output projection row-wise (configuration_*.py), with
#: ``lm_head: colwise_gather_output`` (modeling_*.py ``_tp_plan``).
TP_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "smollm3", "starcoder2"})


def tp_refusal(m: ModelSpec, t: int) -> str | None:
    """Why ``m`` cannot be planned with a tensor-parallel degree ``t`` (None: it can): a family
    whose plan is not modelled, or heads that do not split evenly (each rank runs attention over
    ``num_heads / t`` query and ``num_kv_heads / t`` key/value heads: transformers'
    ``get_kv_heads_per_rank``; an uneven split leaves a rank a part of a head)."""
    if m.family not in TP_FAMILIES:
        why = {"phi3": "its fused projections gather their outputs (colwise_gather_output)",
               "gpt2": "transformers has no tensor-parallel plan for it"}.get(
            m.family, "its experts' plan" if m.is_moe else "its plan")
        return f"{m.family}: tensor parallelism is not modelled: {why}"
    if m.num_heads % t or m.num_kv_heads % t:
        return (f"{m.num_heads} attention heads and {m.num_kv_heads} key/value heads do not split evenly over "
                f"{t} ranks")
    return None


@cache
def rank_model(m: ModelSpec, t: int) -> ModelSpec:
    """One rank's share of ``m`` under ``t``-way tensor parallelism, as a model of its own: ``1/t``
    of the query and key/value heads, of the MLP's intermediate width and of the vocabulary's rows
    (``vocab_shards``: the embeddings and the head; the logits stay whole), the hidden width and
    every norm whole. Its parameter tensors are exactly the rank's shards of ``m``'s (colwise
    weights and biases ``(out/t, in)``, rowwise weights ``(out, in/t)`` with whole biases), its layer
    lists exactly what a rank saves (the norms and the projections' input whole, the per-head
    tensors and the MLP's intermediates split), its matmul FLOPs the rank's: every cost formula
    reads it as it reads a model (tests/test_tensor_parallel.py against transformers' sharded
    model). ``m`` itself for ``t`` 1. Rank 0's ceil shares where ``t`` does not divide (the
    intermediate width, the vocabulary: ``torch.chunk``); heads must divide (``tp_refusal``)."""
    if t == 1:
        return m
    # (max 1: a degree the heads do not divide is refused, its plan never written)
    return m.model_copy(update={"num_heads": max(1, m.num_heads // t), "num_kv_heads": max(1, m.num_kv_heads // t),
                                "intermediate_size": -(-m.intermediate_size // t), "vocab_shards": t,
                                "published_parameters": None, "published_parameters_source": None})


def embedding_backward_extra(m: ModelSpec) -> tuple[int, int]:
    """(elements, elements per token) a vocabulary-parallel embeddings' backward holds beyond the
    rank's share (``m`` a rank's model; (0, 0) unsplit): ``embedding_dense_backward`` of a
    ``Shard(0)`` weight under DTensor makes the whole vocabulary's gradient on every rank, in the
    weight's dtype, alive until the rank's rows cut from it (a clone) are reduce-scattered; and the
    output gradient masked to the rank's tokens (a copy of the residual's gradient, compute dtype).
    Traced (FSDP2 x TP 2 and 4 under a fake process group, the explanation of the end of backward:
    a (V, h) gradient and a (V/T, h) clone)."""
    if m.vocab_shards == 1:
        return 0, 0
    return m.vocab_size * m.hidden_size, m.hidden_size


def layer_all_reduces(m: ModelSpec) -> tuple[int, int]:
    """All-reduces of a (tokens, hidden) 16-bit tensor one decoder layer runs (forward, backward)
    under tensor parallelism: forward, each row-wise projection's partial output (o, and the MLP's
    output projection); backward, each column-wise module's input gradient, separately (each wraps
    the shared input in its own ``DTensor.from_local``, whose backward reduces its ``Partial``
    gradient): q, k and v, and the MLP's gate and up (or ``c_fc``). Counted with torch's
    ``CommDebugMode`` on transformers' model (tests/test_tensor_parallel.py; Qwen3's replicated
    q/k norms add none there)."""
    mlp_inputs = 1 if m.mlp_kind == MlpKind.PLAIN else 2
    return 2, 3 + mlp_inputs


# torch-native tensor and sequence parallelism (torchtitan's Llama 3 block: models/llama3/
# parallelize.py ``apply_tp``; torch's ``parallelize_module`` styles): each norm runs on the rank's
# positions (``SequenceParallel``), attention's and the MLP's input is all-gathered over the
# positions (``PrepareModuleInput`` Shard(1) -> Replicate), q, k, v, gate and up are column-wise,
# o and down row-wise with their outputs reduce-scattered over the positions (``Shard(1)``).
# Measured on transformers' Llama layer split so (planner/probes/tensor_parallel.py ``sp``;
# benchmarks/tp_activations.py, tests/test_tensor_parallel.py).

#: The tensors a sequence-parallel layer saves whole on every rank: the all-gathered inputs of the
#: column-wise projections, attention's (shared by q, k and v) and the MLP's (by gate and up), each
#: ``hidden`` elements per token in the compute dtype; torch's matmuls save their input as it is
#: given, where Megatron's sequence parallelism saves the rank's shard and gathers it again in
#: backward (Korthikanti et al. 2022, Sec. 4.2.2).
SP_GATHERED_INPUTS = 2
#: (forward, backward) collectives of one sequence-parallel layer over (tokens, hidden) tensors: the
#: two inputs all-gathered and the two outputs reduce-scattered in forward, and in backward each
#: gathered input's gradient reduce-scattered and each output's gradient all-gathered; no
#: all-reduce. Each moves half an all-reduce's bytes, so a layer moves two all-reduces' worth each
#: way (transformers' split without sequence parallelism: ``layer_all_reduces``).
SP_LAYER_ALL_GATHERS = (2, 2)
SP_LAYER_REDUCE_SCATTERS = (2, 2)


def sequence_parallel_layer_bytes(whole: float, m: ModelSpec, t: int, compute_bytes: int) -> float:
    """Bytes per token (of the whole sequence) one decoder layer of ``m`` saves on a rank of a
    ``t``-way tensor and sequence parallel group, given ``whole``: what the layer saves unsplit,
    per token (planner/cost/activations.py ``layer_saved`` of ``m``). Every saved tensor is the
    rank's ``1/t`` (its positions for the norms and the residual stream, its heads and MLP
    columns inside attention and the MLP) but the ``SP_GATHERED_INPUTS`` all-gathered inputs:
    ``(whole - G) / t + G`` with ``G = 2 x hidden x compute bytes``. Exact on transformers' Llama
    layer split as torchtitan splits its own (tests/test_tensor_parallel.py, 2 and 4 ranks; at
    Llama-3.2-1B's widths and 1,024 tokens: 108,680 bytes unsplit, 58,436 at 2 ranks, 33,314 at 4,
    against 70,728 at 2 for transformers' split without sequence parallelism). Llama's block only
    (Qwen3's q/k norms are split on the head dimension by torchtitan's own plan: not measured)."""
    gathered = SP_GATHERED_INPUTS * m.hidden_size * compute_bytes
    return (whole - gathered) / t + gathered
