"""The candidate space: every strategy's choices x micro-batch sizes, narrowed by the user.

Global batch (in sequences): micro_batch x grad_accum x data-parallel degree. Its default is set
in tokens, because what a step averages over is tokens, not sequences (the gradient noise scale
and the critical batch size are measured in tokens: McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"; Kaplan et al. 2020): the smallest dp x 2^k sequences holding at least
``DEFAULT_GLOBAL_BATCH_TOKENS`` tokens, at least one sequence per GPU. 131,072 tokens is 64
sequences of 2,048 (a common fine-tuning batch), 16 of 8,192, and one per GPU at 128k; every
power-of-two micro-batch up to the per-GPU share divides it. Micro-batch sizes are the divisors
of the per-GPU share.
"""

import itertools
from collections.abc import Callable, Iterator
from functools import cached_property
from math import gcd, prod
from typing import Any

from pydantic import ConfigDict

from planner.core.errors import PlannerInputError
from planner.core.launch_contract import Launcher
from planner.core.lengths import Batching, Lengths, shape
from planner.core.record import Record
from planner.core.vocabulary import SEQUENCE_SHARDED, TENSOR_SHARDED
from planner.strategies import REGISTRY, SETTINGS, TrainingConfig
from planner.strategies.method import GRPO_DEFAULTS, generation_batch_faults
from planner.strategies.optimizer import QUANTIZED
from planner.strategies.sequence_parallel import pad_multiple

DEFAULT_GLOBAL_BATCH_TOKENS = 131_072  # 2^17 = 64 x 2048
_ENUMS = {s.field: s.enum for s in REGISTRY}
_TWINS = tuple((s.field, twin) for s in REGISTRY if (twin := s.twin) is not None)  # (field, hook)
_FIELD_DEFAULTS = TrainingConfig.defaults() or {}  # (every field has a plain default: tests/test_search_dominance.py)


