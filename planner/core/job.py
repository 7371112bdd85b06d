"""A job's own files as ``planner check`` reads them, and what a reading found (core types).

planner/check/job_files.py parses the files (accelerate YAML, DeepSpeed JSON, Trainer arguments)
into a ``JobFiles``; each strategy's ``read`` hook maps its keys onto its vocabulary field in a
``Reading``, remembering where every value came from. The value checks here are shared by all.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_COUNT = 1_000_000


@dataclass(frozen=True)
class FsdpSettings:
    """FSDP as either file states it: accelerate's fsdp_config (fsdp_* keys) or the Trainer's
    ``fsdp`` options with its fsdp_config (bare keys)."""

    file: str  # the file's name
    config: dict  # the fsdp_config mapping
    accelerate: bool  # keys carry accelerate's fsdp_ prefix
    options: tuple[str, ...]  # the Trainer's fsdp options ("full_shard", "offload", ...), or ("hybrid_shard",)
    version: int = 2  # 1: FlatParameter FSDP, 2: fully_shard
    version_source: str = ""  # where the version came from (the key, or the loader's default)

    @property
    def where(self) -> str:
        return f"{self.file}: FSDP ({'accelerate' if self.accelerate else 'Trainer'} fsdp_config)"

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(f"fsdp_{key}" if self.accelerate else key, default)


@dataclass(frozen=True)
class JobFiles:
    """The parsed files (empty mappings for those not given) and the facts about them that several
    readers need. ``deepspeed`` is a DeepSpeed JSON, or the one the Trainer arguments hold inline."""

    accelerate: dict = field(default_factory=dict)
    accelerate_where: str = ""
    deepspeed: dict = field(default_factory=dict)
    deepspeed_where: str = ""
    training_args: dict = field(default_factory=dict)
    training_args_where: str = ""
    runtime: dict = field(default_factory=dict)  # runtime.json (planner.core.launch_contract.RuntimeArgs)
    runtime_where: str = ""
    distributed_type: str | None = None  # accelerate's (None: no accelerate config)
    processes: int | None = None  # accelerate num_processes
    accelerate_inline_deepspeed: dict | None = None  # accelerate's deepspeed_config without a JSON file
    fsdp: tuple[FsdpSettings, ...] = ()
    framework: str = ""  # the training arguments' format: "" (Trainer/TRL), "llamafactory" or "axolotl"

    @property
    def accelerate_precision_applies(self) -> bool:
        """accelerate's mixed_precision counts unless a DeepSpeed JSON file decides it (accelerate's rule)."""
        return bool(self.accelerate) and (self.distributed_type != "DEEPSPEED"
                                          or self.accelerate_inline_deepspeed is not None)


@dataclass
class Reading:
    """What the files say, with sources; problems are bad input, warnings are unmodelled."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    processes: tuple[int, str] | None = None  # accelerate num_processes (all machines)
    machines: tuple[int, str] | None = None
    train_batch: tuple[int, str] | None = None  # DeepSpeed train_batch_size
    steps_per_generation: tuple[int, str] | None = None  # GRPOConfig's: generation batch / (micro-batch x GPUs)
    model: tuple[str, str] | None = None  # the model a recipe names (model_name_or_path, base_model), and where
    #: values that price the step time where the job runs slower than its memory reading says (an
    #: eager fp8 job is timed as bf16-mixed): field -> value
    time_as: dict[str, Any] = field(default_factory=dict)
    #: the job evaluates during training (the Trainer's eval_strategy): rows per eval micro-batch, and where
    evaluation: tuple[int, str] | None = None
    #: the values the job's launcher can express, per field (none named: any): check offers changes
    #: within them, and who said so (a torchtitan job cannot run DeepSpeed, say)
    expressible: dict[str, frozenset] = field(default_factory=dict)
    expressible_by: str = ""

    def set(self, name: str, value: Any, where: str, refines: Mapping[Any, set] | None = None) -> None:
        """Record ``value`` for ``name``. Two files that disagree are a contradiction, unless one
        reading refines the other (``refines``: a partial value -> the values that make it precise,
        e.g. "not mixed" -> fp32 or bf16-pure), in which case the precise one stays."""
        refines = refines or {}
        old = self.values.get(name)
        if old is None or value in refines.get(old[0], ()):
            self.values[name] = (value, where)
        elif old[0] != value and old[0] not in refines.get(value, ()):
            self.problems.append(f"contradiction: {where} means {name} {value}, but {old[1]} means {old[0]}")

    def typed(self, d: dict, key: str, kinds: tuple, where: str, default=None, allow_auto: bool = False):
        """d[key] if it has one of ``kinds`` (and, for ints, a sane range), else a problem."""
        if key not in d or d[key] is None:
            return default
        v = d[key]
        if allow_auto and v == "auto":
            return None
        if bool in kinds and isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        ok = isinstance(v, kinds) and not (isinstance(v, bool) and bool not in kinds)
        if ok and isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_COUNT:
            self.problems.append(f"{where}: {key} = {v} is out of range (0 to {MAX_COUNT:,})")
            return default
        if not ok:
            names = "/".join("true or false" if k is bool else {int: "an integer", str: "a string", dict: "a mapping",
                                                                     float: "a number", list: "a list"}[k] for k in kinds)
            self.problems.append(f"{where}: {key} must be {names}, not {v!r}"[:300])
            return default
        return v

    def section(self, d: dict, key: str, where: str) -> dict:
        """A nested mapping (``{}`` when absent); anything else is a problem."""
        value = d.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{where}: {key} must be a mapping, not {value!r}"[:300])
            return {}
        return value


def installed_release(package: str, parts: int = 2) -> tuple[int, ...] | None:
    """The installed ``package``'s first ``parts`` release numbers ((major, minor) by default),
    read from its metadata (no import): what the job's environment runs where a recipe leaves a
    library default unset (planner check runs where the job runs). None: not installed or not a
    numbered release."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        numbers = version(package).split(".")[:parts]
        return tuple(int(x) for x in numbers) if len(numbers) == parts else None
    except (PackageNotFoundError, ValueError):
        return None

