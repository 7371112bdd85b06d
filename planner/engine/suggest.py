"""``planner suggest``: search the space, rank what fits (planner/engine/ranking.py: numerics,
then speed with ties to the simpler plan, one plan per family), show what approximations would
buy and what was assumed; or, when nothing fits, what the job needs and the smallest fixes
(planner/engine/nothing_fits.py: more host RAM, more GPUs, a larger GPU).
"""

import os
import sys
from dataclasses import dataclass

from planner.catalog.models import resolve_model
from planner.core.errors import PlannerInputError
from planner.core.launch_contract import Launcher
from planner.core.numerics import NumericsPolicy
from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine import search as search_module
from planner.engine.assumptions import assumptions, rate_assumptions
from planner.engine.degrees import degrees_line, searchable, sequence_requests
from planner.engine.estimate import default_seq_len, evaluate, result_of
from planner.engine.exact_host import exact_host_option, exact_only
from planner.engine.forked import Forked
from planner.engine.grpo_splits import reasons_line, server_splits, worth_searching
from planner.engine.lengths_file import lengths_of
from planner.engine.nothing_fits import Fixes, Verdict, explain, hardware_fixes
from planner.engine.ranking import HEADROOM, TIE_BAND, Candidate, Ranking, distinct, order, rank, searched
from planner.engine.search import ENGINES, SearchOutcome, merged, search_plans
from planner.engine.space import SearchSpace, build_space, settings_of
from planner.schema.estimate import EstimateResult
from planner.schema.suggest import AdapterOption, HostOption, SuggestRequest, SuggestResult, TradeOff, TrainingTime
from planner.strategies import FIELDS, REGISTRY, PlanContext, approximation_words, summary
from planner.strategies.adapter import ALLOWS, Adapter
from planner.strategies.optimizer import STRATEGY as OPTIMIZER
from planner.strategies.sharding import engine_of

#: Full fine-tuning counts as "far slower" than an adapter when the adapter plan is this much faster
#: (on 1xRTX4090-24, Llama-3.1-8B in full needs CPU offload: at a batch of 16 sequences QLoRA is about
#: 46 % faster; at the default 64, whose compute hides the host optimizer step, 17 %: no line).
ADAPTER_HINT_GAIN = 0.25


def suggest(request: SuggestRequest) -> SuggestResult:
    """The answer for ``request``; for GRPO with its generation left to planner, on one machine
    of several GPUs, also a vLLM server on some of them beside training on the rest
    (planner/engine/grpo_splits.py): the faster answer, with every split's speed or bound."""
    splits = server_splits(request, _resolved_space)
    if not splits:
        return _suggest_one(request)
    # the split likeliest to be searched, in a child on a spare core while this process answers
    # the request (at the lowest priority: where the cores are busy it waits for the answer rather
    # than slow it, and is stopped if its bound loses); the others once the colocated speed says
    # whether they can win
    ahead = max(splits, key=lambda s: s.bound or 0.0)
    beside = Forked(_best_speed, ahead.request, in_child=_speculative) if ahead.bound else None
    try:
        result = _suggest_one(request)
        colocated = result.plans[0].time.tokens_per_second if result.plans else None
        speeds = [(beside.result() if split is ahead and beside else _best_speed(split.request))
                  if worth_searching(colocated, split) else None for split in splits]
    finally:
        if beside is not None:
            beside.close()
    fastest = max(((s, split) for s, split in zip(speeds, splits, strict=True) if s is not None),
                  key=lambda x: x[0], default=None)
    chosen = result
    if fastest is not None and (colocated is None or fastest[0] > colocated):
        chosen = _suggest_one(fastest[1].request)
    line = reasons_line((request.hardware().num_gpus, colocated), splits, speeds)
    return chosen.model_copy(update={"reasons": [*chosen.reasons, line]})