class SearchSpace(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    choices: dict[str, tuple[str, ...]]  # per technique field, in registry order (the ledger's)
    micro_batch_sizes: tuple[int, ...]  # ascending
    seq_len: int
    global_batch_size: int  # sequences per optimizer step, all GPUs
    data_parallel: int
    settings: dict[str, Any] = {}  # the techniques' settings (LoRA rank, ...): the same in every candidate
    batching: Batching = Batching.PACKED
    #: per micro-batch size, the workload fields its expected micro-batch sets where rows are not all
    #: ``seq_len`` long (planner/core/lengths.py ``shape``): kernel, attention and real tokens per row
    shapes: dict[int, dict[str, float | None]] = {}

    @cached_property
    def varying(self) -> bool:
        """Whether a row's expected length changes with the micro-batch size (padding to the
        longest of more samples pads more): tokens/s may then fall as the micro-batch grows."""
        return len({tuple(v.values()) for v in self.shapes.values()}) > 1

    @property
    def combos(self) -> int:
        return prod(len(v) for v in self.choices.values())

    @property
    def size(self) -> int:
        return self.combos * len(self.micro_batch_sizes)

    def technique_combos(self) -> Iterator[dict]:
        """Every technique combination, in a fixed order (index i is ``combo(i)``)."""
        enums = [[_ENUMS[f](v) for v in values] for f, values in self.choices.items()]
        for values in itertools.product(*enums):
            yield dict(zip(self.choices, values, strict=True))

    def share(self, share: int = 0, workers: int = 1, refused: Callable[[dict], Any] | None = None,
              count: Callable[[Any, int], None] | None = None) -> Iterator[tuple[int, dict, dict]]:
        """The technique combinations of one worker's share, in ``technique_combos``' order, as
        (index, techniques, every field's value at the first micro-batch size, as ``values``).
        The share: the combinations whose index less its twin fields' part (``twin_free``) is
        ``share`` modulo ``workers``, so a combination and its twin (``twin``: they differ in twin
        fields only) are in one share. ``refused``: asked of every partial combination (the values
        of the fields before some field, and of every field the search does not vary); an
        answer other than None holds for every completion of it, which is then not enumerated:
        ``count(answer, n)`` gets the number n of them in the share. A field of one value is
        given from the start (its place and twin-free part are 0): only the others are walked."""
        every = list(self.choices)
        values = {k: v for k, v in self.values({}, self.micro_batch_sizes[0]).items() if k not in self.choices}
        values |= {f: _ENUMS[f](vs[0]) for f, vs in self.choices.items() if len(vs) == 1}
        varied = {f: vs for f, vs in self.choices.items() if len(vs) > 1}
        fields = list(varied)
        enums = [[_ENUMS[f](v) for v in vs] for f, vs in varied.items()]
        places = [[self._places[f][v] for v in vs] for f, vs in varied.items()]
        free = [[0 if f in self.twin_fields else p for p in ps] for f, ps in zip(fields, places, strict=True)]
        tails = [[0] * workers for _ in range(len(fields))] + [[1] + [0] * (workers - 1)]
        for depth in reversed(range(len(fields))):  # completions of fields[depth:] by their twin-free part, mod workers
            for rest, n in enumerate(tails[depth + 1]):
                for part in free[depth]:
                    tails[depth][(rest + part) % workers] += n

        def walk(depth: int, index: int, twin_free: int) -> Iterator[tuple[int, dict, dict]]:
            if depth == len(fields):
                if twin_free % workers == share:
                    yield index, {f: values[f] for f in every}, dict(values)
                return
            if refused is not None and count is not None and (answer := refused(values)) is not None:
                if n := tails[depth][(share - twin_free) % workers]:
                    count(answer, n)
                return
            field = fields[depth]
            for value, place, part in zip(enums[depth], places[depth], free[depth], strict=True):
                values[field] = value
                yield from walk(depth + 1, index + place, twin_free + part)
            del values[field]

        return walk(0, 0, 0)

    @cached_property
    def twin_fields(self) -> frozenset[str]:
        """The searched fields a strategy's ``twin`` hook may change."""
        return frozenset(f for f, _ in _TWINS if f in self.choices)

    def combo(self, index: int) -> dict:
        out = {}
        for f, values in reversed(self.choices.items()):
            index, i = divmod(index, len(values))
            out[f] = _ENUMS[f](values[i])
        return {f: out[f] for f in self.choices}

    def twin(self, techniques: dict) -> int | None:
        """The index of the combination that dominates ``techniques``: every strategy's ``twin``
        value put in at once, where the space holds it (None: none does). A twin has no twin of
        its own (tests/test_search_dominance.py), so no chain needs following."""
        update = {}
        for field, hook in _TWINS:
            value = hook(techniques) if field in self.choices else None
            if value is not None and str(value) in self.choices[field]:
                update[field] = value
        return self.combo_index(techniques | update) if update else None

    def combo_index(self, techniques: dict) -> int:
        return sum(self._places[f][techniques[f]] for f in self.choices)

    @cached_property
    def _places(self) -> dict[str, dict[str, int]]:
        """Per field, each value's share of a combination's index (its position x the field's
        stride); StrEnum values hash and compare as their strings."""
        out, stride = {}, 1
        for f, values in reversed(self.choices.items()):
            out[f] = {v: i * stride for i, v in enumerate(values)}
            stride *= len(values)
        return out

    def grad_accum(self, micro_batch_size: int) -> int:
        """Micro-batches per optimizer step at ``micro_batch_size`` (the global batch is fixed)."""
        return self.global_batch_size // (micro_batch_size * self.data_parallel)

    def values(self, techniques: dict, micro_batch_size: int) -> dict[str, Any]:
        """Every field of ``config(techniques, micro_batch_size)``, without building it."""
        out = (_FIELD_DEFAULTS | techniques | self.settings
               | {"micro_batch_size": micro_batch_size, "grad_accum": self.grad_accum(micro_batch_size),
                  "seq_len": self.seq_len})
        if self.batching != Batching.PACKED:
            out |= {"batching": self.batching} | self.shapes.get(micro_batch_size, {})
        return out

    def config(self, techniques: dict, micro_batch_size: int) -> TrainingConfig:
        """A candidate from ``combo()`` / ``technique_combos()`` values (enums, already validated:
        no re-validation on the search's hot path)."""
        return TrainingConfig.trusted(self.values(techniques, micro_batch_size))


def default_global_batch(data_parallel: int, seq_len: float, groups: int = 1) -> int:
    """Sequences per step: the smallest dp x 2^k with at least DEFAULT_GLOBAL_BATCH_TOKENS tokens
    (``seq_len``: the real tokens of a sequence, on average), times the least factor that makes it
    whole ``groups`` (GRPO's completions per prompt)."""
    per_gpu = 1
    while per_gpu * data_parallel * seq_len < DEFAULT_GLOBAL_BATCH_TOKENS:
        per_gpu *= 2
    total = per_gpu * data_parallel
    return total * (groups // gcd(total, groups))


def settings_of(request) -> dict[str, Any]:
    """The technique settings a request gives (LoRA rank, ...), validated as TrainingConfig does."""
    given = {x.name: getattr(request, x.name, None) for x in SETTINGS}
    given = {k: v for k, v in given.items() if v is not None}
    config = TrainingConfig(**given)
    return {k: getattr(config, k) for k in given}


def build_space(
    data_parallel: int,
    seq_len: int,
    fixed: dict[str, list[str]] | None = None,
    micro_batch_sizes: list[int] | None = None,
    global_batch_size: int | None = None,
    exact_optimizer: bool = False,
    launcher: Launcher = Launcher.PLANNER,
    settings: dict[str, Any] | None = None,
    batching: Batching = Batching.PACKED,
    lengths: Lengths | None = None,
) -> SearchSpace:
    """The space for ``data_parallel`` GPUs. ``fixed`` narrows fields to the listed values;
    ``launcher`` trainer drops the choices only the planner launch realises (Strategy.runtime_only);
    ``settings`` (``settings_of``) go into every candidate; ``seq_len``: the longest a row may be
    (``batching`` and the samples' ``lengths`` make the rows: planner/core/lengths.py)."""
    fixed = {k: v for k, v in (fixed or {}).items() if v}
    problems = []
    choices: dict[str, tuple[str, ...]] = {}
    for strategy in REGISTRY:
        allowed = tuple(str(c) for c in strategy.choices)
        given = strategy.searched_for(fixed) if strategy.searched_for is not None else None
        default = given or tuple(map(str, strategy.searched or strategy.choices))
        wanted = tuple(str(v) for v in fixed.get(strategy.field, default))
        unknown = [v for v in wanted if v not in allowed]
        if unknown:
            problems.append(f"{strategy.flag}: {', '.join(unknown)} not in {', '.join(allowed)}")
        if strategy.field == "optimizer" and exact_optimizer:
            wanted = tuple(v for v in wanted if v not in QUANTIZED)
            if not wanted:
                problems.append("--exact-optimizer excludes every optimizer you allowed (all are 8-bit)")
        if launcher == Launcher.TRAINER and strategy.runtime_only:
            named = strategy.field in fixed
            wanted = tuple(v for v in wanted if v not in strategy.runtime_only)
            if named and not wanted:
                problems.append(f"{strategy.flag} {', '.join(fixed[strategy.field])}: no standard file can say it, so "
                                "--launcher trainer cannot run it; use the planner launch (the default)")
        choices[strategy.field] = tuple(dict.fromkeys(wanted))
    data_parallel = _replicas(choices, settings or {}, data_parallel, problems)
    multiple = _pad_multiple(choices.get("sequence_parallel", ()), settings or {})
    rows = shape(batching, seq_len, lengths, 1, multiple) if seq_len >= 1 else None
    real = rows.real if rows else seq_len
    groups = (settings or {}).get("num_generations", GRPO_DEFAULTS["num_generations"]) if "grpo" in fixed.get("method", ()) else 1
    gbs = global_batch_size if global_batch_size is not None else default_global_batch(data_parallel, real, groups)
    if gbs < 1 or gbs % data_parallel:
        problems.append(
            f"--global-batch-size {gbs} must be a positive multiple of the {data_parallel} data-parallel GPUs "
            f"(e.g. {default_global_batch(data_parallel, real, groups)})"
        )
    per_gpu = gbs // data_parallel if gbs > 0 else 1
    divisors = [d for d in range(1, per_gpu + 1) if per_gpu % d == 0] if per_gpu <= 1 << 20 else [1]
    if micro_batch_sizes:
        bad = [b for b in micro_batch_sizes if b < 1 or (per_gpu and per_gpu % b)]
        if bad:
            problems.append(
                f"--micro-batch-size {', '.join(map(str, bad))} must divide the {per_gpu} sequences per GPU "
                f"of the global batch ({gbs} over {data_parallel} GPUs)"
            )
        divisors = sorted(set(micro_batch_sizes))
    divisors = _method_sizes(fixed.get("method", ()), settings or {}, divisors, micro_batch_sizes, gbs, data_parallel,
                             problems)
    if seq_len < 1:
        problems.append("--seq-len must be at least 1")
    if problems:
        raise PlannerInputError(problems)
    return SearchSpace(
        choices=choices, micro_batch_sizes=tuple(divisors), seq_len=rows.memory if rows else seq_len,
        global_batch_size=gbs, data_parallel=data_parallel, settings=settings or {}, batching=batching,
        shapes={} if batching == Batching.PACKED else {b: shape_fields(batching, seq_len, lengths, b, multiple)
                                                       for b in divisors},
    )


def _pad_multiple(sequence_parallel: tuple[str, ...], settings: dict[str, Any]) -> int:
    """The padding multiple of a space's rows: one sequence-parallel value a space (``_replicas``),
    its ``pad_multiple``."""
    kind = next(iter(sequence_parallel), "none") if len(sequence_parallel) == 1 else "none"
    return pad_multiple({"sequence_parallel": kind, "sp_size": settings.get("sp_size")}.get)


#: The techniques whose degree makes a data-parallel replica of several GPUs: (field, the values
#: that split, the degree's setting, what it splits).
SPLITS = (("sequence_parallel", SEQUENCE_SHARDED, "sp_size", "sequence"),
          ("tensor_parallel", TENSOR_SHARDED, "tp_size", "tensor"))


def _replicas(choices: dict[str, tuple[str, ...]], settings: dict[str, Any], gpus: int, problems: list[str]) -> int:
    """The data-parallel replicas of ``gpus`` GPUs (what the global batch is divided over): each
    replica ``--sp-size`` GPUs under sequence parallelism (strategies/sequence_parallel.py) and
    ``--tp-size`` times that under tensor parallelism (strategies/tensor_parallel.py), else one. A
    space holds one degree of each: its micro-batch sizes and accumulation follow from them."""
    replicas = gpus
    for field, splitting, setting, what in SPLITS:
        values = choices.get(field, ())
        if not any(v in splitting for v in values):
            continue
        if len(values) > 1:
            problems.append(f"--{field.replace('_', '-')} {', '.join(values)}: name one value (a search holds one "
                            f"degree of {what} parallelism)")
        p = int(settings.get(setting, TrainingConfig.model_fields[setting].default))
        if replicas % p:
            problems.append(f"--{setting.replace('_', '-')} {p} must divide the {replicas} GPUs")
            continue
        replicas //= p
    return replicas


def _method_sizes(methods, settings: dict[str, Any], divisors: list[int], micro_batch_sizes: list[int] | None,
                  gbs: int, data_parallel: int, problems: list[str]) -> list[int]:
    """The micro-batch sizes a named method's trainer takes, and the request-wide rules it breaks
    (``problems``): KTO's KL estimate refuses micro-batches of 1 and KTO takes a reference; GRPO's
    generation batch (``--generation-batch-size``, else the global batch) is whole groups of
    ``--num-generations`` and whole micro-batches of every GPU (TRL's KTOTrainer and GRPOConfig;
    the check rules of strategies/method.py say the same of one configuration)."""
    if "kto" in methods:
        if str(settings.get("dpo_reference", "model")) == "none":
            problems.append("--method kto takes --dpo-reference model or precomputed: TRL's KTOTrainer has no "
                            "reference-free loss")
        if str(settings.get("kto_loss", "kto")) == "kto":  # the KL estimate: micro-batches of 2 or more
            divisors = [d for d in divisors if d >= 2]
            if not divisors:
                sizes = (f"--micro-batch-size {', '.join(map(str, micro_batch_sizes))}" if micro_batch_sizes else
                         f"a global batch of {gbs} over {data_parallel} GPUs")
                problems.append(f"--method kto (its KL estimate) needs micro-batches of at least 2 (TRL's "
                                f"KTOTrainer refuses 1), and {sizes} has none; a larger micro-batch or "
                                "--global-batch-size, or --kto-loss apo-zero-unpaired")
    if "grpo" in methods:
        named = settings.get("generation_batch_size") or 0
        batch, groups = named or gbs, settings.get("num_generations", GRPO_DEFAULTS["num_generations"])
        if generation_batch_faults(batch, None, data_parallel, groups):
            problems.append(f"{'--generation-batch-size' if named else 'the global batch'} {batch} must be whole groups "
                            f"of --num-generations {groups} (GRPOConfig)")
        if named:  # GRPOConfig splits it into whole micro-batches of every GPU
            divisors = [d for d in divisors if "micro-batches" not in generation_batch_faults(named, d, data_parallel,
                                                                                             groups)]
            if not divisors:
                problems.append(f"--generation-batch-size {named} must be a multiple of micro-batch x the "
                                f"{data_parallel} GPUs for a micro-batch that divides the {gbs // data_parallel} "
                                "sequences per GPU")
    return divisors


def shape_fields(batching: Batching, cap: int, lengths: Lengths | None, micro_batch_size: int,
                 multiple: int = 1) -> dict[str, float | None]:
    """The workload fields of a micro-batch of ``micro_batch_size`` rows under ``batching``, padded
    rows to a ``multiple`` of tokens (None where a row is ``seq_len`` long, the field's default)."""
    rows = shape(batching, cap, lengths, micro_batch_size, multiple)
    out = {"kernel_seq_len": rows.kernel, "attention_seq_len": rows.attention, "real_seq_len": rows.real}
    return {k: (None if v == rows.memory else v) for k, v in out.items()}


def padded_workload(batching: Batching, cap: int, lengths: Lengths | None, micro_batch_size: int,
                    multiple: int = 1) -> dict[str, Any]:
    """The workload fields of a configuration whose rows are at most ``cap`` tokens under
    ``batching``, padded to a ``multiple`` of tokens: the longest micro-batch's row length (the
    peak's) and the expected micro-batch's shape (``shape_fields``)."""
    return ({"batching": batching, "seq_len": shape(batching, cap, lengths, 1, multiple).memory}
            | shape_fields(batching, cap, lengths, micro_batch_size, multiple))


def reshaped(config: TrainingConfig, lengths: Lengths | None) -> TrainingConfig:
    """``config`` with the shape fields of its own micro-batch size (after a change of it), where
    its rows are padded samples of ``lengths`` (unknown lengths: the rows' shape is unchanged)."""
    if config.batching == Batching.PACKED or lengths is None:
        return config
    return config.model_copy(update=shape_fields(config.batching, config.seq_len, lengths, config.micro_batch_size,
                                                 pad_multiple(lambda name: getattr(config, name, None))))
