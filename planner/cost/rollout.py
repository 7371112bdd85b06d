"""GRPO's rollout as TRL's GRPOTrainer runs it: generating completions (transformers' ``generate``
or vLLM, colocated in the training process or as a separate server) and scoring them, per GPU.

Facts read from TRL's code (trl/trainer/grpo_trainer.py, trl/trainer/grpo_config.py,
trl/generation/vllm_generation.py; release 1.16.0) and vLLM's (vllm/v1/worker/gpu_worker.py):

- **The generation batch.** Every ``steps_per_generation x num_iterations`` micro-batches
  (``_prepare_inputs``'s ``generate_every``; by default ``steps_per_generation`` is the gradient
  accumulation steps and ``num_iterations`` 1, so once per optimizer step) each process generates
  completions for its share of the generation batch: ``per_device_train_batch_size x
  steps_per_generation`` rows, all at once (``GRPOConfig.__post_init__``: ``generation_batch_size``
  is that times the processes, whole groups of ``num_generations``); the rows are then split into
  micro-batches for training, each pass of ``num_iterations`` over them.
- **transformers' generate** runs the training model itself (``unwrap_model_for_generation``,
  under ``no_grad``): a KV cache of every row, prompt and completion (``DynamicCache``: per layer
  a key and a value of ``n_kv_heads x head_dim`` per token in the compute dtype), and per decode
  step the last position's logits in fp32 with their softmax for sampling.
- **vLLM colocate** (``vllm_mode="colocate"``): an ``LLM`` in each training process with
  ``gpu_memory_utilization`` (TRL's ``vllm_gpu_memory_utilization``, default 0.3) of the GPU's
  total memory as its budget: its own copy of the weights (16-bit; 4-bit when the policy is a
  bitsandbytes 4-bit model), its profiled activations, CUDA graphs, and a KV cache filling the
  rest (vLLM v1 ``determine_available_memory``: requested memory less the non-KV-cache memory).
  ``max_num_seqs = per_device_train_batch_size x vllm_tensor_parallel_size x steps_per_generation``
  and ``max_num_batched_tokens = 4096``. With ``vllm_enable_sleep_mode`` the engine sleeps at
  level 2 (weights and KV cache discarded) outside generation; TRL wakes it, pushes the weights
  and generates.
- **vLLM server** (``vllm_mode="server"``): ``trl vllm-serve`` on GPUs of its own (its
  ``--gpu_memory_utilization`` defaults to 0.9); the training processes send prompts and, after
  each optimizer step, the main process broadcasts the weights over NCCL.
- **Scoring.** Under ``no_grad`` each process runs forwards of ``per_device_train_batch_size``
  rows over its generation batch: the policy's (``old_per_token_logps``) whenever vLLM generated
  (``vllm_importance_sampling_correction``, default true) or the generation is not aligned with
  the optimizer steps, and the reference's when ``beta`` is not 0 (TRL 1.16's default ``beta`` is
  0.0: no reference). Both through the fused LM head (planner/cost/preference.py).
"""

from math import ceil

from planner.core.specs import ModelSpec

#: TRL's default ``vllm_gpu_memory_utilization`` in colocate mode (grpo_config.py, TRL 1.16).
COLOCATE_SHARE_DEFAULT = 0.3
#: ``trl vllm-serve``'s default ``--gpu_memory_utilization`` (trl/scripts/vllm_serve.py).
SERVER_SHARE_DEFAULT = 0.9
#: The token budget of one vLLM scheduler step TRL sets in colocate mode (``max_num_batched_tokens``).
BATCHED_TOKENS = 4096
#: vLLM's KV-cache block: the KV cache is allocated and shared in blocks of this many tokens
#: (vLLM's default ``block_size`` on CUDA).
BLOCK_TOKENS = 16
#: Bytes of vLLM's non-torch allocations inside its budget (NCCL, cuBLAS workspaces of its own).
#: Source: vLLM PR #11743's profile of a standalone engine on an 80 GB GPU ("non_torch 0.67GiB").
NON_TORCH_BYTES = round(0.67 * 2**30)
#: Bytes of vLLM's CUDA graphs (the decode batch sizes it captures), outside its
#: ``gpu_memory_utilization`` budget: vllm/v1/worker/gpu_worker.py, "memory_profiling does not
#: consider CUDAGraph memory size" (vLLM < 0.21, which starts to estimate it). Kept through sleep
#: (PR #11743: "cudagraph memory pool is not released"). Assumption from start-up logs: Qwen2.5-7B,
#: vLLM 0.8.4 V1, TP 1, 67 sizes: "Graph capturing finished in 24 secs, took 1.44 GiB"; Qwen2-7B
#: 1.56 GiB; Gemma-3-4B 0.65 GiB. A GPU run calibrates it (benchmarks/gpu_validate.sh).
CUDA_GRAPH_BYTES = round(1.5 * 2**30)
#: Fraction of the GPU's datasheet memory bandwidth a vLLM decode step reaches. Source:
#: LambdaLabsML/vllm-benchmark, 1xH100-80GB-SXM, Meta-Llama-3-8B-Instruct, TP 1, 10 concurrent
#: requests: median time per output token 7.56 ms (about 7.2 ms a step) against 16 GB of weights
#: over 3.35 TB/s = 4.8 ms: about 0.65. Assumption for every GPU until calibrated.
DECODE_BANDWIDTH_EFFICIENCY = 0.65