def _resolved_space(request: SuggestRequest) -> SearchSpace:
    """``request``'s search space, its seq_len resolved as suggest resolves it."""
    if request.seq_len is None:
        request = request.model_copy(update={"seq_len": default_seq_len(resolve_model(request.model), request)})
    return _space(request, request.hardware().num_gpus, request.global_batch_size)


def _best_speed(request: SuggestRequest) -> float | None:
    """The tokens/s of the fastest plan of ``request`` (its search and ranking alone), or None."""
    model, hardware = resolve_model(request.model), request.hardware()
    try:
        space = _resolved_space(request)
    except PlannerInputError:
        return None
    plans = _rank(request, _search(request, model, hardware, space)).plans
    return plans[0].tokens_per_second if plans else None


def _suggest_one(request: SuggestRequest) -> SuggestResult:
    if request.engine not in ENGINES:
        raise PlannerInputError(f"--engine {request.engine!r}: one of {', '.join(ENGINES)}")
    model = resolve_model(request.model)
    hardware = request.hardware()
    seq_given = request.seq_len is not None
    if request.seq_len is None:
        request = request.model_copy(update={"seq_len": default_seq_len(model, request)})
    searched, left = searchable(sequence_requests(request, _space_of), _space_of)
    # in two children while the main search runs: what to change when nothing fits (or, when a
    # plan does, the host RAM an exact plan needs), and the adapter line's plan
    beside = Beside(Forked(_fixes_or_host, request, model, hardware, in_child=_one_worker),
                    Forked(_adapter_line, request, model, hardware, in_child=_one_worker))
    try:
        return _suggest(request, model, hardware, searched, left, seq_given, beside)
    finally:
        beside.close()


@dataclass
class Beside:
    """What suggest needs beside its main search, each part computed in its own child (two
    processes: when nothing fits, the fixes' probes take about as long as the other two parts and
    the main search together; when a candidate fits, a probe scan finds it in milliseconds and
    the same child goes on to the exact plan's host RAM). ``fixes``: ``_fixes_or_host``.
    ``adapter``: the adapter line's plan (``_adapter_line``)."""

    fixes: Forked
    adapter: Forked

    def close(self) -> None:
        self.fixes.close()
        self.adapter.close()


def _fixes_or_host(request: SuggestRequest, model: ModelSpec,
                   hardware: HardwareSpec) -> tuple[Fixes | None, HostOption | None]:
    """The hardware fixes when no candidate fits (``hardware_fixes``), else None and the host RAM at
    which an exact plan fits when none does with the host RAM asked (``exact_host_option``; None
    when one does, or under ``--numerics any``). suggest reads the host RAM only when a plan fits
    (an exact plan is missing, or under ``--numerics exact`` only an approximation fits), which the
    fixes' probe scan has then found: when it finds none, nothing fits and the host RAM is not
    read."""
    fixes = hardware_fixes(request, model, hardware)
    if fixes is not None or request.numerics == NumericsPolicy.ANY:
        return fixes, None
    return None, exact_host_option(request, model)


def _adapter_line(request: SuggestRequest, model: ModelSpec, hardware: HardwareSpec) -> EstimateResult | None:
    """The adapter line's plan (``_adapter_plan``, exact values first); None when the line is not
    asked for."""
    return _adapter_plan(request, model, hardware, True) if _hint_asked(request) else None


