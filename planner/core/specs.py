"""Value types for the inputs the planner keeps apart: model architecture and hardware.

Both are frozen pydantic models. Catalog loaders build them from data files; nothing here
reads files or knows a particular model or GPU.
"""

from enum import StrEnum
from functools import cached_property
from typing import Annotated

from pydantic import ConfigDict, Field

from planner.core.record import Record

#: A hardware figure read from a file (a catalog or user GPU YAML, a calibration store) before the
#: cost model divides by it or multiplies it out: positive, finite, and below a bound no device
#: approaches (a rate of 1e21 a second is 10,000x a 2026 GPU's 8-bit peak; 2**60 bytes is an
#: exbibyte), so that no formula overflows or divides by zero.
Rate = Annotated[float, Field(gt=0, le=1e21, allow_inf_nan=False)]  # per second: bytes, FLOPs, parameters
Bytes = Annotated[int, Field(ge=0, le=2**60)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Scale = Annotated[float, Field(gt=0, le=100, allow_inf_nan=False)]  # a fitted factor on a catalog rate
#: A model's dimension or count read from its config.json: at least 1, at most 2**31 (no model
#: comes near; a larger one would overflow a float in the ledger's byte counts).
Dim = Annotated[int, Field(ge=1, le=2**31)]
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class NormKind(StrEnum):
    RMS = "rms"  # weight only (Llama, Mistral, Qwen, Phi-3)
    RMS_GEMMA = "rms-gemma"  # weight only, computes in fp32 and scales by (1 + weight)
    LAYER = "layer"  # weight and bias (GPT-2, StarCoder2)


class MlpKind(StrEnum):
    GATED = "gated"  # down(act(gate(x)) * up(x))
    PLAIN = "plain"  # fc2(act(fc1(x))) (GPT-2, StarCoder2)


class ModelSpec(Record):
    """A decoder-only transformer, reduced to what memory and FLOPs depend on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    family: str  # the transformers model_type (planner.catalog.families.SUPPORTED_FAMILIES)
    source: str
    hidden_size: Dim
    num_layers: Dim
    num_heads: Dim
    num_kv_heads: Dim
    head_dim: Dim
    intermediate_size: Dim
    vocab_size: Dim
    max_position_embeddings: Dim
    learned_position_embeddings: bool = False  # GPT-2 wpe: a hard limit on sequence length
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    fused_qkv: bool = False  # Phi-3 qkv_proj / gate_up_proj, GPT-2 c_attn (same parameters, fewer tensors)
    norm_kind: NormKind = NormKind.RMS
    norms_per_layer: int = Field(2, ge=0, le=64)  # Gemma-2 has four
    mlp_kind: MlpKind = MlpKind.GATED
    num_experts: Dim = 1  # Mixtral: num_local_experts
    experts_per_token: Dim = 1
    activation: str = "silu"  # the MLP activation as transformers names it (GPT-2: gelu_new, a Python-level tanh GELU)
    # dropout probabilities in training (0: none); each saves a mask for backward
    attention_dropout: Probability = 0.0  # on the attention probabilities (GPT-2 attn_pdrop, StarCoder2 attention_dropout)
    residual_dropout: Probability = 0.0  # on each block's output before its residual add (GPT-2 resid_pdrop, StarCoder2)
    embedding_dropout: Probability = 0.0  # on the embeddings' output (GPT-2 embd_pdrop, StarCoder2 embedding_dropout)
    final_logit_softcapping: float | None = Field(None, gt=0, allow_inf_nan=False)
    attn_logit_softcapping: float | None = Field(None, gt=0, allow_inf_nan=False)
    # tokens a query attends back to where the model's layers use sliding-window attention
    # (Mistral v0.1, Phi-3-4k; None: full causal attention); at sequences this long or longer
    # transformers builds a (b, 1, s, s) mask instead of SDPA's causal flag
    sliding_window: Dim | None = None
    decoder_layer_class: str = ""  # the transformers block class (FSDP's wrap unit)
    # the ranks the input embeddings and the LM head split on the vocabulary (one rank's model under
    # tensor parallelism: planner/cost/tensor.py ``rank_model``); the logits stay whole (gathered)
    vocab_shards: Dim = 1
    published_parameters: int | None = None
    published_parameters_source: str | None = None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def vocab_rows(self) -> int:
        """Rows of the input embeddings and the LM head this model's rank holds: the vocabulary
        split ``vocab_shards`` ways, rank 0's ceil share (``torch.chunk``, DTensor ``Shard(0)``)."""
        return -(-self.vocab_size // self.vocab_shards)

    def __hash__(self) -> int:
        # pydantic's frozen hash walks every field; the formulas memoized on a ModelSpec are hot
        # in the search. Equality still compares every field, so this only narrows buckets.
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.id, self.family, self.hidden_size, self.num_layers, self.vocab_size, self.num_heads))


