"""The configuration vocabulary: a contract shared by estimate, suggest, check, emitted files and JSON.

Every name here is stable; later issues add values, never rename them.
"""

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    ADAM_MINI = "adam-mini"
    ADAFACTOR = "adafactor"
    LION = "lion"
    LION_8BIT = "lion-8bit"
    SGD = "sgd"


class Precision(StrEnum):
    FP32 = "fp32"
    FP16_MIXED = "fp16-mixed"
    BF16_MIXED = "bf16-mixed"  # fp32 master weights and optimizer states, bf16 compute
    BF16_PURE = "bf16-pure"  # bf16 weights, gradients and optimizer states
    FP8_MIXED = "fp8-mixed"  # bf16-mixed with fp8 matmuls


class Checkpointing(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Sharding(StrEnum):
    NONE = "none"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP = "fsdp"  # full shard
    FSDP_GRAD_OP = "fsdp-grad-op"
    FSDP_HYBRID = "fsdp-hybrid"


class Offload(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"


class Loss(StrEnum):
    STANDARD = "standard"
    CHUNKED = "chunked"  # fused/chunked cross-entropy that never holds full fp32 logits


class Attention(StrEnum):
    SDPA = "sdpa"
    EAGER = "eager"


#: Sequence length when the user gives none: 2048 tokens, or less where the model's positions
#: stop earlier (GPT-2's 1024 learned positions).
DEFAULT_SEQ_LEN = 2048


class TrainingConfig(BaseModel):
    """One fully specified training configuration, in vocabulary terms."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    optimizer: Optimizer = Optimizer.ADAMW
    precision: Precision = Precision.BF16_MIXED
    checkpointing: Checkpointing = Checkpointing.NONE
    sharding: Sharding = Sharding.NONE
    offload: Offload = Offload.NONE
    loss: Loss = Loss.STANDARD
    attention: Attention = Attention.SDPA
    micro_batch_size: int = Field(1, ge=1, le=1_000_000)
    grad_accum: int = Field(1, ge=1, le=1_000_000)
    seq_len: int = Field(2048, ge=1, le=100_000_000)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch_size * self.seq_len
