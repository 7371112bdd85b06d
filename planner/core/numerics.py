"""Numerics: which choices change the training math, and the ladder of how much.

Exact choices compute what fp32-master AdamW computes under bf16/fp16 autocast, up to the
rounding of a different kernel or summation order: sharding (DDP, ZeRO, FSDP), offload, paging,
activation checkpointing, fused or eager attention, a chunked or fused loss, fp32 or fp16-mixed
(with dynamic loss scaling) instead of bf16-mixed. Approximations change what is computed or
stored; different methods change the learning algorithm (hyperparameters do not carry over).

The ladder, least quality risk first (each strategy says which of its choices sit on which rung,
``Strategy.numerics``):

1. ``STATES_8BIT`` 8-bit optimizer states (block-wise quantised, fp32 absmax per 256 elements):
   Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization" (ICLR), report 32-bit
   accuracy recovered across LM pre-training and fine-tuning benchmarks.
2. ``FP8`` fp8 matmuls in the decoder layers (torchao Float8Linear, tensor-wise dynamic
   scaling): loss curves matching bf16 on Llama-3 8B/70B pre-training in torchtitan's published
   runs (PyTorch blog, "Supercharging training using float8 and FSDP2", 2024), but the least
   precision of any exact-looking choice: outliers in activations can diverge (Fishman et al.
   2024, "Scaling FP8 training to trillion-token LLMs").
3. ``ADAM_MINI`` one second-moment value per block instead of per parameter: Zhang et al. 2024,
   "Adam-mini: Use Fewer Learning Rates To Gain More" show parity with AdamW on their runs; it is a
   different update rule, so results can differ from AdamW's.
4. ``BF16_WEIGHTS`` bf16 weights, gradients and states with no fp32 master copy: updates below
   bf16's resolution (8 bits of mantissa) are rounded away; Zamirai et al. 2020, "Revisiting
   BFloat16 Training", measure a quality gap without stochastic rounding or Kahan summation.
5. ``METHOD`` a different optimizer (Lion, Adafactor, SGD): used only when the user names it.

A plan's numerics key is its rungs, largest first: () is exact; comparing keys orders plans from
least to most quality risk (the largest rung decides, then the next, then how many).
"""

from enum import IntEnum, StrEnum


class Rung(IntEnum):
    EXACT = 0
    STATES_8BIT = 1
    FP8 = 2
    ADAM_MINI = 3
    BF16_WEIGHTS = 4
    METHOD = 5


#: What each rung changes, in a phrase a user reads.
RUNG_WORDS = {
    Rung.STATES_8BIT: "8-bit optimizer states",
    Rung.FP8: "fp8 matmuls",
    Rung.ADAM_MINI: "Adam-mini's shared second moments",
    Rung.BF16_WEIGHTS: "bf16 weights without an fp32 master copy",
    Rung.METHOD: "a different optimizer",
}


class NumericsPolicy(StrEnum):
    """``--numerics``: exact plans only; the ladder (exact when one fits, else the least
    approximation that fits: the default); or any plan, ranked by speed."""

    EXACT = "exact"
    LADDER = "ladder"
    ANY = "any"


def numerics_key(rungs: list[Rung]) -> tuple[int, ...]:
    """The ordering key of a plan's approximations: its rungs, largest first (() when exact)."""
    return tuple(sorted((int(r) for r in rungs if r != Rung.EXACT), reverse=True))