def kv_bytes_per_token(m: ModelSpec, dtype_bytes: float, tp: int = 1) -> float:
    """KV-cache bytes per token of one sequence on one GPU of a ``tp``-way tensor-parallel engine:
    a key and a value per layer, ``n_kv_heads / tp`` heads of ``head_dim`` elements each (at
    least one: vLLM replicates the KV heads where ``tp`` exceeds them), in ``dtype_bytes``. Unit:
    bytes per token. Source: transformers' ``DynamicCache`` layers (``torch.cat`` of the new keys
    and values) and vLLM's ``FullAttentionSpec.page_size_bytes`` (2 x block x kv heads x head size
    x dtype bytes per layer; ``get_num_kv_heads``: ``max(1, total_num_kv_heads // tp)``).
    Assumption: full attention in every layer (a sliding window would cap vLLM's)."""
    return 2 * m.num_layers * max(1, m.num_kv_heads // tp) * m.head_dim * dtype_bytes


#: Seconds of one small all-reduce between a tensor-parallel engine's GPUs (two per decoder
#: layer per decode step). Assumption (a few microseconds of NCCL or vLLM's custom all-reduce on
#: NVLink, at decode's message sizes); a GPU run calibrates it.
TP_ALLREDUCE_SECONDS = 15e-6
#: The largest share of a GPU a colocated engine's weights may take before planner splits them
#: over more GPUs (``tensor_parallel``): three quarters of each GPU left to training. planner's
#: rule, not TRL's (whose default tensor parallelism is 1); ``--vllm-tp`` sets it.
COLOCATED_WEIGHT_SHARE = 0.25
#: The same for a server's GPUs: half of each left to the KV cache.
SERVER_WEIGHT_SHARE = 0.5


def tensor_parallel(weight_bytes: int, gpu_bytes: int, most: int, share: float, m: ModelSpec) -> int:
    """The smallest power of two ``t`` (at most ``most``) whose shard of the weights,
    ``weight_bytes / t``, is at most ``share`` of a GPU, among those vLLM can split the model by (the
    attention heads a multiple of ``t``; the KV heads a multiple of it, or it of them); ``most`` when
    none is. Unit: GPUs."""
    t = 1
    while t < most:
        if weight_bytes / t <= share * gpu_bytes and tp_divides(m, t):
            return t
        t *= 2
    return t


def tp_divides(m: ModelSpec, tp: int) -> bool:
    """Whether vLLM can split ``m`` over ``tp`` GPUs: its attention heads a multiple of ``tp`` and its
    KV heads a multiple of ``tp`` or ``tp`` of them (vLLM ``ModelConfig.verify_with_parallel_config``,
    ``get_num_kv_heads``)."""
    return m.num_heads % tp == 0 and (m.num_kv_heads % tp == 0 or tp % m.num_kv_heads == 0)


def transformers_kv_bytes(m: ModelSpec, rows: int, seq_len: int, dtype_bytes: float) -> int:
    """Bytes of transformers' KV cache at the end of a generation: every row's prompt (left-padded
    to the longest) and completion. Unit: bytes."""
    return ceil(rows * seq_len * kv_bytes_per_token(m, dtype_bytes))


def sampling_bytes(m: ModelSpec, rows: int) -> int:
    """Bytes of one decode step's sampling in transformers' ``generate``: the last position's
    logits cast to fp32, the processed scores and the softmax probabilities (three rows x V fp32
    tensors). Unit: bytes. Source: transformers ``GenerationMixin._sample`` (``outputs.logits[:,
    -1, :].to(copy=True, dtype=torch.float32)``, ``logits_processor``, ``softmax``)."""
    return 3 * rows * m.vocab_size * 4


def engine_activation_bytes(m: ModelSpec, max_num_seqs: int, dtype_bytes: float) -> int:
    """Bytes of vLLM's profiled forward (its dummy run at ``BATCHED_TOKENS`` tokens and a sampler
    run of ``max_num_seqs`` rows), kept out of the KV cache: one layer's widest intermediates (the
    MLP's gate and up projections and their product, the attention's q, k, v) for the token budget,
    and fp32 logits with their probabilities for the sampled rows. Unit: bytes. Assumption: the
    layer's intermediates freed as it goes (no_grad, inference mode)."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    layer = BATCHED_TOKENS * (3 * m.intermediate_size + q + 2 * kv + 2 * m.hidden_size) * dtype_bytes
    return ceil(layer + 2 * min(max_num_seqs, BATCHED_TOKENS) * m.vocab_size * 4)


def engine_fixed_bytes(weight_bytes: int, m: ModelSpec, max_num_seqs: int, dtype_bytes: float) -> int:
    """Bytes of a vLLM engine's budget before its KV cache: its weights, its profiled activations
    and its non-torch allocations (vLLM v1 ``determine_available_memory``: the requested memory less
    these is the KV cache). Unit: bytes."""
    return weight_bytes + engine_activation_bytes(m, max_num_seqs, dtype_bytes) + NON_TORCH_BYTES


def engine_bytes(share: float, gpu_bytes: int) -> int:
    """Bytes a vLLM engine of ``share`` (``gpu_memory_utilization``) holds on its GPU: the share of
    the GPU's total memory (its budget, which its KV cache fills) and its CUDA graphs beyond it.
    Unit: bytes."""
    return int(share * gpu_bytes) + CUDA_GRAPH_BYTES


def kv_capacity_tokens(budget: int, fixed: int, m: ModelSpec, dtype_bytes: float, tp: int = 1) -> int:
    """Tokens of KV cache a vLLM engine of ``budget`` bytes per GPU (``gpu_memory_utilization`` x
    the GPU's memory) holds after its fixed bytes (``engine_fixed_bytes``, per GPU), in whole
    blocks. Unit: tokens; 0 when the budget does not cover the fixed bytes."""
    free = budget - fixed
    per_block = BLOCK_TOKENS * kv_bytes_per_token(m, dtype_bytes, tp)
    return max(0, int(free // per_block)) * BLOCK_TOKENS


def concurrent_rows(capacity_tokens: int, seq_len: int, max_num_seqs: int) -> int:
    """Sequences vLLM decodes at once: its ``max_num_seqs``, or fewer where the KV cache cannot
    hold that many full sequences (``seq_len`` tokens each, rounded up to blocks). Unit: sequences;
    0 when not even one fits (vLLM refuses to start)."""
    per_row = -(-seq_len // BLOCK_TOKENS) * BLOCK_TOKENS
    return min(max_num_seqs, capacity_tokens // per_row)


def share_for(fixed: int, rows: int, seq_len: int, m: ModelSpec, dtype_bytes: float, gpu_bytes: int,
              step: float = 0.05, tp: int = 1) -> float:
    """The smallest ``gpu_memory_utilization``, in steps of ``step``, whose budget holds the
    engine's fixed bytes (per GPU) and the KV cache of ``rows`` full sequences at once. Unit: a
    fraction of the GPU's memory (may exceed 1: no share holds them)."""
    per_row = -(-seq_len // BLOCK_TOKENS) * BLOCK_TOKENS * kv_bytes_per_token(m, dtype_bytes, tp)
    need = fixed + rows * per_row
    return ceil(round(need / gpu_bytes / step, 9)) * step


#: Passes over the KV cache per decode step: vLLM's paged cache is read once by attention;
#: transformers' ``DynamicCache`` grows by ``torch.cat`` of every layer's keys and values each step
#: (cache_utils.py ``DynamicLayer.update``: the whole cache read and written again) before
#: attention reads it.
KV_PASSES = {"vllm": 1, "transformers": 3}


def decode_seconds(weight_bytes: float, m: ModelSpec, rows: int, concurrent: int, prompt: int, completion: int,
                   dtype_bytes: float, bandwidth: float, flops_rate: float, parameters: int,
                   per_step_seconds: float = 0.0, kv_passes: int = 1, tp: int = 1) -> float:
    """Seconds to generate ``completion`` tokens for each of ``rows`` sequences, ``concurrent`` at a
    time: per decode step the weights are read and every live sequence's KV cache ``kv_passes`` times at
    ``bandwidth`` (memory bound; a vLLM engine's: ``DECODE_BANDWIDTH_EFFICIENCY`` of the
    datasheet's) unless the step's matmuls (2 x parameters FLOPs per sequence) take longer, plus
    ``per_step_seconds`` of host work per step; the context grows from ``prompt`` to ``prompt +
    completion``, taken at its mean. On a ``tp``-way engine ``weight_bytes`` is one GPU's shard,
    each GPU reads its KV heads (``kv_bytes_per_token``) and does 1/tp of the FLOPs, and each step
    adds two all-reduces per layer (``TP_ALLREDUCE_SECONDS``). Prefill not included
    (``prefill_seconds``). Unit: seconds.
    Assumption: every completion runs to ``completion`` tokens (the longest a step can wait for:
    the batch ends with its longest completion)."""
    if rows <= 0 or concurrent <= 0:
        return 0.0
    waves, seconds = ceil(rows / concurrent), 0.0
    for wave in range(waves):
        live = min(concurrent, rows - wave * concurrent)
        kv = kv_passes * live * (prompt + completion / 2) * kv_bytes_per_token(m, dtype_bytes, tp)
        allreduce = 2 * m.num_layers * TP_ALLREDUCE_SECONDS if tp > 1 else 0.0
        step = max((weight_bytes + kv) / bandwidth, 2 * parameters * live / tp / flops_rate) + per_step_seconds + allreduce
        seconds += completion * step
    return seconds


def prefill_seconds(parameters: int, rows: int, prompt: int, flops_rate: float) -> float:
    """Seconds of the prompts' forward (compute bound: 2 x parameters FLOPs per token). Unit:
    seconds."""
    return 2 * parameters * rows * prompt / flops_rate
