"""The configuration vocabulary's frame: the workload fields every plan has, and how the technique
fields join them into one configuration model.

Each technique's choices live in its strategy module (strategies/), which owns them; the registry
(strategies/__init__.py) builds ``TrainingConfig`` with ``config_model``. Every name is stable: later
issues add values and techniques, never rename them.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import GenericAlias
from typing import TYPE_CHECKING, Any, Self, cast

from pydantic import ConfigDict, Field, create_model

from planner.core.lengths import Batching
from planner.core.record import Record

#: Sequence length when the user gives none: 2048 tokens, or less where the model's positions
#: stop earlier (GPT-2's 1024 learned positions).
DEFAULT_SEQ_LEN = 2048
MAX_BATCH = 1_000_000
MAX_SEQ_LEN = 100_000_000

#: The workload of one plan, after its techniques: sequences per GPU per micro-batch, micro-batches
#: per optimizer step, tokens per sequence (the longest micro-batch's: the peak's), how sequences are
#: batched, and where rows are not all that long (padded batching of shorter samples,
#: planner/core/lengths.py ``shape``) the expected tokens per row the kernels run, attention's
#: per-token length and the real tokens per row (None: ``seq_len``).
WORKLOAD_FIELDS: dict[str, tuple[Any, Any]] = {
    "micro_batch_size": (int, Field(1, ge=1, le=MAX_BATCH)),
    "grad_accum": (int, Field(1, ge=1, le=MAX_BATCH)),
    "seq_len": (int, Field(DEFAULT_SEQ_LEN, ge=1, le=MAX_SEQ_LEN)),
    "batching": (Batching, Field(Batching.PACKED)),
    "kernel_seq_len": (float | None, Field(None, gt=0, le=MAX_SEQ_LEN)),
    "attention_seq_len": (float | None, Field(None, gt=0, le=MAX_SEQ_LEN)),
    "real_seq_len": (float | None, Field(None, gt=0, le=MAX_SEQ_LEN)),
}
WORKLOAD = tuple(WORKLOAD_FIELDS)
#: The workload fields a plan derives from its batching and its samples' lengths (no file or flag
#: sets them: planner/engine/space.py ``shape_fields``).
SHAPE_FIELDS = ("kernel_seq_len", "attention_seq_len", "real_seq_len")


@dataclass(frozen=True)
class Setting:
    """A technique's numeric or named parameter beside its choice (LoRA's rank, targets, alpha,
    dropout): a TrainingConfig field the search never varies, taken from the request as given."""

    name: str  # the field; its flag is --name-with-dashes
    type: type
    default: Any
    help: str
    ge: float | None = None
    le: float | None = None
    #: the technique's values where it means something (empty: the strategy's ``settings_used``)
    used_at: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def field(self, optional: bool = False) -> tuple[Any, Any]:
        """The pydantic field: the default, or None (optional: "as the default says")."""
        kind: Any = (self.type | None) if optional else self.type
        return kind, Field(None if optional else self.default, ge=self.ge, le=self.le)


#: Sequences the model runs per sample of a micro-batch, by training method (the ``method``
#: technique, strategies/method.py): a preference pair runs two, prompt + chosen and prompt +
#: rejected on the batch axis (TRL's DataCollatorForPreference); any other sample one.
ROWS_PER_SAMPLE = {"dpo": 2}
#: Methods whose trainer pads each micro-batch to its longest sequence and never packs: TRL's
#: DataCollatorForPreference (DPOConfig's padding_free falls back to padding in TRL 1.16) and
#: GRPOTrainer (prompts padded left, completions right: grpo_trainer.py ``_generate_and_score_completions``)
#: and KTOTrainer (DataCollatorForUnpairedPreference).
PADDED_METHODS = frozenset({"dpo", "grpo", "kto"})
#: The sequence length from which suggest searches the long-context levers unasked (tokens):
#: sequence-parallel degrees and activation-checkpoint offload (planner/engine/degrees.py).
LONG_SEQUENCE_TOKENS = 16_384
#: The ``sequence_parallel`` values that split each sequence over ``sp_size`` ranks
#: (strategies/sequence_parallel.py): every token count of a rank is its share of the sequence.
SEQUENCE_SHARDED = frozenset({"ulysses", "ring"})
#: The ``tensor_parallel`` values that split each layer over ``tp_size`` ranks sharing every token
#: (strategies/tensor_parallel.py): a data-parallel replica is ``tp_size`` GPUs.
TENSOR_SHARDED = frozenset({"transformers"})
#: Of those, the ones whose attention splits the heads over the ranks instead (Ulysses: each rank
#: attends over every position for its heads; ring attention keeps every head).
HEADS_SHARDED = frozenset({"ulysses"})


def tensor_shards_of(get) -> int:
    """Ranks each layer is split over (``tp_size`` under tensor parallelism; else 1): each runs every
    token of its group's micro-batch through its share of the model. ``get``: a configuration field's
    value by name; only ``tensor_parallel`` is read where it is none (a search remembers what a
    layout hook reads by the fields read, in order: planner/engine/recorded.py)."""
    if str(get("tensor_parallel") or "none") not in TENSOR_SHARDED:
        return 1
    return int(get("tp_size") or 1)


class ConfigBase(Record):
    """One fully specified training configuration, in vocabulary terms (a frozen value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    if TYPE_CHECKING:  # fields of every configuration model (the workload's, last: config_model)
        micro_batch_size: int
        grad_accum: int
        seq_len: int
        batching: Batching
        kernel_seq_len: float | None
        attention_seq_len: float | None
        real_seq_len: float | None

    @property
    def rows_per_micro_batch(self) -> int:
        """Sequences the model runs per micro-batch: ``micro_batch_size`` samples (a DPO sample is a
        pair: ``ROWS_PER_SAMPLE``)."""
        return self.micro_batch_size * ROWS_PER_SAMPLE.get(str(getattr(self, "method", "")), 1)

    @property
    def sequence_shards(self) -> int:
        """Ranks one sequence is split over (``sp_size`` under Ulysses or ring attention; else 1):
        each holds ``seq_len / sequence_shards`` of its positions."""
        if str(getattr(self, "sequence_parallel", "")) in SEQUENCE_SHARDED:
            return int(getattr(self, "sp_size", 1))
        return 1

    @property
    def heads_shards(self) -> int:
        """Ranks attention's heads are split over (``sp_size`` under Ulysses; else 1)."""
        if str(getattr(self, "sequence_parallel", "")) in HEADS_SHARDED:
            return int(getattr(self, "sp_size", 1))
        return 1

    @property
    def tensor_shards(self) -> int:
        """Ranks each layer is split over (``tensor_shards_of``)."""
        return tensor_shards_of(lambda name: getattr(self, name, None))

    def sequences_per_step(self, num_gpus: int) -> int:
        """Samples one optimizer step trains over ``num_gpus`` GPUs: micro-batch x accumulation x
        the data-parallel replicas, each replica ``sequence_shards`` x ``tensor_shards`` GPUs."""
        return self.micro_batch_size * self.grad_accum * num_gpus // (self.sequence_shards * self.tensor_shards)

    @property
    def samples_per_gpu_step(self) -> int:
        """Samples each data-parallel GPU trains per optimizer step: micro-batch x accumulation,
        the global batch over the data-parallel GPUs. The same at every micro-batch size of a
        search's space (its global batch is fixed), so a check may read it (not a size field)."""
        return self.micro_batch_size * self.grad_accum

    @property
    def tokens_per_micro_batch(self) -> int:
        """Tokens of the longest micro-batch a rank holds (what memory holds at the peak): its share
        of each sequence under sequence parallelism."""
        return self.rows_per_micro_batch * self.seq_len // self.sequence_shards

    @property
    def kernel_tokens_per_micro_batch(self) -> float:
        """Tokens a rank's kernels run in the expected micro-batch, padding included (what time reads)."""
        return self.rows_per_micro_batch * (self.kernel_seq_len or self.seq_len) / self.sequence_shards

    @property
    def attention_len(self) -> float:
        """Attention's per-token length, tokens: its FLOPs per row grow with the row's square."""
        return self.attention_seq_len or self.seq_len

    @property
    def real_tokens_per_micro_batch(self) -> float:
        """The samples' own tokens in a rank's expected micro-batch (what tokens/s counts: a pair's
        both sequences; a rank's share of them under sequence parallelism)."""
        return self.rows_per_micro_batch * (self.real_seq_len or self.seq_len) / self.sequence_shards

    @classmethod
    def defaults(cls) -> dict[str, Any] | None:
        """Every field's default, in field order (None: a field has a default factory, whose value
        must be fresh, or no default). Shared: do not change it."""
        if cls not in _DEFAULTS:
            known = cls.model_fields
            plain = not any(f.default_factory or f.is_required() for f in known.values())
            _DEFAULTS[cls] = {n: f.default for n, f in known.items()} if plain else None
        return _DEFAULTS[cls]

    @classmethod
    def trusted(cls, values: dict[str, Any]) -> Self:
        """``model_construct(**values)`` for values already validated (the search space's, on its
        hot path: 1.2 us against 3.1 us): the same ``__dict__`` (every field, in field order, the
        defaults filled in) and fields set. tests/test_search_dominance.py compares the two."""
        defaults = cls.defaults()
        if defaults is None:
            return cast(Self, cls.model_construct(**values))
        config = cls.__new__(cls)
        fields = defaults.copy()
        fields.update(values)
        object.__setattr__(config, "__dict__", fields)
        object.__setattr__(config, "__pydantic_fields_set__", set(values))
        object.__setattr__(config, "__pydantic_extra__", None)
        object.__setattr__(config, "__pydantic_private__", None)
        return config


#: per configuration model, its fields' defaults in order (None: a field has a factory or none)
_DEFAULTS: dict[type, dict[str, Any] | None] = {}


def config_model(techniques: Sequence[tuple[str, type[StrEnum], StrEnum]],
                 settings: Sequence[Setting] = ()) -> type[ConfigBase]:
    """``TrainingConfig``: one field per technique (name, choices, default), the techniques'
    settings, then the workload."""
    fields: dict[str, Any] = {name: (enum, default) for name, enum, default in techniques}
    fields |= {s.name: s.field() for s in settings}
    fields |= WORKLOAD_FIELDS
    return create_model("TrainingConfig", __base__=ConfigBase, __module__="planner.strategies", **fields)


def choice_model(name: str, techniques: Sequence[tuple[str, type[StrEnum]]], many: bool,
                 base: type[Record] = Record, settings: Sequence[Setting] = ()) -> type[Record]:
    """Request fields for the techniques: one optional value each (None: the default), or, with
    ``many``, a list each (empty: leave the choice to the search); and each setting, optional
    (None: its default; the search never varies a setting)."""
    fields: dict[str, Any] = {
        n: ((GenericAlias(list, (enum,)), Field(default_factory=list)) if many else (enum | None, None))
        for n, enum in techniques
    }
    fields |= {s.name: s.field(optional=True) for s in settings}
    return create_model(name, __base__=base, __module__="planner.strategies", **fields)
