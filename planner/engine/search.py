"""Search: the fastest fitting plans in a SearchSpace. One interface, two engines.

- ``exhaustive``: evaluates the whole space (today's spaces: ~10^4-10^5 candidates), split
  across the machine's cores (forked workers, each a share of the technique combinations).
  Infeasible technique combinations are rejected once for all their micro-batch sizes; for a
  feasible one, the sizes that fit are those below the first that does not, because memory
  never decreases as the micro-batch grows (a property test holds the model to it): the larger
  ones are counted as not fitting without being evaluated. Under ``search_plans``'s ``Sizing``
  the boundary is found with memory-only evaluations and only the largest size that fits is
  timed and ranked (``_scan_sized``); without it, sizes run in ascending order. A combination
  whose simpler twin (each strategy's ``twin`` hook: eager attention's is SDPA, fp16-mixed's is
  bf16-mixed) is feasible is skipped, for no plan of it could be offered nor be a nearer miss
  (``_scan``); each rule's finding is remembered by the values it read, and a set of
  combinations whose first fields a remembered refusal decides is counted without being
  enumerated (planner/engine/refusals.py, ``SearchSpace.share``); a candidate whose model
  states alone exceed the GPU is cut there and a miss is not timed (``search_plans``'s
  evaluator). tests/test_search_dominance.py; benchmarks/search_corpus.py: the answers of 64
  situations are the plain search's.
- ``optuna``: a TPE (or NSGA-II) study over the same categorical space with memory as a
  constraint (``trial.set_constraint``), seeded with the analytic
  best of a greedy coordinate search; for spaces too large to enumerate.
Both return a SearchOutcome: compact records ranked by tokens/s, ties broken by lower peak
memory (then enumeration order, so results are deterministic).
"""

import gc
import heapq
import os
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from math import prod

from planner.core.ledger import PHASES, Location
from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import Evaluation, Shared, evaluate, size_free_key, time_evaluation
from planner.engine.ranking import family
from planner.engine.refusals import RefusalMemo
from planner.engine.space import SearchSpace
from planner.strategies import REGISTRY, Check, TrainingConfig, complexity, memory_convex

EXHAUSTIVE_LIMIT = 200_000  # candidates; above this `auto` uses Optuna
PARALLEL_MIN_CANDIDATES = 4_000  # below this, forking costs more than it saves
NOT_FIT_GPU = "does not fit in GPU memory"
NOT_FIT_HOST = "does not fit in host RAM"
NEAREST = 5

Evaluate = Callable[[TrainingConfig], Evaluation]


@dataclass(frozen=True, slots=True)
class Record:
    """One evaluated candidate, small enough to return from a worker process."""

    combo: int  # SearchSpace.combo(index)
    micro_batch_size: int
    tokens_per_second: float
    peak: int
    shortfall: int  # bytes short (GPU + host), 0 when it fits
    reason: str | None  # None: fits
    rests: float = 0.0  # the fraction of its step at rates planner assumes (Evaluation.assumed_share)
    space: int = 0  # which of its outcome's spaces (``SearchOutcome.spaces``) ``combo`` indexes

    def rank_key(self) -> tuple:
        return (-self.tokens_per_second, self.peak, self.space, self.combo, self.micro_batch_size)


@dataclass
class SearchOutcome:
    """``fitting``: the fitting records, ranked best first; under a ``Sizing``, each combination's
    fastest size only (every size where paged optimizer state spills): the others are counted
    (``fit_count``) but not timed, for no ranking can prefer them (``_scan_sized``)."""

    space: SearchSpace
    fitting: list[Record]
    considered: int
    evaluated: int
    rejected: Counter = field(default_factory=Counter)
    nearest: list[Record] = field(default_factory=list)  # feasible misses of distinct families, nearest first
    engine: str = "exhaustive"
    dominated: int = 0  # candidates not evaluated: their simpler twin is feasible (``_scan``)
    fit_count: int = 0  # candidates that fit, each micro-batch size counted
    others: tuple[SearchSpace, ...] = ()  # further spaces searched with ``space`` (``merged``)

    @property
    def spaces(self) -> tuple[SearchSpace, ...]:
        return (self.space, *self.others)

    def space_of(self, record: Record) -> SearchSpace:
        return self.spaces[record.space]

    def config(self, record: Record) -> TrainingConfig:
        space = self.space_of(record)
        return space.config(space.combo(record.combo), record.micro_batch_size)


