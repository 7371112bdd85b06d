"""What every strategy shares: the Strategy record, the planning context and its resolved layout.

A strategy owns one technique (DESIGN.md): its choices and their CLI/request surface, when a
choice is infeasible (reasons, never an exception), warnings, the plan layout it decides, its rows
in the per-rank memory ledger and the step-time ledger (planner.core.timing), its fragment of each
emitted file (planner.core.emitted), how ``planner check`` reads it from the files people already
have, the one-step changes that lower memory, and where the runtime applies it.

Strategies read what other techniques decided from ``PlanContext.layout`` (resolved once, from every
strategy's ``parallelism`` and ``storage`` hooks), never by re-deriving another strategy's rule.
They write the memory ledger in registry order (``strategies.REGISTRY``), each row final as written:
a model-state row takes its divisor and location from ``PlanLayout.placement`` (sharding and offload
decide them with the layout), so no strategy rewrites another's rows.
"""

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from functools import cache, cached_property
from typing import Any, TypeVar

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import ON_GPU, LedgerDraft, Location, PagedInfo, Placement
from planner.core.numerics import EXACT, Rung
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.timing import TimeDraft
from planner.core.vocabulary import Setting, tensor_shards_of
from planner.cost import params, tensor
from planner.cost.activations import DTypes
from planner.cost.adapters import AdapterSpec

T = TypeVar("T")


class Engine(StrEnum):
    """Which software owns the training step, which decides the memory layout."""

    TORCH = "torch"  # plain PyTorch / DDP with torch autocast
    DEEPSPEED = "deepspeed"  # ZeRO stages 1-3
    FSDP = "fsdp"  # PyTorch FSDP2 (fully_shard)


@dataclass(frozen=True)
class PlanLayout:
    """How a plan lays the model out, resolved once per plan from the strategies' hooks.

    Parallelism (the sharding strategy; tensor, context and pipeline parallelism are 1 until a
    strategy decides them): ``data_parallel`` replicas of the batch; ``shard_degree`` ranks share
    one copy of the sharded model states. Parameters: ``trainable`` ones have gradients and
    optimizer states, ``frozen`` ones neither. Storage (the precision strategy): bytes per element
    of each tensor class, and the compute dtypes."""

    engine: Engine
    data_parallel: int
    shard_degree: int
    gradients_sharded: bool  # a layer's gradients go to a sharded partition as its backward ends
    resharding: bool  # FSDP reshards every unit after forward (not fsdp-grad-op)
    weight_bytes: int  # the parameters as the engine stores them
    master_bytes: int  # a separate fp32 master copy (0 when the weights are the master)
    grad_bytes: int  # the (sharded) gradients
    state_bytes: int  # a full-precision optimizer state element (bf16 when parameters are bf16)
    gathered_bytes: int  # parameters gathered by ZeRO-3 / FSDP for compute
    reduce_bytes: int  # gradients as the engine reduces them (FSDP2 reduce_dtype)
    dtypes: DTypes  # activations: compute and residual-stream bytes
    autocast: bool  # torch autocast casts fp32 weights to the compute dtype on the fly
    compute_dtype: str  # matmuls outside fp8 layers, and MFU's peak
    layer_matmul_dtype: str  # the decoder layers' matmuls (fp8 under fp8-mixed)
    fused_attention: bool  # fused (flash / memory-efficient) attention kernels: no s^2 tensor saved
    trainable_parameters: int
    frozen_parameters: int = 0  # the base model's, when an adapter trains instead of it
    frozen_bytes: int = 0  # bytes per element of the frozen 16-bit (or fp32) base weights
    adapter_copy_bytes: int = 0  # an adapter's cast input copy: compute dtype under autocast, else its own
    adapter: AdapterSpec | None = None  # the adapter trained on the frozen base (None: full fine-tuning)
    layer_trained: int = 0  # elements of one decoder layer that have gradients (its adapters' under an adapter)
    layer_gathered: int = 0  # elements one decoder layer gathers under ZeRO-3 / FSDP (its weights and adapters)
    root_trained: int = 0  # trained elements outside the layers (embeddings, final norm, head; 0 with an adapter)
    tensor_parallel: int = 1
    context_parallel: int = 1
    pipeline_parallel: int = 1
    #: per model-state term (weights, master_weights, gradients, optimizer_states) the sharding mode
    #: divides, how its rows split across the ranks (absent: every rank holds them whole)
    shards: dict[str, Placement] = field(default_factory=dict)
    host_terms: frozenset[str] = frozenset()  # the model-state terms offload keeps in pinned host memory
    #: DeepSpeed ZeRO-Offload copies gradients straight into its fp32 host partition: no gradient rows
    gradients_in_host_partition: bool = False

    def placement(self, term: str) -> Placement:
        """How rows of ``term`` are placed: split by ``shards``, on the host when offloaded."""
        place = self.shards.get(term, ON_GPU)
        return replace(place, location=Location.HOST) if term in self.host_terms else place


