"""What type checkers see of the models the registry builds at import time (strategies/__init__.py
``TrainingConfig``, strategies/request_fields.py ``TechniqueChoices`` and ``TechniqueLists``): the same
fields, in the same order, with the same types and defaults, written out. Imported only under
``typing.TYPE_CHECKING``; tests/test_strategies_contract.py checks each equals the model it stands
for, so a new technique or setting fails there until it is written here too (a new value of an
existing technique needs nothing here)."""

from pydantic import Field

from planner.core.lengths import Batching
from planner.core.record import Record
from planner.core.vocabulary import ConfigBase
from planner.strategies.adapter import Adapter, AdapterDtype, KbitPrep, LoraTargets, Nf4Matmul
from planner.strategies.attention import Attention
from planner.strategies.checkpoint_offload import CheckpointOffload
from planner.strategies.checkpointing import CheckpointImpl, Checkpointing
from planner.strategies.generation import Generation
from planner.strategies.loss import Loss, LossPath, ModelOutput
from planner.strategies.method import DpoLogprobs, DpoReference, KtoLoss, Method
from planner.strategies.offload import Offload
from planner.strategies.optimizer import Optimizer
from planner.strategies.precision import Precision
from planner.strategies.sequence_parallel import SequenceParallel
from planner.strategies.sharding import GradientSync, Sharding
from planner.strategies.tensor_parallel import TensorParallel
from planner.strategies.tiled_mlp import TiledMlp


class TrainingConfig(ConfigBase):
    optimizer: Optimizer = Optimizer.ADAMW
    precision: Precision = Precision.BF16_MIXED
    checkpointing: Checkpointing = Checkpointing.NONE
    sharding: Sharding = Sharding.NONE
    offload: Offload = Offload.NONE
    loss: Loss = Loss.STANDARD
    attention: Attention = Attention.SDPA
    adapter: Adapter = Adapter.NONE
    method: Method = Method.SFT
    generation: Generation = Generation.NONE
    sequence_parallel: SequenceParallel = SequenceParallel.NONE
    checkpoint_offload: CheckpointOffload = CheckpointOffload.NONE
    tiled_mlp: TiledMlp = TiledMlp.NONE
    tensor_parallel: TensorParallel = TensorParallel.NONE
    checkpoint_impl: CheckpointImpl = CheckpointImpl.NON_REENTRANT
    fsdp_version: int = 2
    gradient_sync: GradientSync = GradientSync.MICRO_BATCH
    zero_reduce_bucket_size: int = 0
    zero_prefetch_bucket_size: int = 0
    zero_persistence_threshold: int = 0
    zero_max_live_parameters: int = 1000000000
    loss_path: LossPath = LossPath.PAD_LABELS
    model_output: ModelOutput = ModelOutput.DROPPED
    lora_rank: int = 16
    lora_targets: LoraTargets = LoraTargets.ALL_LINEAR
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    adapter_dtype: AdapterDtype = AdapterDtype.AUTO
    nf4_matmul: Nf4Matmul = Nf4Matmul.FREES_INPUT
    kbit_prep: KbitPrep = KbitPrep.NONE
    dpo_reference: DpoReference = DpoReference.MODEL
    dpo_logprobs: DpoLogprobs = DpoLogprobs.FUSED
    kto_loss: KtoLoss = KtoLoss.KTO
    num_generations: int = 8
    completion_len: int = 512
    kl_beta: float = 0.0
    generation_batch_size: int = 0
    num_iterations: int = 1
    vllm_share: float = 0.0
    vllm_gpus: int = 1
    vllm_tp: int = 0
    sp_size: int = 2
    tp_size: int = 2
    micro_batch_size: int = 1
    grad_accum: int = 1
    seq_len: int = 2048
    batching: Batching = Batching.PACKED
    kernel_seq_len: float | None = None
    attention_seq_len: float | None = None
    real_seq_len: float | None = None