class Efficiency(Record):
    """Achieved fractions of a GPU's datasheet peaks (the step-time model's rates)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm: dict[str, Fraction]  # compute dtype -> achieved / dense peak on large matmuls
    attention: float = Field(gt=0, le=1)  # fused attention fwd+bwd / 16-bit dense peak
    memory_bandwidth: float = Field(gt=0, le=1)  # achieved / datasheet bandwidth
    # T0: compute rates scale by T / (T + T0), T = tokens per micro-batch
    saturation_tokens: float = Field(0.0, ge=0, le=2**40, allow_inf_nan=False)
    source: str

    def gemm_for(self, dtype: str) -> float:
        return self.gemm.get(dtype) or min(self.gemm.values())


class Calibration(Record):
    """Corrections fitted from measured probes on this GPU (``planner calibrate``;
    planner/catalog/calibration.py). None: the assumption stays (planner/cost/overheads.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_bytes: Bytes | None = None  # CUDA context + driver-side memory per process
    fragmentation_fraction: float | None = Field(None, ge=0, le=1)  # allocator reserve / allocated peak
    flops_scale: dict[str, Scale] = {}  # compute dtype -> factor applied to the efficiency table
    note: str  # what it was fitted on, for the output


class HostRateSpec(Record):
    """Host-side rates measured beside this GPU, which planner otherwise assumes
    (planner/cost/overheads.py): the CPU optimizer step inside each engine, and paged optimizer
    state's round trip. From the catalog file's ``measured_host`` (measured by the project) or a
    calibration store's corrections (``planner calibrate``), which replace the catalog's per rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_optimizer_params_per_s: dict[str, Rate] = {}  # engine (deepspeed, fsdp) -> parameters a second per node
    page_migration_bytes_per_s: Rate | None = None  # bytes a second, the round trip's rate
    sources: dict[str, str] = {}  # "cpu_optimizer:<engine>" or "page_migration" -> where it was measured


class GpuSpec(Record):
    """One GPU model, from the catalog or a user YAML file. Base units only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    vendor: str
    architecture: str
    compute_capability: str | None
    memory_bytes: Bytes = Field(gt=0)
    memory_bandwidth_bytes_per_s: Rate
    dense_flops_per_s: dict[str, Rate | None]  # fp32, tf32, fp16, bf16, fp8; None = unsupported
    gpu_link_kind: str
    gpu_link_bytes_per_s: Rate  # per GPU, per direction
    host_link_kind: str
    host_link_bytes_per_s: Rate  # per direction
    max_gpus_per_node: int = Field(ge=1, le=4096)
    sm_count: int | None = Field(None, ge=1, le=2**20)  # streaming multiprocessors (None: not in its file)
    driver_reserved_bytes: Bytes | None = None  # nvidia-smi's total less CUDA's (None: not in its file)
    peer_access: bool = True  # two GPUs of a node can map each other's memory (CUDA P2P)
    sources: dict[str, str]
    efficiency: Efficiency
    calibration: Calibration | None = None  # measured corrections in use (None: assumptions only)
    host_rates: HostRateSpec | None = None  # host-side rates measured beside it (None: assumed)
    file: str | None = None  # the user GPU YAML it was read from (absolute path); None: the catalog
    definition: dict | None = None  # that file's content, so that a plan file carries its GPU

    def supports(self, dtype: str) -> bool:
        return self.dense_flops_per_s.get(dtype) is not None


class HardwareSpec(Record):
    """A homogeneous cluster: ``nodes`` machines of ``gpus_per_node`` GPUs each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GpuSpec
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    host_memory_bytes_per_node: int = Field(gt=0)
    inter_node_bytes_per_s: float = Field(gt=0)  # network per node, per direction
    # rates no catalog measures (None: planner's assumption, planner/cost/overheads.py): paged
    # optimizer state migrating over the host link, and a CPU optimizer step, per node
    page_migration_bytes_per_s: float | None = Field(None, gt=0)
    cpu_optimizer_params_per_s: float | None = Field(None, gt=0)
    notes: list[str] = []  # how the --gpus spec was read, where a user should know (an ambiguous name)

    @property
    def inter_node_bytes_per_s_per_gpu(self) -> float:
        return self.inter_node_bytes_per_s / self.gpus_per_node

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node
