"""The launch contract's own file and who launches a plan (core types; no I/O here).

A plan runs through ``accelerate launch`` with the emitted accelerate YAML, DeepSpeed JSON and
Trainer arguments, read by the real libraries. What none of their keys can say (the weights'
load dtype for bf16-pure, the attention implementation, an optimizer the Trainer has no ``optim``
name for, the selective checkpointing policy, the sequence length and how the data is batched) is in
``runtime.json``, which the planner entry point (``python -m planner.launch``) applies in the
training process and ``planner check`` reads back like any other job file. Each technique writes
and reads its own keys (its strategy's ``emit`` and ``read``); this module only fixes the format.
"""

from enum import StrEnum

from pydantic import ConfigDict, Field

from planner.core.lengths import Batching
from planner.core.record import Record
from planner.core.vocabulary import MAX_SEQ_LEN

RUNTIME_FILE = "runtime.json"
#: The environment launch.sh sets, and the measured probes run under: expandable segments let the
#: caching allocator grow segments instead of stranding free blocks, which shrinks fragmentation
#: (PyTorch "CUDA semantics", optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF).
ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
LAUNCH_ENV = {ALLOC_CONF_VAR: "expandable_segments:True"}


class Launcher(StrEnum):
    """Who runs the emitted files: planner's entry point (every plan), or the user's own Trainer
    script reading the standard files only (plans needing runtime.json are not ranked)."""

    PLANNER = "planner"
    TRAINER = "trainer"


class RuntimeArgs(Record):
    """runtime.json. Values are vocabulary or library names; each technique's reader checks its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    planner_version: str
    seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)  # tokens per training sequence (padded: at most)
    batching: Batching = Batching.PACKED  # how the launch batches the samples (planner/core/lengths.py)
    dtype: str = "float32"  # from_pretrained(dtype=...): the parameters' dtype
    attn_implementation: str = "sdpa"  # from_pretrained(attn_implementation=...)
    optimizer: str | None = None  # built by the runtime where the Trainer has no optim name for it
    checkpointing: str | None = None  # a checkpointing policy the runtime applies to each decoder layer
    lora: dict | None = None  # peft LoraConfig keyword arguments: the adapter the runtime wraps the model with
    quantization: dict | None = None  # transformers BitsAndBytesConfig keyword arguments (QLoRA's 4-bit base)
    adapter_dtype: str = "auto"  # the adapters' dtype under bf16-pure: auto (16 bit) or fp32 (peft's default)
    kbit_prep: str = "none"  # peft's prepare_model_for_kbit_training on the 4-bit base: none, fp32-norms or fp32
    tiled_mlp: str = "none"  # DeepSpeed's TiledMLP around each decoder layer's MLP: none or tiled
    tensor_parallel: str = "none"  # transformers' DistributedConfig at load: none or transformers
    tp_size: int | None = Field(None, ge=2)  # its tensor-parallel degree
    load_sharding: str | None = None  # the FSDP2 mode DistributedConfig applies with it: fsdp or fsdp-hybrid

    #: The values that say nothing beyond what the standard files and the libraries' defaults do.
    @classmethod
    def neutral(cls) -> dict:
        return {"dtype": "float32", "attn_implementation": "sdpa", "optimizer": None, "checkpointing": None,
                "lora": None, "quantization": None, "batching": Batching.PACKED, "adapter_dtype": "auto",
                "kbit_prep": "none", "tiled_mlp": "none", "tensor_parallel": "none", "tp_size": None,
                "load_sharding": None}