class TechniqueChoices(Record):
    optimizer: Optimizer | None = None
    precision: Precision | None = None
    checkpointing: Checkpointing | None = None
    sharding: Sharding | None = None
    offload: Offload | None = None
    loss: Loss | None = None
    attention: Attention | None = None
    adapter: Adapter | None = None
    method: Method | None = None
    generation: Generation | None = None
    sequence_parallel: SequenceParallel | None = None
    checkpoint_offload: CheckpointOffload | None = None
    tiled_mlp: TiledMlp | None = None
    tensor_parallel: TensorParallel | None = None
    checkpoint_impl: CheckpointImpl | None = None
    fsdp_version: int | None = None
    gradient_sync: GradientSync | None = None
    zero_reduce_bucket_size: int | None = None
    zero_prefetch_bucket_size: int | None = None
    zero_persistence_threshold: int | None = None
    zero_max_live_parameters: int | None = None
    loss_path: LossPath | None = None
    model_output: ModelOutput | None = None
    lora_rank: int | None = None
    lora_targets: LoraTargets | None = None
    lora_alpha: int | None = None
    lora_dropout: float | None = None
    adapter_dtype: AdapterDtype | None = None
    nf4_matmul: Nf4Matmul | None = None
    kbit_prep: KbitPrep | None = None
    dpo_reference: DpoReference | None = None
    dpo_logprobs: DpoLogprobs | None = None
    kto_loss: KtoLoss | None = None
    num_generations: int | None = None
    completion_len: int | None = None
    kl_beta: float | None = None
    generation_batch_size: int | None = None
    num_iterations: int | None = None
    vllm_share: float | None = None
    vllm_gpus: int | None = None
    vllm_tp: int | None = None
    sp_size: int | None = None
    tp_size: int | None = None


class TechniqueLists(Record):
    optimizer: list[Optimizer] = Field(default_factory=list)
    precision: list[Precision] = Field(default_factory=list)
    checkpointing: list[Checkpointing] = Field(default_factory=list)
    sharding: list[Sharding] = Field(default_factory=list)
    offload: list[Offload] = Field(default_factory=list)
    loss: list[Loss] = Field(default_factory=list)
    attention: list[Attention] = Field(default_factory=list)
    adapter: list[Adapter] = Field(default_factory=list)
    method: list[Method] = Field(default_factory=list)
    generation: list[Generation] = Field(default_factory=list)
    sequence_parallel: list[SequenceParallel] = Field(default_factory=list)
    checkpoint_offload: list[CheckpointOffload] = Field(default_factory=list)
    tiled_mlp: list[TiledMlp] = Field(default_factory=list)
    tensor_parallel: list[TensorParallel] = Field(default_factory=list)
    checkpoint_impl: CheckpointImpl | None = None
    fsdp_version: int | None = None
    gradient_sync: GradientSync | None = None
    zero_reduce_bucket_size: int | None = None
    zero_prefetch_bucket_size: int | None = None
    zero_persistence_threshold: int | None = None
    zero_max_live_parameters: int | None = None
    loss_path: LossPath | None = None
    model_output: ModelOutput | None = None
    lora_rank: int | None = None
    lora_targets: LoraTargets | None = None
    lora_alpha: int | None = None
    lora_dropout: float | None = None
    adapter_dtype: AdapterDtype | None = None
    nf4_matmul: Nf4Matmul | None = None
    kbit_prep: KbitPrep | None = None
    dpo_reference: DpoReference | None = None
    dpo_logprobs: DpoLogprobs | None = None
    kto_loss: KtoLoss | None = None
    num_generations: int | None = None
    completion_len: int | None = None
    kl_beta: float | None = None
    generation_batch_size: int | None = None
    num_iterations: int | None = None
    vllm_share: float | None = None
    vllm_gpus: int | None = None
    vllm_tp: int | None = None
    sp_size: int | None = None
    tp_size: int | None = None