LAYOUT_FIELDS = tuple(f.name for f in fields(PlanLayout))


@dataclass(frozen=True)
class PlanContext:
    """A plan's model, GPUs and configuration. Under tensor parallelism ``model`` is one rank's share
    of the model given (planner/cost/tensor.py ``rank_model``), which every cost formula reads as a
    model; ``whole_model`` is the model given."""

    model: ModelSpec
    hardware: HardwareSpec
    config: Any  # strategies.TrainingConfig (built from the registry)
    _once: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _whole: ModelSpec | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        t = self.tensor_shards
        if t > 1 and self.model.vocab_shards == 1:
            object.__setattr__(self, "_whole", self.model)
            object.__setattr__(self, "model", tensor.rank_model(self.model, t))

    @property
    def tensor_shards(self) -> int:
        """The configuration's tensor-parallel degree, read from its fields alone (a layout hook's
        reads are the layout's key: ``LAYOUT_INPUTS``)."""
        return tensor_shards_of(lambda name: getattr(self.config, name, None))

    @property
    def whole_model(self) -> ModelSpec:
        """The model as given, whole (``model`` is a rank's share under tensor parallelism)."""
        return self._whole or self.model

    def once(self, decide: Callable[["PlanContext"], T]) -> T:
        """``decide(self)``, computed once per plan: a decision several strategies read (the backward
        phase's peak instant: strategies/checkpointing.py ``backward_peak``)."""
        if decide not in self._once:
            self._once[decide] = decide(self)
        return self._once[decide]

    @property
    def world_size(self) -> int:
        """GPUs in the job (processes): data x tensor x context x pipeline parallel degrees."""
        return self.hardware.num_gpus

    @cached_property
    def layout(self) -> PlanLayout:
        return resolve_layout(self, _late("planner.strategies", "REGISTRY"))

    @property
    def engine(self) -> Engine:
        """The engine that runs the plan: its sharding choice's (``layout.engine`` too), read
        from that field alone, so a rule that asks for it reads only the sharding
        (planner/engine/refusals.py remembers a rule by what it reads)."""
        return _late("planner.strategies.sharding", "engine_of")(self.config.sharding)

    @property
    def fsdp_defers_reduction(self) -> bool:
        """FSDP accumulating over micro-batches with ``gradient_sync`` step: gradient sync is off on
        all but the last one (accelerate's default; planner's is every micro-batch), so
        each rank holds every trained parameter's unsharded gradient (FSDP2 upcasts it to the
        reduce dtype: ``FSDPParam.to_accumulated_grad_if_needed``) and reduce-scatters once per
        step. Source: accelerate ``Accelerator.no_sync`` calls ``set_requires_gradient_sync(False)``
        on an FSDP2 model, and the Trainer enters it between accumulation boundaries unless
        ``sync_each_batch`` is set (transformers trainer.py, 5.24). FSDP1's ``no_sync`` also keeps
        unsharded gradients; it is taken to be FSDP2's (not measured). Measured on an H100
        (Llama-3.2-1B as one rank of 8, 2 x 2048 x 2 micro-batches; benchmarks/results/
        H100-SXM-80/2026-11-26-run9): allocated peak 4.943 GB above the same plan without
        accumulation, 4 B x 1,235,814,400 parameters."""
        return self.engine == Engine.FSDP and self.config.grad_accum > 1 and self.config.gradient_sync == "step"

    @property
    def fsdp2(self) -> bool:
        """FSDP2 (``fully_shard``: per-parameter DTensor shards), not FSDP1's flat parameters."""
        return self.engine == Engine.FSDP and getattr(self.config, "fsdp_version", 2) == 2


@cache
def _late(module: str, name: str) -> Any:
    """``name`` of ``module``, a module that imports this one, so it is looked up on first use
    (once): strategies.REGISTRY, strategies.sharding ``engine_of``."""
    return getattr(importlib.import_module(module), name)

#: The configuration fields the ``parallelism`` and ``storage`` hooks read: a plan's layout is a
#: function of these, the model and the hardware (tests/test_search_dominance.py holds the hooks
#: to it), so a search lays out each distinct tuple of them once.
LAYOUT_INPUTS = ("adapter", "adapter_dtype", "attention", "fsdp_version", "kbit_prep", "lora_dropout", "lora_rank",
                 "lora_targets", "nf4_matmul", "offload", "precision", "sharding", "tensor_parallel", "tp_size")


def resolve_layout(ctx: PlanContext, registry) -> PlanLayout:
    """Every strategy's ``parallelism`` hook first (how the model is split across GPUs), then every
    ``storage`` hook (dtypes and trainable parameters, which may depend on the split)."""
    values: dict[str, Any] = {"trainable_parameters": params.total_parameters(ctx.model)}
    for s in registry:
        if s.parallelism is not None:
            values |= s.parallelism(ctx)
    for s in registry:
        if s.storage is not None:
            values |= s.storage(ctx, values)
    return PlanLayout(**values)