def merged(outcomes: list[SearchOutcome]) -> SearchOutcome:
    """One outcome of several spaces' searches (one per sequence-parallel degree:
    planner/engine/degrees.py), ranked as one: every fitting record, best first; the nearest misses
    of distinct families over all of them (each space's own are its nearest, so the nearest of all
    are among them); counts summed. A record names its space (``Record.space``)."""
    if len(outcomes) == 1:
        return outcomes[0]
    fitting = [replace(r, space=i) for i, o in enumerate(outcomes) for r in o.fitting]
    misses = [replace(r, space=i) for i, o in enumerate(outcomes) for r in o.nearest]
    first = outcomes[0]
    out = SearchOutcome(first.space, sorted(fitting, key=Record.rank_key),
                        sum(o.considered for o in outcomes), sum(o.evaluated for o in outcomes),
                        sum((o.rejected for o in outcomes), Counter()), [], first.engine,
                        sum(o.dominated for o in outcomes), sum(o.fit_count for o in outcomes),
                        tuple(o.space for o in outcomes[1:]))
    nearest: dict[tuple, Record] = {}
    for r in sorted(misses, key=lambda r: (r.shortfall, complexity(out.config(r)), r.space, r.combo,
                                           r.micro_batch_size)):
        nearest.setdefault(family(out.config(r)), r)
    out.nearest = list(nearest.values())[:NEAREST]
    return out


@dataclass(frozen=True)
class Sizing:
    """How the exhaustive search decides a combination's micro-batch sizes with fewer evaluations
    (``_scan_sized``): ``memory`` writes a candidate's memory only (cut at its GPU peak floor when
    that misses; no step time), ``time`` adds the step time to one that fits."""

    memory: Evaluate
    time: Callable[[Evaluation], Evaluation]


def shortfall(ev: Evaluation) -> int:
    gpu = max(0, ev.peak - ev.usable)
    host = max(0, ev.host["peak"] - ev.host["usable"]) if ev.host else 0
    return gpu + host


def record_of(combo: int, ev: Evaluation) -> Record:
    cfg = ev.ctx.config
    if ev.fits:
        reason = None
    elif not ev.feasible:
        reason = ev.check.codes[0]
    else:
        reason = NOT_FIT_GPU if not ev.gpu_fits else NOT_FIT_HOST
    return Record(combo, cfg.micro_batch_size, ev.tokens_per_second if ev.fits else 0.0, ev.peak, shortfall(ev), reason,
                  ev.assumed_share if ev.fits else 0.0)


def _scan_combo(index: int, techniques: dict, space: SearchSpace, evaluate: Evaluate, out: "_Share",
                check: tuple[Shared, Check] | None = None, cut: Evaluate | None = None,
                sizing: Sizing | None = None) -> tuple[bool, bool]:
    """One combination's micro-batch sizes, ascending, to the first that does not fit (with
    ``sizing``, once its first size fits: ``_scan_sized``): (whether one fits, whether the
    combination is feasible). Its fitting records are kept, and its first miss when it is the
    first size (the nearest misses). ``check``: the search's ``Shared`` and the combination's
    check, which the rules passed (``_scan``): left there for its evaluations, every size's
    (rules do not read the micro-batch). ``cut``: the
    evaluator that stops at a GPU peak floor that does not fit (``estimate.evaluate``'s
    cut_misses): such a first miss is left pending (``_Share``), its exact shortfall unknown."""
    sizes, fits = space.micro_batch_sizes, False
    smallest = space.config(techniques, sizes[0])
    if check is not None:
        shared, passed = check
        shared.checks[size_free_key(smallest)] = passed
    first: Evaluation | None = None
    if sizing is not None:
        first = sizing.memory(smallest)
        if first.fits:
            return _scan_sized(index, techniques, space, sizing, out, first)
    for i, mbs in enumerate(sizes):
        config = smallest if i == 0 else space.config(techniques, mbs)
        ev = first if i == 0 and first is not None else (cut or evaluate)(config)
        out.evaluated += 1
        rec = record_of(index, ev)
        if rec.reason is None:
            out.records.append(rec)
            out.fit_count += 1
            fits = True
            continue
        out.rejected[rec.reason] += len(sizes) - i  # the larger ones reject the same way
        feasible = rec.reason in (NOT_FIT_GPU, NOT_FIT_HOST)
        if i == 0 and feasible and ev.cut:
            out.pending.append((rec.shortfall, index, techniques))  # at least this short
        elif i == 0 and feasible:
            out.records.append(rec)
        return fits, feasible
    return fits, True