def _suggest(request: SuggestRequest, model: ModelSpec, hardware: HardwareSpec,
             searched_spaces: list[tuple[SuggestRequest, SearchSpace]], left: list[str], seq_given: bool,
             beside: Beside) -> SuggestResult:
    """``searched_spaces``: the request's spaces (planner/engine/degrees.py), their plans ranked as
    one; ``left``: the layouts its flags rule out, with why."""
    outcome = merged(_searches(searched_spaces, model, hardware, _main_workers(request, hardware)))
    space = outcome.space
    candidates = searched(outcome)
    ranking = rank(candidates, request.numerics, request.top)
    plans = _with_room(request, model, hardware, outcome, ranking)
    trade_offs = [_trade_off(_result(request, model, hardware, outcome, c.item), plans[0]) for c in ranking.trade_offs]
    nearest, hw_suggestions, verdict = [], [], None
    if not plans and ranking.least:  # --numerics exact, and only approximations fit
        trade_offs = [_trade_off(_result(request, model, hardware, outcome, ranking.least.item), None)]
    elif not plans:
        misses = distinct(searched(outcome, outcome.nearest))
        nearest = [_result(request, model, hardware, outcome, c.item) for c in misses]
        verdict = explain(request, model, hardware, outcome, nearest, beside.fixes.result()[0])
        hw_suggestions = verdict.suggestions
    return SuggestResult(
        plans=plans,
        considered=outcome.considered,
        rejected=dict(outcome.rejected.most_common()),
        evaluated=outcome.evaluated,
        dominated=outcome.dominated,
        engine=outcome.engine,
        global_batch_size=space.global_batch_size,
        seq_len=space.seq_len,
        fits=bool(plans),
        nearest=nearest,
        hardware_suggestions=hw_suggestions,
        reasons=(_reasons(outcome, verdict, hardware) if plans or not ranking.least else [])
        + degrees_line(outcome, candidates, request.numerics, left)
        + _numerics_note(request, ranking, plans)
        + _launcher_note(request),
        numerics=request.numerics,
        exact_fits=ranking.exact_fits,
        trade_offs=trade_offs,
        assumptions=assumptions(request, hardware, space.seq_len, space.global_batch_size, seq_given=seq_given,
                                batch_given=request.global_batch_size is not None)
        + (rate_assumptions(hardware, plans[0].time.terms, engine_of(plans[0].config.sharding))
           + [f"MFU of the {plans[0].time.mfu_basis}"] if plans else []),
        training=_training(request, plans[0], request.tokens) if plans and request.tokens else None,
        needs_bytes=verdict.needs_bytes if verdict else None,
        adapter_option=_option(beside.adapter.result(), plans[0] if plans else None) if _hint_asked(request) else None,
        exact_host=beside.fixes.result()[1] if (plans and not ranking.exact_fits) or (not plans and ranking.least) else None,
    )


def _one_worker() -> None:
    """In the child beside the main search: its searches stay in that one process (the
    parent's search has the machine's workers)."""
    search_module.PARALLEL_MIN_CANDIDATES = sys.maxsize


def _speculative() -> None:
    """In a child whose work may not be wanted: one process (``_one_worker``), at the lowest CPU
    priority (nice 19), so that on a machine whose cores the main search fills it takes their idle
    time only."""
    _one_worker()
    try:
        os.nice(19)
    except OSError:  # (a platform without it: the child runs at the parent's priority)
        pass


def _hint_asked(request: SuggestRequest) -> bool:
    """Whether suggest offers the adapter line: the request left adapters out (full fine-tuning
    only), for a launch that can run one."""
    return all(a == Adapter.NONE for a in request.adapter) and request.launcher != Launcher.TRAINER


def _option(plan: EstimateResult | None, winner: EstimateResult | None) -> AdapterOption | None:
    """The adapter line for ``plan`` beside ``winner``: none when the plan is not
    ``ADAPTER_HINT_GAIN`` faster (a line is shown when nothing fits)."""
    if plan is None:
        return None
    gain = plan.time.tokens_per_second / winner.time.tokens_per_second - 1 if winner else None
    if gain is not None and gain < ADAPTER_HINT_GAIN:
        return None
    return AdapterOption(adapter=str(plan.config.adapter), tokens_per_second=plan.time.tokens_per_second,
                         peak_bytes=plan.memory["peak"], gain=gain, summary=summary(plan.config))