@dataclass
class Check:
    """What a strategy says about a configuration before any row is written.

    ``codes`` are short, stable reasons (the search counts rejections by them); ``infeasible``
    holds the full sentences a user reads, in the same order."""

    infeasible: list[str] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: the refusals of what the job may well run but planner does not model yet (``planner check``
    #: refuses such a job, exit 2, rather than calling it one that does not fit)
    unmodelled: list[str] = field(default_factory=list)

    def reject(self, code: str, message: str, unmodelled: bool = False) -> None:
        self.codes.append(code)
        self.infeasible.append(message)
        if unmodelled:
            self.unmodelled.append(message)


def no_check(ctx: PlanContext, out: Check) -> None:
    """For strategies with no infeasible choice."""


def no_rows(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """For strategies whose memory effect is in the layout other strategies read."""


def no_time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """For strategies whose choice costs no step time of its own."""


def no_emit(ctx: PlanContext, files: EmitDraft) -> None:
    """For strategies that add nothing to the emitted files."""


def no_read(job: JobFiles, out: Reading) -> None:
    """For strategies no job file states (``planner check`` takes them from plan.json or a flag)."""


def no_savers(config: Any, hardware: HardwareSpec) -> list[tuple[str, dict]]:
    """For strategies with no choice that lowers memory."""
    return []


Savers = Callable[[Any, HardwareSpec], list[tuple[str, dict]]]


@dataclass(frozen=True)
class Choice:
    """One value of a technique: what every layer reads of it beyond the strategy's hooks. A
    strategy holds one record per value (``Strategy.records``; a technique's subclass adds what its
    hooks, the runtime and the probes need: OptimizerChoice, PrecisionChoice, ShardingChoice,
    OffloadChoice, AttentionChoice, AdapterChoice), so a new value is one record, its cost formula
    and its tests.

    ``help``: what the value is, one line. ``rung``: its place on the numerics ladder
    (planner/core/numerics.py; EXACT: the same training math). ``complexity``: what it adds to a
    plan's complexity, the tie-break between plans of equal speed (planner/engine/ranking.py).
    ``reserve``: the caching allocator's reserve it adds beyond planner/cost/overheads.py's
    FRAGMENTATION_FRACTION, a fraction of the allocated peak (measured: reserved less allocated
    peak on a real GPU; a plan takes the largest of its values', ``strategies.reserve_extra``).
    ``runtime_only``: no standard file (accelerate, DeepSpeed, Trainer) can say it: only the
    planner launch realises it, through runtime.json (not ranked for ``--launcher trainer``).
    ``searched``: the search tries it unless the user narrows the technique. ``convex``: its
    memory grows with the micro-batch on or above the line through any two sizes, as rows constant
    or linear in the tokens do (a staircase, such as Liger's power-of-two chunks, does not; the
    search proves sizes too large from that line: planner/engine/search.py)."""

    help: str
    rung: Rung = field(default=EXACT, kw_only=True)
    complexity: int = field(default=0, kw_only=True)
    reserve: float = field(default=0.0, kw_only=True)
    runtime_only: bool = field(default=False, kw_only=True)
    searched: bool = field(default=True, kw_only=True)
    convex: bool = field(default=True, kw_only=True)


def unsaid_default(field: str, default: StrEnum) -> Callable[[Any], str]:
    """A ``describe`` for a lever whose default goes without saying in a summary: '' at the
    default (or unset), else the value."""

    def describe(get) -> str:
        value = get(field)
        return "" if value in (None, default) else str(value)

    return describe


@dataclass(frozen=True)
class Strategy:
    """One technique. The registry (strategies/__init__.py) lists them; everything per technique
    (flags, request fields, the search space, summaries, check's readers, alternatives, emitted
    files, runtime) iterates it."""

    field: str  # the TrainingConfig field this strategy owns
    enum: type[StrEnum]  # its choices, in the plan vocabulary
    default: StrEnum  # the value when nothing says otherwise
    order: int  # position in the plan vocabulary (JSON, summaries, flags)
    help: str  # what the choice is, for --help
    short: str  # column header and compact summaries ("ckpt")
    check: Callable[[PlanContext, Check], None] = no_check
    apply: Callable[[PlanContext, LedgerDraft], None] = no_rows
    time: Callable[[PlanContext, LedgerDraft, PagedInfo | None, TimeDraft], None] = no_time
    emit: Callable[[PlanContext, EmitDraft], None] = no_emit
    read: Callable[[JobFiles, Reading], None] = no_read
    savers: Savers = no_savers  # one-step changes of this technique that lower the peak (planner/engine/alternatives.py)
    parallelism: Callable[[PlanContext], dict] | None = None  # PlanLayout fields it decides (first)
    storage: Callable[[PlanContext, dict], dict] | None = None  # PlanLayout fields it decides (second)
    bare: bool = False  # the value alone reads clearly in a summary ("adamw", not "optimizer adamw")
    #: what a partial reading of the files means given plan.json's value: (value, note)
    settle: Callable[[str, str | None], tuple[str, str]] | None = None
    default_for: Callable[[HardwareSpec], StrEnum] | None = None  # a default that depends on the GPUs
    runtime: str = ""  # the module that applies it in a training process (planner/runtime/), if any
    #: one record per value (every member of ``enum``): its help, rung, complexity, reserve, ...
    records: Mapping[Any, Choice] = dataclasses.field(default_factory=dict)
    #: the technique's parameters beside its choice (LoRA's rank, ...): TrainingConfig fields,
    #: flags and request fields of every planning command; the search never varies them
    settings: tuple[Setting, ...] = ()
    #: whether the settings mean anything at a value of the choice (None: at any but the default)
    settings_used: Callable[[Any], bool] | None = None
    #: how a summary names the choice with its settings ("lora r16 all-linear"); None: the value
    describe: Callable[[Any], str] | None = None
    #: the flag of a searching command also takes "any": let the search try every choice
    #: (the strategy's ``searched`` is what it tries when the flag is not given)
    any_choice: bool = False
    #: Settings the strategy decides for a plan where the request leaves them to it (colocated
    #: vLLM's share): field -> value, pinned in the plan's configuration before it is evaluated
    pin: Callable[[PlanContext], dict] | None = None
    #: What the search tries given the request's named fields (field -> values), where it differs
    #: from ``searched`` (GRPO's generations for --method grpo); None: ``searched``
    searched_for: Callable[[Mapping[str, Any]], tuple[str, ...] | None] | None = None
    #: the user names the choice (the training method): no search varies it, no change a command
    #: offers swaps it, and a suggested next command keeps it
    named: bool = False
    #: when a search tries the values it does not try unless named anyway ("" never): the
    #: long-context levers, from planner/core/vocabulary.py ``LONG_SEQUENCE_TOKENS``
    searched_from: str = ""
    #: Given a combination of every technique's value (field -> value), another value of this
    #: technique whose plan dominates it: at every micro-batch no larger on the GPU or the host, at
    #: least as fast, of lower complexity, with the same numerics and ranking family; None when
    #: none does. The search skips a combination whose twin is feasible (planner/engine/search.py);
    #: tests/test_search_dominance.py holds the cost model to the claim.
    twin: Callable[[Mapping[str, Any]], StrEnum | None] | None = None

    @property
    def choices(self) -> tuple[StrEnum, ...]:
        return tuple(self.enum)

    @cached_property
    def searched(self) -> tuple[StrEnum, ...] | None:
        """What the search tries unless narrowed (None: every choice)."""
        out = tuple(v for v in self.enum if self.records[v].searched)
        return None if out == self.choices else out

    @cached_property
    def runtime_only(self) -> tuple[StrEnum, ...]:
        """The choices only the planner launch realises (runtime.json; not ranked for --launcher trainer)."""
        return tuple(v for v in self.enum if self.records[v].runtime_only)

    @cached_property
    def numerics(self) -> dict[StrEnum, Rung]:
        """The choices that are not exact, each on its rung of the ladder (planner/core/numerics.py)."""
        return {v: r.rung for v, r in self.records.items() if r.rung != EXACT}

    @cached_property
    def complexity(self) -> dict[StrEnum, int]:
        """What each choice adds to a plan's complexity (0, unlisted: the plain choice)."""
        return {v: r.complexity for v, r in self.records.items() if r.complexity}

    @cached_property
    def reserve(self) -> dict[StrEnum, float]:
        """The allocator reserve each choice adds (``Choice.reserve``; unlisted: none)."""
        return {v: r.reserve for v, r in self.records.items() if r.reserve}

    @cached_property
    def staircase(self) -> frozenset[StrEnum]:
        """The choices whose memory is not convex in the micro-batch (``Choice.convex``)."""
        return frozenset(v for v, r in self.records.items() if not r.convex)

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def uses_settings(self, value: Any, setting: Setting | None = None) -> bool:
        """Whether the settings (or ``setting``) mean anything at ``value`` (LoRA's rank without an
        adapter does not; DeepSpeed's buckets without ZeRO do not)."""
        if setting is not None and setting.used_at:
            return str(value) in setting.used_at
        return self.settings_used(value) if self.settings_used is not None else str(value) != str(self.default)

    def default_on(self, hardware: HardwareSpec) -> StrEnum:
        return self.default_for(hardware) if self.default_for is not None else self.default
