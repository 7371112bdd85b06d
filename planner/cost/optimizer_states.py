"""Optimizer state bytes per parameter tensor.

Unit: bytes for one tensor of ``numel`` elements (``shape`` where the layout matters).
``state_bytes`` is the byte size of a full-precision state element: 4 (fp32) unless the
parameters themselves are bf16 (bf16-pure), where torch optimizers create states with
``zeros_like(param)`` and so store them in bf16.
"""

from math import ceil, prod

#: bitsandbytes keeps 32-bit state for tensors smaller than this (``min_8bit_size``).
#: Source: bitsandbytes/optim/optimizer.py, Optimizer8bit args (default 4096).
BNB_MIN_8BIT_SIZE = 4096
#: Block-wise quantisation block and its fp32 absmax per state.
#: Source: bitsandbytes/optim/optimizer.py Optimizer2State/1State.init_state
#: (``blocks = n // 256 (+1)``; ``absmax = zeros(blocks, float32)``).
BNB_BLOCK = 256
#: bitsandbytes pages (CUDA unified memory) only state buffers of at least this many elements.
#: Source: bitsandbytes/optim/optimizer.py ``get_state_buffer`` (``p.numel() < 1e5`` -> dense).
BNB_PAGED_MIN_NUMEL = 100_000
FP32 = 4


def full_states(numel: int, n_states: int, state_bytes: int) -> int:
    """AdamW (2 states: exp_avg, exp_avg_sq), Lion and SGD-with-momentum (1). Source: torch.optim."""
    return n_states * numel * state_bytes


def blockwise_8bit_states(numel: int, n_states: int) -> int:
    """bitsandbytes 8-bit block-wise states: 1 byte per element plus one fp32 absmax per 256
    elements, per state; tensors under 4096 elements keep fp32 states (small-tensor exemption).
    Source: Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"; bitsandbytes
    Optimizer2State.init_state."""
    if numel < BNB_MIN_8BIT_SIZE:
        return n_states * FP32 * numel
    return n_states * (numel + FP32 * ceil(numel / BNB_BLOCK))


#: torchao's low-bit AdamW as the Trainer builds it (``adamw_torch_4bit``): blocks of 256 elements
#: (transformers trainer_optimizer.py ``_get_torchao_optimizer``: ``optim_args`` block_size, 256),
#: quantized only for tensors of at least 4096 elements that the block divides.
#: Source: torchao/optim/adam.py ``_AdamBase._new_buffer``.
TORCHAO_BLOCK = 256
TORCHAO_MIN_SIZE = 4096
#: A 4-bit state's lookup table: 16 fp32 values per state tensor (torchao/optim/subclass_4bit.py).
TORCHAO_4BIT_QMAP = 16


def torchao_4bit_states(numel: int, n_states: int, state_bytes: int) -> int:
    """torchao AdamW4bit: per state, the 4-bit codes packed two to a byte, an fp32 scale per block
    and a 16-entry fp32 lookup table; a tensor under 4096 elements or not a whole number of blocks
    keeps a full state in the parameter's dtype (``zeros_like``: ``state_bytes``). Under FSDP2 the
    rule applies to each rank's shard. Source: torchao/optim/subclass_4bit.py
    ``OptimState4bit.zeros`` (codes ``n // 2`` uint8, scale ``n // block_size`` fp32, qmap);
    Li et al. 2023, "Memory Efficient Optimizers with 4-bit States" (arXiv:2309.01507)."""
    if numel < TORCHAO_MIN_SIZE or numel % TORCHAO_BLOCK:
        return n_states * numel * state_bytes
    return n_states * (numel // 2 + FP32 * (numel // TORCHAO_BLOCK) + FP32 * TORCHAO_4BIT_QMAP)


def adam_mini_states(shape: tuple[int, ...], state_bytes: int) -> int:
    """Adam-mini: a full first moment, and one second-moment scalar per block.

    Blocks follow Adam-mini's Hessian-based partition: one per output row for embeddings,
    output head, value/out projections and MLP matrices; one per head for q/k (fewer than rows:
    we take rows, an upper bound); one per 1-D tensor. Source: Zhang et al. 2024, "Adam-mini: Use
    Fewer Learning Rates To Gain More" (arXiv:2406.16793), Sec. 2 and the reference code. The
    second moment is kept in fp32.
    """
    numel = prod(shape)
    v = shape[0] if len(shape) == 2 else 1
    return numel * state_bytes + v * FP32


def adafactor_states(shape: tuple[int, ...], state_bytes: int = FP32) -> int:
    """Adafactor with beta1=None (transformers' default): factored second moment, a row and a
    column vector for matrices, a full vector for 1-D tensors, in the gradient's dtype
    (``state_bytes``: ``.to(grad)``); no first moment; and ``RMS``, the parameter's fp32 root mean
    square, a 0-dim tensor per parameter. Source: Shazeer & Stern 2018 (arXiv:1804.04235),
    transformers.optimization.Adafactor.step (state initialisation, ``state["RMS"] = self._rms(p)``)."""
    if len(shape) >= 2:
        return state_bytes * (prod(shape[:-1]) + prod(shape[:-2] + shape[-1:])) + FP32
    return state_bytes * prod(shape) + FP32


def foreach_step_temporary(adam_state_bytes: int) -> int:
    """Bytes of the tensor list torch's multi-tensor (foreach) Adam and AdamW allocate at the step:
    ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`` for every tensor of a device and
    dtype group at once (torch/optim/adam.py ``_multi_tensor_adam``, torch 2.0-2.13), alive until
    ``_foreach_addcdiv_`` updates the parameters: one second moment, half of ``adam_state_bytes``
    (exp_avg + exp_avg_sq of the same tensors). torch's docs: foreach "uses slightly more peak
    memory than the for-loop due to intermediates being a tensorlist vs just one tensor"; the fused
    kernel updates in place and allocates none."""
    return adam_state_bytes // 2


def per_tensor_step_temporary(largest_numel: int) -> int:
    """Step temporaries of optimizers that update one tensor at a time in Python (Adafactor,
    Adam-mini): about two fp32 tensors the size of the largest parameter (e.g. Adafactor's
    ``grad**2 + eps`` and its update). Fused AdamW and bitsandbytes kernels update in place (0).
    Assumption (measured probes report the allocated peak that would show it)."""
    return 2 * FP32 * largest_numel