def _adapter_plan(request: SuggestRequest, model: ModelSpec, hardware: HardwareSpec, exact_first: bool,
                  bounded: bool = True) -> EstimateResult | None:
    """The fastest LoRA / QLoRA plan of the request (None: none fits, or the request narrows away
    every choice an adapter plan may take).

    ``bounded``: the adapter plans are searched with every technique's exact values first (AdamW
    and paged AdamW, no bf16-pure: about a fifth of the space; with ``exact_first``, as when a
    full plan fits: when none does, memory is tight and the exact optimizers' space, whose bound
    can end the search, comes first; either order finds the same plan), then with the exact
    optimizers (a third), and with every value only when no exact plan fits. Under the numerics
    ladder (and ``--numerics exact``) an exact plan that fits outranks every approximation, and
    every exact plan of the full space is in each bounded one, so an exact winner there is the
    full search's winner. tests/test_adapter_plans.py compares the two."""
    narrowed = {}
    for field, (allowed, _, _) in ALLOWS.items():  # only what an adapter plan may take
        given = [str(v) for v in getattr(request, field)] or list(allowed)
        narrowed[field] = [v for v in given if v in allowed]
        if not narrowed[field]:
            return None
    asked = request.model_copy(update={"adapter": [Adapter.LORA, Adapter.QLORA], "engine": "auto"} | narrowed)
    exact = [o for o in request.optimizer or OPTIMIZER.searched or OPTIMIZER.choices if o not in OPTIMIZER.numerics]
    bounded = bounded and bool(exact) and request.numerics != NumericsPolicy.ANY
    exact_optimizers = asked.model_copy(update={"optimizer": exact})
    exact_values = exact_only(asked) if exact_first else None
    tries = [t for t in (exact_values, exact_optimizers) if t is not None] if bounded else []
    for attempt in tries + [asked]:
        try:
            outcome = _search(attempt, model, hardware, _space(attempt, hardware.num_gpus, request.global_batch_size))
        except PlannerInputError:
            return None
        best = _rank(attempt, outcome).plans
        if best and (attempt is asked or not best[0].numerics):  # an exact winner: the full search's
            break
        if attempt is exact_optimizers and not outcome.fitting and _no_optimizer_fits(model, hardware, outcome):
            return None
    else:
        return None
    return _result(asked, model, hardware, outcome, best[0].item)


#: Bytes per trained parameter that another optimizer could save over AdamW's states: its two fp32
#: moments (8 B) and more than its step counter (4 B per tensor, counted here per parameter).
ADAMW_STATE_BOUND = 12


def _no_optimizer_fits(model: ModelSpec, hardware: HardwareSpec, outcome: SearchOutcome) -> bool:
    """Whether no plan of the full adapter space can fit, given that none of the exact optimizers'
    does: every full-space plan is an exact one with its optimizer swapped (AdamW runs on every
    engine and offload, so the swap never makes an infeasible plan feasible), and a swap saves at
    most AdamW's states, ``ADAMW_STATE_BOUND`` bytes per trained parameter, of GPU or host memory.
    So when the smallest shortfall exceeds that (or no plan was feasible), none fits."""
    if not outcome.nearest:
        return True
    miss = outcome.nearest[0]
    trained = PlanContext(model, hardware, outcome.config(miss)).layout.trainable_parameters
    return miss.shortfall > ADAMW_STATE_BOUND * trained


def _training(request: SuggestRequest, plan: EstimateResult, tokens: float) -> TrainingTime:
    """Wall-clock hours = tokens / the plan's tokens/s; GPU-hours = hours x GPUs."""
    hours = tokens / plan.time.tokens_per_second / 3600
    gpu_hours = hours * plan.hardware.num_gpus
    cost = gpu_hours * request.price_per_gpu_hour if request.price_per_gpu_hour else None
    return TrainingTime(tokens=request.tokens, hours=hours, gpu_hours=gpu_hours, cost=cost)


def _rank(request: SuggestRequest, outcome: SearchOutcome) -> Ranking:
    return rank(searched(outcome), request.numerics, request.top)