def _scan_sized(index: int, techniques: dict, space: SearchSpace, sizing: Sizing, out: "_Share",
                first: Evaluation) -> tuple[bool, bool]:
    """A combination whose first size fits. Its sizes that fit are those up to the first that
    does not (memory never falls as the micro-batch grows): found with memory
    evaluations only, first the size a guess says is the largest that fits (``_guess``) and its
    neighbour, then by bisection; the guess only orders the evaluations, each answer is an
    evaluation's or, for a size that does not fit, a chord's through two that do (the memory is
    convex in the micro-batch: ``_first_proven_miss``). Only the largest size that fits is timed
    and recorded: its tokens/s is the combination's highest (fewer micro-batches per step, each
    with its fixed costs; unless a paged optimizer state spills to host RAM, more as the
    activations grow, or a larger micro-batch pads more, ``SearchSpace.varying``: then every size
    is timed; tests/test_search_dominance.py holds the model to it), and its numerics, family and
    complexity are the others', so every ranking of planner/engine/ranking.py prefers it to the
    combination's smaller sizes: they are counted as fitting, never offered."""
    sizes = space.micro_batch_sizes
    lo, hi, best = 0, len(sizes), first  # sizes[:lo + 1] fit, sizes[hi:] do not
    miss_reason: str | None = NOT_FIT_GPU  # the first size that does not fit: why (a chord's proof: the GPU)
    # the sizes that fit while accumulating, ascending, with their GPU bytes (the chord's points)
    fitted: list[tuple[int, int]] | None = [] if memory_convex(techniques) else None
    if fitted is not None and space.grad_accum(sizes[0]) > 1:
        fitted.append((sizes[0], first.held))
    out.evaluated += 1  # (the first size)

    def probe(i: int) -> bool:
        nonlocal lo, hi, best, miss_reason
        ev = sizing.memory(space.config(techniques, sizes[i]))
        out.evaluated += 1
        if ev.fits:
            lo, best = i, ev
            if fitted is not None and space.grad_accum(sizes[i]) > 1:
                fitted.append((sizes[i], ev.held))
                if (proven := _first_proven_miss(space, fitted, lo, ev.usable)) < hi:
                    hi, miss_reason = proven, NOT_FIT_GPU
        else:
            hi, miss_reason = i, record_of(index, ev).reason
        return ev.fits

    if lo + 1 < hi:
        if probe(max(_guess(sizes, first), 1)):
            if lo + 1 < hi:
                probe(lo + 1)
        elif lo + 1 < hi:
            probe(hi - 1)
    while lo + 1 < hi:
        probe((lo + hi) // 2)
    # tokens/s may fall as the micro-batch grows where more of a paged state spills, or where a
    # larger micro-batch pads more (padding to the longest of more samples): then each size is timed
    if (best.paged is not None and best.paged.spilled_bytes) or space.varying:
        out.records += [record_of(index, sizing.time(best if i == lo else sizing.memory(
            space.config(techniques, sizes[i])))) for i in range(lo + 1)]
        out.evaluated += lo
    else:
        out.records.append(record_of(index, sizing.time(best)))
    out.fit_count += lo + 1
    if hi < len(sizes):  # the larger ones reject as the first that does not fit
        out.rejected[miss_reason] += len(sizes) - hi
    return True, True


#: Bytes a chord must clear the usable memory by to prove a size misses (``_first_proven_miss``):
#: each ledger row rounds up to a whole byte, so a peak sits up to a few bytes off its chord.
CHORD_SLACK_BYTES = 2**20


def _first_proven_miss(space: SearchSpace, fitted: list[tuple[int, int]], lo: int, usable: int) -> int:
    """The index of the first size above ``sizes[lo]`` that cannot fit the GPU, or ``len(sizes)``.
    A combination's GPU bytes (``Evaluation.held``) are a convex function of the micro-batch where its
    choices say so (``strategies.memory_convex``) and the accumulation stays on one side of one
    micro-batch per step (memory reads it only as that: gradients held across micro-batches or
    not): each phase sums rows constant or linear in the tokens, the peak is the largest phase,
    the allocator's reserve a fraction of the largest allocated one (tests/test_properties.py
    holds the model to both). So beyond the two largest accumulating sizes that fit (``fitted``)
    the accumulating sizes lie on or above the line through them: one where that line exceeds the
    usable memory does not fit, without its evaluation."""
    sizes = space.micro_batch_sizes
    if len(fitted) < 2:
        return len(sizes)
    (s1, p1), (s2, p2) = fitted[-2], fitted[-1]
    slope = (p2 - p1) / (s2 - s1)
    return next((i for i in range(lo + 1, len(sizes)) if space.grad_accum(sizes[i]) > 1
                 and p2 + (sizes[i] - s2) * slope > usable + CHORD_SLACK_BYTES), len(sizes))


#: Ledger terms whose rows grow with the tokens of a micro-batch (the rest, weights, states,
#: gathered parameters, buffers, stream pools, the context, do not).
TOKEN_TERMS = frozenset({"activations", "logits"})


def _guess(sizes: tuple[int, ...], first: Evaluation) -> int:
    """The index of the largest size that fits if the first size's token-grown rows
    (``TOKEN_TERMS``, in the phase where they are largest) grew in proportion to the micro-batch
    and the rest of its GPU peak stayed. Only the order of the evaluations rests on it."""
    grown = dict.fromkeys(PHASES, 0)
    for r in first.ledger.rows:
        if r.term in TOKEN_TERMS and r.location == Location.GPU:
            for p in r.phases:
                grown[p] += r.bytes
    per_size = max(grown.values()) / sizes[0]
    if per_size <= 0:
        return len(sizes) - 1
    rest = first.peak - per_size * sizes[0]
    return max(i for i, size in enumerate(sizes) if rest + per_size * size <= first.usable or i == 0)


@dataclass
class _Share:
    """What one worker's scan found; ``pending``: combinations whose first size was cut at its GPU
    peak floor, with the shortfall of that floor (it does not fit, and misses by at least that;
    how far exactly is known only when it is evaluated in full, which the nearest misses need
    only when nothing fits: ``_nearest_pending``)."""

    records: list[Record] = field(default_factory=list)
    rejected: Counter = field(default_factory=Counter)
    evaluated: int = 0
    dominated: int = 0
    pending: list[tuple[int, int, dict]] = field(default_factory=list)
    fit_count: int = 0


def _scan(space: SearchSpace, evaluate: Evaluate, share: int = 0, workers: int = 1,
          refusals: RefusalMemo | None = None, cut: Evaluate | None = None, sizing: Sizing | None = None) -> _Share:
    """This worker's share of the combinations (``SearchSpace.share``: a combination and its twin
    are in one). With ``refusals``, each is checked first (``RefusalMemo.check``), and a set of
    combinations whose first fields' values the refusal memo already refuses is counted without
    being enumerated (``RefusalMemo.refused``). Of those the rules pass: first the combinations
    that are their own twin (``SearchSpace.twin``); then each other one, skipped (every
    micro-batch size) when its twin is feasible: each of its candidates that fits has a twin
    candidate, the same size, that fits, no larger, at least as fast, simpler, of the same
    numerics and ranking family (the ``twin`` hooks' claim), which every ranking of
    planner/engine/ranking.py prefers; and a miss of it is no nearer than its twin's, in the same
    family (``_outcome``'s nearest misses). An infeasible twin: the combination is searched as
    itself."""
    out = _Share()
    feasible_twins: set[int] = set()
    deferred: list[tuple[int, dict, int, tuple[Shared, Check] | None]] = []
    sizes = space.micro_batch_sizes

    def refused(code: str, n: int) -> None:
        out.rejected[code] += n * len(sizes)

    pruned = (refusals.refused, refused) if refusals is not None else (None, None)
    for index, techniques, values in space.share(share, workers, *pruned):
        check = None
        if refusals is not None:
            passed = refusals.check(values, partial(space.config, techniques, sizes[0]))
            if passed.codes:
                refused(passed.codes[0], 1)
                continue
            check = (refusals.shared, passed)
        twin = space.twin(techniques)
        if twin is not None:
            deferred.append((index, techniques, twin, check))
            continue
        _, feasible = _scan_combo(index, techniques, space, evaluate, out, check, cut, sizing)
        if feasible:
            feasible_twins.add(index)
    for index, techniques, twin, check in deferred:
        if twin in feasible_twins:
            out.dominated += len(sizes)
            continue
        _scan_combo(index, techniques, space, evaluate, out, check, cut, sizing)
    return out


_JOB: tuple | None = None  # (space, evaluate, refusals, cut, sizing) inherited by forked workers


def _scan_share(share: int, workers: int) -> _Share:
    assert _JOB is not None, "set by the parent before forking"
    space, evaluate, refusals, cut, sizing = _JOB
    return _scan(space, evaluate, share, workers, refusals, cut, sizing)


def exhaustive(space: SearchSpace, evaluate: Evaluate, workers: int | None = None,
               refusals: RefusalMemo | None = None, cut: Evaluate | None = None,
               sizing: Sizing | None = None) -> SearchOutcome:
    """The whole space; ``refusals``: the rule refusals of the evaluator's model and hardware,
    remembered (planner/engine/refusals.py; each worker learns its own); ``cut``: the same
    evaluator, stopping at a GPU peak floor that does not fit (``_scan_combo``); ``sizing``: each
    combination's fastest size only is timed and recorded (``_scan_sized``)."""
    global _JOB
    if workers is None:
        workers = min(2, os.cpu_count() or 1) if space.size >= PARALLEL_MIN_CANDIDATES else 1
    if workers > 1:
        _JOB = (space, evaluate, refusals, cut, sizing)
        try:
            from concurrent.futures import ProcessPoolExecutor  # only a parallel search needs it
            from multiprocessing import get_context

            with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
                parts = list(pool.map(_scan_share, range(workers), [workers] * workers))
        finally:
            _JOB = None
    else:
        parts = [_scan(space, evaluate, refusals=refusals, cut=cut, sizing=sizing)]
    records = [r for part in parts for r in part.records]
    if not any(r.reason is None for r in records):  # nothing fits: the nearest misses, exact
        found = _nearest_pending(space, evaluate, records, [p for part in parts for p in part.pending])
        records += found
        parts[0].evaluated += len(found)
    rejected = sum((part.rejected for part in parts), Counter())
    outcome = _outcome(space, records, rejected, space.size, sum(part.evaluated for part in parts), "exhaustive")
    outcome.dominated = sum(part.dominated for part in parts)
    outcome.fit_count = sum(part.fit_count for part in parts)
    return outcome


def _outcome(space: SearchSpace, records: list[Record], rejected: Counter, considered: int, evaluated: int,
             engine: str) -> SearchOutcome:
    fitting = sorted((r for r in records if r.reason is None), key=Record.rank_key)
    return SearchOutcome(space, fitting, considered, evaluated, rejected, _nearest(space, records), engine,
                         fit_count=len(fitting))


def _nearest_key(space: SearchSpace, record: Record) -> tuple[tuple, tuple]:
    """(ranking family, order among the nearest misses: shortfall, then the simpler plan, then
    enumeration order) of a miss."""
    config = space.config(space.combo(record.combo), record.micro_batch_size)
    return family(config), (record.shortfall, complexity(config), record.combo, record.micro_batch_size)


def _nearest_pending(space: SearchSpace, evaluate: Evaluate, records: list[Record],
                     pending: list[tuple[int, int, dict]]) -> list[Record]:
    """The first-size misses of the pending combinations that can be among the nearest misses,
    evaluated in full: in order of their floor's shortfall, until that exceeds the shortfall of
    the ``NEAREST``-th family's nearest miss so far (a pending miss is at least as short as its
    floor, so no later one can enter; nor improve a family already nearer)."""
    best: dict[tuple, tuple] = {}
    for r in records:
        if r.reason in (NOT_FIT_GPU, NOT_FIT_HOST):
            fam, key = _nearest_key(space, r)
            best[fam] = min(best.get(fam, key), key)
    found = []
    for floor, index, techniques in sorted(pending, key=lambda p: (p[0], p[1])):
        fifth = heapq.nsmallest(NEAREST, best.values())
        if len(fifth) == NEAREST and floor > fifth[-1][0]:
            break
        rec = record_of(index, evaluate(space.config(techniques, space.micro_batch_sizes[0])))
        found.append(rec)
        fam, key = _nearest_key(space, rec)
        best[fam] = min(best.get(fam, key), key)
    return found


def _nearest(space: SearchSpace, records: list[Record]) -> list[Record]:
    """The ``NEAREST`` feasible misses of distinct ranking families, each family's nearest: the
    smallest shortfall, then the simpler plan (``strategies.complexity``), then enumeration order."""
    misses = sorted(((*_nearest_key(space, r), r) for r in records if r.reason in (NOT_FIT_GPU, NOT_FIT_HOST)),
                    key=lambda m: m[1])
    out: dict[tuple, Record] = {}
    for fam, _, record in misses:
        out.setdefault(fam, record)
        if len(out) == NEAREST:
            break
    return list(out.values())


def greedy_seeds(space: SearchSpace, evaluate: Evaluate, rounds: int = 2) -> list[dict]:
    """The analytic best of a coordinate search: from the first choice of every field, change one
    field (or the micro-batch) at a time, keeping the fastest fitting candidate."""
    axes: dict[str, tuple] = dict(space.choices) | {"micro_batch_size": space.micro_batch_sizes}
    current = {name: values[0] for name, values in axes.items()}
    best: Record | None = None
    for _ in range(rounds):
        for name, values in axes.items():
            for value in values:
                trial = current | {name: value}
                index = space.combo_index({k: v for k, v in trial.items() if k != "micro_batch_size"})
                rec = record_of(index, evaluate(space.config(space.combo(index), int(trial["micro_batch_size"]))))
                if rec.reason is None and (best is None or rec.rank_key() < best.rank_key()):
                    best, current = rec, trial
    return [current] if best is not None else []


def optuna_search(space: SearchSpace, evaluate: Evaluate, trials: int = 400, seed: int = 0,
                  sampler: str = "tpe") -> SearchOutcome:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen: dict[tuple, Record] = {}

    def objective(trial: "optuna.Trial") -> float:
        techniques = {f: trial.suggest_categorical(f, list(v)) for f, v in space.choices.items()}
        mbs = trial.suggest_categorical("micro_batch_size", list(space.micro_batch_sizes))
        index = space.combo_index(techniques)
        if (index, mbs) not in seen:
            seen[index, mbs] = record_of(index, evaluate(space.config(space.combo(index), mbs)))
        rec = seen[index, mbs]
        feasible = rec.reason in (None, NOT_FIT_GPU, NOT_FIT_HOST)
        # bytes short of fitting (<= 0: satisfied); infeasible combinations are far outside
        trial.set_constraint("memory_shortfall_bytes", float(rec.shortfall) if feasible else float(2**60))
        return rec.tokens_per_second

    samplers = {
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }
    study = optuna.create_study(direction="maximize", sampler=samplers[sampler]())
    for params in greedy_seeds(space, evaluate):
        study.enqueue_trial(params)
    study.optimize(objective, n_trials=trials)
    records = list(seen.values())
    rejected = Counter(r.reason for r in records if r.reason is not None)
    return _outcome(space, records, rejected, len(records), len(records), f"optuna-{sampler}")


ENGINES = ("auto", "exhaustive", "tpe", "nsga2")


def _methods(space: SearchSpace) -> int:
    """How many training methods the space holds (the values of a strategy that takes "any", such
    as the adapter): each is a search of its own size, whose other choices the method mostly
    decides (an adapter plan refuses the sharded engines), so ``auto`` sizes the space per method;
    a sampler spread over all of them finds none well (seen: --adapter any on 1xRTX4090-24, where
    TPE never tried the adapters that fit)."""
    return prod(len(space.choices.get(s.field, ())) or 1 for s in REGISTRY if s.any_choice)


#: The cyclic garbage collector's first-generation threshold while the exhaustive engine scans
#: (Python's default: 700 allocations). An evaluation allocates hundreds of short-lived objects
#: that reference counting frees; collecting every 700 re-walks the young ones for nothing:
#: the search is 4-12 % faster at 20,000 (8B on 8xH100-80, 1xA100-40 and 1xRTX4090-24
#: ``--adapter any``, medians of 5). Objects in reference cycles wait up to 20,000 allocations
#: to be collected instead of 700.
SEARCH_GC_THRESHOLD = 20_000


@contextmanager
def _fewer_collections():
    """The garbage collector at ``SEARCH_GC_THRESHOLD`` for the block (and the workers it forks),
    its thresholds as they were afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], SEARCH_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def search(space: SearchSpace, evaluate: Evaluate, engine: str = "auto", trials: int = 400, seed: int = 0,
           refusals: RefusalMemo | None = None, cut: Evaluate | None = None,
           sizing: Sizing | None = None, workers: int | None = None) -> SearchOutcome:
    """``workers``: the exhaustive engine's processes (None: the machine's cores, for a large
    enough space)."""
    if engine == "auto":
        engine = "exhaustive" if space.size <= EXHAUSTIVE_LIMIT * _methods(space) else "tpe"
    if engine == "exhaustive":
        with _fewer_collections():
            return exhaustive(space, evaluate, workers, refusals=refusals, cut=cut, sizing=sizing)
    if engine in ("tpe", "nsga2"):
        return optuna_search(space, evaluate, trials, seed, engine)
    raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")


def search_plans(space: SearchSpace, model: ModelSpec, hardware: HardwareSpec, margin: float = 0.0,
                 engine: str = "auto", trials: int = 400, seed: int = 0,
                 workers: int | None = None, sized: bool = True) -> SearchOutcome:
    """``search`` with the planner's evaluator for ``model`` on ``hardware`` (candidates a rule
    refuses left unevaluated; one check and layout per combination, whatever its micro-batch),
    its rule refusals remembered and, for the exhaustive engine, candidates cut at a GPU peak
    floor that misses. ``sized``: each combination's fastest fitting size only is timed and
    recorded (suggest's question); without it every fitting size is (tune ranks them all)."""

    shared = Shared()  # each combination's check and context, each distinct layout

    def run(config: TrainingConfig) -> Evaluation:
        return evaluate(model, hardware, config, margin, skip_infeasible=True, shared=shared)

    def cut(config: TrainingConfig) -> Evaluation:
        return evaluate(model, hardware, config, margin, skip_infeasible=True, cut_misses=True, shared=shared)

    def memory(config: TrainingConfig) -> Evaluation:
        return evaluate(model, hardware, config, margin, skip_infeasible=True, cut_misses=True, shared=shared,
                        timed=False)

    return search(space, run, engine, trials, seed, RefusalMemo(model, hardware, shared), cut,
                  Sizing(memory, time_evaluation) if sized else None, workers)