def _with_room(request: SuggestRequest, model: ModelSpec, hardware: HardwareSpec, outcome: SearchOutcome,
               ranking: Ranking) -> list[EstimateResult]:
    """The listed plans, each given room where a tie allows (``_roomier``, among its own space's
    micro-batch sizes), ordered again with the thin ones after every tied plan with room
    (planner/engine/ranking.py, 3)."""
    listed = []
    for c in ranking.plans:
        plan = _roomier(request, model, hardware, outcome.space_of(c.item),
                        _result(request, model, hardware, outcome, c.item))
        listed.append(Candidate(plan, plan.config, plan.time.tokens_per_second, plan.memory["peak"], c.rests, _thin(plan)))
    return [c.item for c in order(listed)]


def _thin(plan: EstimateResult) -> bool:
    """Whether ``plan`` leaves less than ``HEADROOM`` of the usable GPU memory free (a paged plan
    fills the GPU by design: never thin)."""
    return plan.peak_without_paged is None and plan.headroom_bytes < HEADROOM * plan.usable_bytes


def _roomier(request: SuggestRequest, model: ModelSpec, hardware: HardwareSpec, space: SearchSpace,
             plan: EstimateResult) -> EstimateResult:
    """Ties go to headroom (planner/engine/ranking.py): ``plan``, or, when it leaves less than
    ``HEADROOM`` of the usable GPU memory free, the fastest smaller micro-batch of its techniques
    (the same sequences per step) that leaves at least that much and stays within ``TIE_BAND``
    of its speed. A paged plan fills the GPU by design and keeps its micro-batch."""
    if not _thin(plan):
        return plan
    c = plan.config
    per_gpu = c.micro_batch_size * c.grad_accum
    best = plan
    for mbs in space.micro_batch_sizes:
        if mbs >= c.micro_batch_size or per_gpu % mbs:
            continue
        config = c.model_copy(update={"micro_batch_size": mbs, "grad_accum": per_gpu // mbs})
        other = result_of(evaluate(model, hardware, config, request.margin), request.margin)
        if (other.fits and not _thin(other)
                and other.time.tokens_per_second >= plan.time.tokens_per_second * (1 - TIE_BAND)
                and (best is plan or other.time.tokens_per_second > best.time.tokens_per_second)):
            best = other
    return best


def _trade_off(plan: EstimateResult, winner: EstimateResult | None) -> TradeOff:
    """``plan`` beside the winner; with no winner (nothing exact fits) its gain is 0."""
    gain = plan.time.tokens_per_second / winner.time.tokens_per_second - 1 if winner else 0.0
    return TradeOff(approximations=approximation_words(plan.config), plan=plan, gain=gain)


def _numerics_note(request: SuggestRequest, ranking: Ranking, plans: list[EstimateResult]) -> list[str]:
    """What the numerics policy decided, when it is not simply "the fastest exact plan"."""
    if not plans and ranking.least:
        return [f"no exact plan fits; the least approximation that fits: {', '.join(approximation_words(ranking.least.config))}"
                " (--numerics ladder)"]
    if not plans or request.numerics == NumericsPolicy.ANY:
        return []
    if not ranking.exact_fits:
        return [f"no exact plan fits: the least approximation that fits is {', '.join(approximation_words(plans[0].config))}"]
    return []


def _launcher_note(request: SuggestRequest) -> list[str]:
    """What --launcher trainer leaves out of the ranking."""
    if request.launcher != Launcher.TRAINER:
        return []
    left = ", ".join(f"{s.field} {v}" for s in REGISTRY for v in s.runtime_only)
    return [f"--launcher trainer: not ranked: {left} (no standard file can say them; the planner launch, "
            "the default, runs them)"]


def _space_of(request: SuggestRequest) -> SearchSpace:
    """``request``'s space (its seq_len resolved) on its GPUs, at its global batch."""
    return _space(request, request.hardware().num_gpus, request.global_batch_size)


def _space(request: SuggestRequest, num_gpus: int, global_batch_size: int | None) -> SearchSpace:
    fixed = {f: [str(v) for v in getattr(request, f)] for f in FIELDS}
    if request.seq_len is None:
        raise ValueError("the request's seq_len is resolved before its space (suggest)")
    return build_space(num_gpus, request.seq_len, fixed, list(request.micro_batch_size), global_batch_size,
                       request.exact_optimizer, request.launcher, settings_of(request), request.batching_used,
                       lengths_of(request))


def _search(request: SuggestRequest, model: ModelSpec, hardware: HardwareSpec, space: SearchSpace,
            workers: int | None = None) -> SearchOutcome:
    return search_plans(space, model, hardware, request.margin, request.engine, request.trials, request.seed,
                        workers)


def _searches(spaces: list[tuple[SuggestRequest, SearchSpace]], model: ModelSpec, hardware: HardwareSpec,
              workers: int | None) -> list[SearchOutcome]:
    """Each request's search of its space, in their order. Several spaces (the sequence-parallel
    layouts: planner/engine/degrees.py) are split in two halves of about equal size, one searched
    in a forked child while this process searches the other, each space in one process: forking
    two workers for each space's shares cost more than the spaces' searches saved (8B on
    8xH100-80 at 131,072 tokens, seven spaces: see benchmarks/suggest_walltime.py). One space, or
    ``workers`` 1: searched here with ``workers``."""
    if len(spaces) < 2 or workers == 1:
        return [_search(r, model, hardware, s, workers) for r, s in spaces]
    halves: tuple[list[int], list[int]] = ([], [])
    for i in sorted(range(len(spaces)), key=lambda i: -spaces[i][1].size):
        lighter = min(halves, key=lambda h: sum(spaces[j][1].size for j in h))
        lighter.append(i)
    theirs = Forked(_search_each, [spaces[i] for i in halves[1]], model, hardware, in_child=_one_worker)
    try:
        found = dict(zip(halves[0], _search_each([spaces[i] for i in halves[0]], model, hardware), strict=True))
        found |= dict(zip(halves[1], theirs.result(), strict=True))
    finally:
        theirs.close()
    return [found[i] for i in range(len(spaces))]


def _search_each(spaces: list[tuple[SuggestRequest, SearchSpace]], model: ModelSpec,
                 hardware: HardwareSpec) -> list[SearchOutcome]:
    """Each space's search in this one process."""
    return [_search(r, model, hardware, s, 1) for r, s in spaces]


def _main_workers(request: SuggestRequest, hardware: HardwareSpec) -> int | None:
    """The main search's processes: one where the adapter line's search runs beside it on one
    GPU, else the machine's cores. On one GPU no sharding is searched, so the adapter line's
    search (adapters fit where full fine-tuning does not) is as large as the main one and the two
    fill the two cores; on several the main search is the larger. Measured, 2 cores, medians of 5
    to the end of the command, one worker against two: 8B 1xA100-40 0.356 / 0.405 s, 8B
    1xRTX4090-24 0.354 / 0.399 s, 405B 1xRTX4090-24 (nothing fits) 0.576 / 0.632 s; on 8xH100-80
    two are faster (0.546 against 0.573 s), as where no adapter line is searched (`--adapter any`).
    Only the time changes: the workers' shares are one search's (planner/engine/search.py)."""
    return 1 if _hint_asked(request) and hardware.num_gpus == 1 else None


def _result(request, model, hardware, outcome: SearchOutcome, record) -> EstimateResult:
    return result_of(evaluate(model, hardware, outcome.config(record), request.margin), request.margin)


def _reasons(outcome: SearchOutcome, verdict: Verdict | None, hardware: HardwareSpec) -> list[str]:
    """How many fit; when none does, the memory story and the fixes (planner/engine/nothing_fits.py).
    Then what the --gpus spec was taken as."""
    skipped = f"; {outcome.dominated:,} skipped for a simpler twin as fast" if outcome.dominated else ""
    head = verdict.reasons if verdict else [f"{outcome.fit_count:,} of {outcome.considered:,} candidates fit{skipped}"]
    return head + hardware.notes
