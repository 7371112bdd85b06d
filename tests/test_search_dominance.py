"""The search's shortcuts: it skips a combination when a simpler twin fits (planner/engine/
search.py ``_scan``; the ``twin`` hooks of strategies/attention.py and strategies/precision.py),
and each rule's finding is remembered by the values it read (planner/engine/refusals.py), whole
sets of combinations a remembered refusal decides left unenumerated (``SearchSpace.share``).
Checked here against the cost model:

1. every twin dominates: at the same micro-batch, no larger on the GPU or the host, at least as
   fast, of lower complexity, the same numerics and ranking family; and a twin has no twin;
2. the refusal memo's checks are ``check_config``'s; the workers' shares partition the space and
   count exactly what they leave out;
3. so suggest's answer is the plain exhaustive search's, in everything a user sees
   (benchmarks/search_corpus.py runs the whole 66-situation corpus; here a covering subset).
"""

import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.engine.estimate import SIZE_FIELDS, Shared, check_config, evaluate
from planner.engine.ranking import Candidate
from planner.engine.refusals import Recording, RefusalMemo
from planner.engine.space import build_space
from planner.strategies import REGISTRY, PlanContext, TrainingConfig, complexity, numerics_of
from planner.strategies.base import LAYOUT_INPUTS

from helpers import FULL, examples

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import search_corpus  # noqa: E402

TWINNED = [s for s in REGISTRY if s.twin is not None]
MODELS = ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "google/gemma-2-2b",
          "mistralai/Mixtral-8x7B-v0.1", "openai-community/gpt2")
GPUS = ("1xA100-40", "1xRTX4090-24", "8xH100-80", "2x8xH100-80", "1xV100-32", "4xA100-40", "1xL4-24")


def _twin_update(config: TrainingConfig) -> dict:
    values = {s.field: getattr(config, s.field) for s in REGISTRY}
    return {s.field: v for s in TWINNED if (v := s.twin(values)) is not None}


@settings(max_examples=examples(4000, ci=400), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS),
       micro_batch_size=st.sampled_from([1, 2, 4, 8]), grad_accum=st.sampled_from([1, 2, 4]),
       seq_len=st.sampled_from([512, 2048, 8192]))
def test_every_twin_dominates_its_combination(seed, model, gpus, micro_batch_size, grad_accum, seq_len):
    rng = random.Random(seed)
    kw = {s.field: rng.choice(list(s.choices)) for s in REGISTRY}
    kw["attention"] = rng.choice(["eager", "eager", kw["attention"]])  # most draws have a twin
    kw["precision"] = rng.choice(["fp16-mixed", kw["precision"]])
    x = TrainingConfig(**kw, micro_batch_size=micro_batch_size, grad_accum=grad_accum, seq_len=seq_len)
    update = _twin_update(x)
    if not update:
        return
    twin = x.model_copy(update=update)
    assert not _twin_update(twin), "a twin is its own twin: no chain to follow"
    assert complexity(twin) < complexity(x)
    assert numerics_of(twin) == numerics_of(x)
    assert Candidate(None, twin, 0, 0).family == Candidate(None, x, 0, 0).family
    m, hw = resolve_model(model), parse_gpus(gpus)
    ex, et = evaluate(m, hw, x), evaluate(m, hw, twin)
    if not (ex.feasible and et.feasible):
        return
    assert et.peak <= ex.peak, (x, update)
    assert et.host_memory["peak"] <= ex.host_memory["peak"], (x, update)
    # at least as fast, to float rounding: the same step's rows summed in another order can
    # differ in the last bit (seen: fp16-mixed against its bf16-mixed twin, 1 ulp)
    assert et.tokens_per_second >= ex.tokens_per_second * (1 - 1e-12), (x, update)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("fixed", [
    {"adapter": ["none", "lora", "qlora"]},
    # after the engine only a twin field varies: a pruned set's completions all fall in one residue
    {"adapter": ["none", "lora", "qlora"], "offload": ["none"], "checkpointing": ["full"], "loss": ["chunked"]},
])
def test_the_shares_partition_the_space_and_count_what_they_prune(workers, fixed):
    """``SearchSpace.share``: the workers' shares hold every combination once, in enumeration
    order, with its index, its values and its twin in the same share; a partial combination
    refused as a whole is counted, not enumerated, in exactly the share of its completions."""
    space = build_space(8, 2048, fixed)
    every = list(space.technique_combos())

    def refused(values):  # every completion of a partial combination with ddp and lora
        return "x" if values.get("sharding") == "ddp" and values.get("adapter") == "lora" else None

    seen, counted = [], 0
    for share in range(workers):
        mine = list(space.share(share, workers))
        indices = {i for i, _, _ in mine}
        assert [i for i, _, _ in mine] == sorted(indices)
        for index, techniques, values in mine:
            assert techniques == every[index] and values == space.values(techniques, space.micro_batch_sizes[0])
            twin = space.twin(techniques)
            assert twin is None or twin in indices
        seen += [i for i, _, _ in mine]
        counts: list[int] = []
        kept = [i for i, _, _ in space.share(share, workers, refused, lambda code, n, c=counts: c.append(n))]
        assert kept == [i for i, t, _ in mine if refused(t) is None]
        assert sum(counts) == len(mine) - len(kept)
        counted += sum(counts)
    assert sorted(seen) == list(range(len(every)))
    assert counted == sum(refused(t) is not None for t in every) > 0


@pytest.mark.parametrize("model, gpus, workers", [pytest.param("Qwen/Qwen2.5-0.5B", "1xRTX4090-24", 1, marks=FULL),
                                                  ("meta-llama/Llama-3.1-8B", "8xH100-80", 2)])  # (CI: two workers)
def test_what_the_search_leaves_unenumerated_counts_as_each_combination_would(model, gpus, workers, monkeypatch):
    """The search with every adapter, its refused sets counted without being enumerated
    (``RefusalMemo.refused``), and the same search asking that of no partial combination: the
    same rejections for the same reasons, the same plans, in one process and split between two
    workers; and most combinations are never built."""
    from planner.engine import refusals, search
    from planner.engine.space import SearchSpace

    m, hw = resolve_model(model), parse_gpus(gpus)
    space = build_space(hw.num_gpus, 2048, {"adapter": ["none", "lora", "qlora", "dora", "lora-int8"]})
    enumerated, share = [], SearchSpace.share

    def counted(self, *args):
        for item in share(self, *args):
            enumerated.append(item[0])
            yield item

    monkeypatch.setattr(SearchSpace, "share", counted)
    pruned = search.search_plans(space, m, hw, workers=workers)
    if workers == 1:  # (forked workers enumerate in their own processes)
        assert 0 < len(enumerated) < 0.5 * space.combos
    monkeypatch.setattr(refusals.RefusalMemo, "refused", lambda self, values: None)
    every = search.search_plans(space, m, hw, workers=workers)
    assert pruned.rejected == every.rejected and pruned.dominated == every.dominated
    assert [r.rank_key() for r in pruned.fitting] == [r.rank_key() for r in every.fitting]


@pytest.mark.parametrize("model, gpus", [pytest.param("meta-llama/Llama-3.1-8B", "8xH100-80", marks=FULL),
                                         ("Qwen/Qwen2.5-0.5B", "1xV100-32")])
def test_the_refusal_memo_answers_as_the_rules_do(model, gpus):
    """Learn from a random half of the combinations (every adapter), then ask about all of them:
    every check the memo assembles is ``check_config``'s up to its first refusal (codes,
    messages and warnings, in order), and its tries answer almost every rule."""
    m, hw = resolve_model(model), parse_gpus(gpus)
    space = build_space(hw.num_gpus, 2048, {"adapter": ["none", "lora", "qlora", "dora", "lora-int8"]})
    memo, rng = RefusalMemo(m, hw), random.Random(0)
    combos = list(space.technique_combos())
    configs = [space.config(t, 1) for t in combos]
    for techniques, config in zip(combos, configs, strict=True):
        if rng.random() < 0.5:
            memo.check(space.values(techniques, 1), lambda c=config: c)
    runs, learn = [], memo._learn
    memo._learn = lambda *a: runs.append(a) or learn(*a)
    for techniques, config in zip(combos, configs, strict=True):
        said = memo.check(space.values(techniques, 1), lambda c=config: c)
        truth = check_config(PlanContext(m, hw, config), first_only=True)
        assert (said.codes, said.infeasible, said.warnings) == (truth.codes, truth.infeasible, truth.warnings), config
    assert all(trie.on for trie in memo.tries) and len(runs) < 0.01 * len(combos), len(runs)
    for techniques, config in zip(combos[:50], configs, strict=False):  # what the memo reads without a config
        assert all(getattr(config, k) == v for k, v in space.values(techniques, 1).items())


@pytest.mark.parametrize("model, gpus", [pytest.param("meta-llama/Llama-3.1-8B", "8xH100-80", marks=FULL),
                                         ("Qwen/Qwen2.5-0.5B", "1xRTX4090-24"),
                                         ("mistralai/Mixtral-8x7B-v0.1", "2x8xH100-80")])
def test_remembered_rows_are_the_rows_the_strategies_write(model, gpus):
    """``Shared``'s row memo (planner/engine/recorded.py ``RowMemo``): over a search's worth of
    candidates (every adapter, random combinations and sizes, one ``Shared``), every evaluation
    writes the rows, peaks, host memory and step time of the plain evaluation; the memo answers
    most writes and stays on."""
    m, hw = resolve_model(model), parse_gpus(gpus)
    space = build_space(hw.num_gpus, 2048, {"adapter": ["none", "lora", "qlora", "dora", "lora-int8"]})
    rng, shared = random.Random(0), Shared()
    combos = list(space.technique_combos())
    rng.shuffle(combos)
    compared = 0
    for techniques in combos:
        if compared == 120:
            break
        config = space.config(techniques, rng.choice(space.micro_batch_sizes))
        memo, plain = evaluate(m, hw, config, shared=shared), evaluate(m, hw, config)
        assert memo.feasible == plain.feasible
        if not plain.feasible:
            continue
        compared += 1
        rows = [[(r.term, r.label, r.bytes, r.location, sorted(r.phases), r.moment, r.note, r.tag) for r in ev.draft.rows]
                for ev in (memo, plain)]
        assert rows[0] == rows[1], config
        assert (memo.peak, memo.host, memo.step_seconds) == (plain.peak, plain.host, plain.step_seconds)
    assert compared == 120 and all(r.trie.on for r in shared.rows.values())
    assert {s.field for s in REGISTRY} == set(shared.rows)


@settings(max_examples=examples(3000, ci=300), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS),
       micro_batch_size=st.sampled_from([1, 2, 4, 8]), seq_len=st.sampled_from([512, 2048, 8192]),
       margin=st.sampled_from([0.0, 0.1]))
def test_a_cut_evaluation_is_a_floor_and_an_uncut_one_the_evaluation(seed, model, gpus, micro_batch_size,
                                                                      seq_len, margin):
    """``evaluate(cut_misses=True)``: cut only when the plan does not fit the GPU, at a peak no
    higher than the real one; otherwise every figure the search reads is the plain evaluation's
    (the rows are written in another order, and rows do not depend on it), the step time of a
    plan that fits included."""
    rng = random.Random(seed)
    kw = {s.field: rng.choice(list(s.choices)) for s in REGISTRY}
    config = TrainingConfig(**kw, micro_batch_size=micro_batch_size, grad_accum=2, seq_len=seq_len)
    m, hw = resolve_model(model), parse_gpus(gpus)
    plain = evaluate(m, hw, config, margin, skip_infeasible=True)
    cut = evaluate(m, hw, config, margin, skip_infeasible=True, cut_misses=True)
    assert cut.feasible == plain.feasible
    if cut.cut:
        assert not plain.gpu_fits and cut.peak <= plain.peak
    elif plain.feasible:
        assert (cut.peak, cut.host) == (plain.peak, plain.host)
        assert cut.step_seconds == (plain.step_seconds if plain.fits else 0.0)  # a miss is not timed


@pytest.mark.parametrize("model, gpus", [("meta-llama/Llama-3.1-405B", "1xRTX4090-24"),
                                         ("meta-llama/Llama-3.1-70B", "2xA100-40"),
                                         ("mistralai/Mixtral-8x7B-v0.1", "1xA100-80")])
def test_nothing_fits_probes_answer_as_uncut_ones(model, gpus, monkeypatch):
    """The nothing-fits probes leave out a probe cut above the least peak so far and the GPU:
    the least peak, the host RAM needed and the probes that fit are those of uncut probes."""
    from planner.engine import nothing_fits
    from planner.schema.suggest import SuggestRequest

    request = SuggestRequest(model=model, gpus=gpus, seq_len=2048)

    def scan():
        s = nothing_fits.Prober(request, resolve_model(model)).scan(gpus)
        return (s.min_peak, s.host_needed, sorted(str(p.techniques) for p in s.probes if p.gpu_fits)), len(s.probes)

    cut, kept = scan()
    plain = nothing_fits.evaluate
    monkeypatch.setattr(nothing_fits, "evaluate", lambda *a, cut_misses=False, cut_above=0, **k: plain(*a, **k))
    uncut, every = scan()
    assert cut == uncut and cut[0] is not None
    assert kept < every  # the cut left probes out


def test_the_fixes_found_beside_the_search_are_explains_own():
    """suggest looks for the hardware fixes beside its main search (``hardware_fixes``): none where
    a candidate fits; where none does, the verdict built from them is the one ``explain`` builds."""
    from planner.engine import nothing_fits
    from planner.engine.suggest import _search, _space
    from planner.schema.suggest import SuggestRequest

    fits = SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="1xA100-40", seq_len=2048)
    assert nothing_fits.hardware_fixes(fits, resolve_model(fits.model), fits.hardware()) is None
    request = SuggestRequest(model="meta-llama/Llama-3.1-405B", gpus="1xRTX4090-24", seq_len=2048)
    model, hardware = resolve_model(request.model), request.hardware()
    found = nothing_fits.hardware_fixes(request, model, hardware)
    outcome = _search(request, model, hardware, _space(request, hardware.num_gpus, None))
    assert found is not None and not outcome.fitting
    assert nothing_fits.explain(request, model, hardware, outcome, [], found) == nothing_fits.explain(
        request, model, hardware, outcome, [])


def test_whether_a_plan_fits_more_gpus_is_the_full_scans_answer():
    """``Prober.fits`` stops at the first probe that fits: on every count of the ladder, and for
    host RAM below, at and above what the full scan needs, it answers as the full scan does."""
    from planner.cost.overheads import host_capacity_for
    from planner.engine import nothing_fits
    from planner.schema.suggest import SuggestRequest

    request = SuggestRequest(model="meta-llama/Llama-3.1-70B", gpus="1xH100-80", seq_len=2048)
    model, early = resolve_model(request.model), 0
    for spec in nothing_fits.hardware_ladder(parse_gpus(request.gpus)):
        full = nothing_fits.Prober(request, model).scan(spec)
        needed = full.host_needed if full is not None else None
        cap = host_capacity_for(needed) if needed is not None else None  # host RAM whose usable share holds it
        hosts = [None] + ([cap - 1, cap, cap + 1] if cap is not None else [])
        for host in hosts:
            prober = nothing_fits.Prober(request, model)
            assert prober.fits(spec, host) == (full is not None and full.fits(host)), (spec, host)
            early += spec not in prober._scans  # a scan that stopped early is not kept
    assert early > 0


def test_a_space_without_the_twin_value_searches_the_combination_itself():
    """--attention eager alone: the twin (sdpa) is not in the space, so nothing is skipped."""
    alone = build_space(1, 2048, {"attention": ["eager"]})
    both = build_space(1, 2048)
    eager = next(c for c in alone.technique_combos() if c["checkpointing"] == "none")
    assert alone.twin(eager) is None
    twin = both.twin(next(c for c in both.technique_combos() if c == eager | {"attention": "eager"}))
    assert both.combo(twin)["attention"] == "sdpa"


#: A covering subset of the corpus (the default request runs the adapter option's search too):
#: one GPU without bf16 (V100: fp16-mixed searched as itself), nothing fits (GPT-2 at 8k tokens: every
#: rule refuses; 405B on one RTX 4090: the nearest misses and the hardware fixes), a consumer GPU under
#: --numerics exact with host RAM given, numerics any with a margin, and long sequences on one GPU
#: (8,192 tokens, and 32,768: the long-context levers, checkpoint offload and the tiled MLP).
SUBSET = [c for c in search_corpus.CORPUS
          if (c[0], c[1], tuple(c[2])) in {("meta-llama/Llama-3.2-1B", "1xV100-32", ()),
                                           ("openai-community/gpt2", "1xT4-16", ("seq_len",)),
                                           ("Qwen/Qwen2.5-0.5B", "1xRTX4090-24", ("numerics", "host_memory_gb")),
                                           ("Qwen/Qwen2.5-0.5B", "1xRTX4090-24", ("numerics", "margin")),
                                           ("Qwen/Qwen2.5-0.5B", "1xRTX4090-24", ("seq_len",)),
                                           ("meta-llama/Llama-3.1-405B", "1xRTX4090-24", ())}]


@pytest.mark.parametrize("model, gpus, extra", [  # the consumer GPU's and 405B's: the full suite's (helpers.FULL)
    pytest.param(*c, marks=FULL) if c[0] in ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.1-405B") else c for c in SUBSET],
    ids=lambda v: str(v) if not isinstance(v, dict) else
    ",".join(f"{k}={v[k] if k != 'adapter' else 'any'}" for k in v) or "default")
def test_suggest_with_twins_is_the_plain_exhaustive_search(model, gpus, extra):
    assert len(SUBSET) == 7
    differ, figures = search_corpus.compare(model, gpus, extra)
    assert not differ, figures


def test_a_trusted_configuration_is_the_one_model_construct_builds():
    """The space builds its candidates with ``TrainingConfig.trusted``: the same fields, in the same
    order, the same fields set, equal, and hashed alike; ``SearchSpace.values`` names every field
    (the refusal memo reads them without building the configuration)."""
    space = build_space(8, 2048, settings={"lora_rank": 64})
    assert TrainingConfig.defaults() is not None
    for index in (0, space.combos // 3, space.combos - 1):
        values = space.values(space.combo(index), 2)
        assert set(values) == set(TrainingConfig.model_fields)
        fast, slow = TrainingConfig.trusted(values), TrainingConfig.model_construct(**values)
        assert list(fast.__dict__.items()) == list(slow.__dict__.items())
        assert fast.model_fields_set == slow.model_fields_set == set(values)
        assert fast == slow and hash(fast) == hash(slow) and fast.lora_rank == 64


@settings(max_examples=examples(3000, ci=300), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS),
       micro_batch_size=st.sampled_from([1, 2, 4]), grad_accum=st.sampled_from([1, 2]),
       seq_len=st.sampled_from([512, 2048, 8192]))
def test_no_rule_and_no_layout_reads_the_micro_batch(seed, model, gpus, micro_batch_size, grad_accum, seq_len):
    """The search checks each combination once for all its micro-batch sizes and lays out each
    distinct tuple of ``LAYOUT_INPUTS`` once (``evaluate``'s ``shared``): the layout hooks read
    only those fields; every check hook and layout hook reads configuration fields and properties
    only, none of ``SIZE_FIELDS``; and an evaluation that reuses another size's check and layout
    is the plain evaluation."""
    rng = random.Random(seed)
    kw = {s.field: rng.choice(list(s.choices)) for s in REGISTRY}
    config = TrainingConfig(**kw, micro_batch_size=micro_batch_size, grad_accum=grad_accum, seq_len=seq_len)
    m, hw = resolve_model(model), parse_gpus(gpus)
    layout_view = Recording(config)
    _ = PlanContext(m, hw, layout_view).layout
    assert layout_view.safe and layout_view.seen <= set(LAYOUT_INPUTS), layout_view.reads
    view = Recording(config)
    ctx = PlanContext(m, hw, view)
    check_config(ctx)
    _ = ctx.layout
    assert view.safe and not view.seen & SIZE_FIELDS, view.reads
    shared = Shared()
    other = config.model_copy(update={"micro_batch_size": micro_batch_size * 2})
    evaluate(m, hw, other, shared=shared)
    reused, plain = evaluate(m, hw, config, shared=shared), evaluate(m, hw, config)
    assert reused.ctx.layout is next(iter(shared.layouts.values())) == plain.ctx.layout
    assert (reused.check, reused.peak, reused.host, reused.step_seconds) == (
        plain.check, plain.peak, plain.host, plain.step_seconds)


@settings(max_examples=examples(3000, ci=300), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS),
       micro_batch_size=st.sampled_from([1, 2, 4, 8]), seq_len=st.sampled_from([512, 2048, 8192]))
def test_tokens_per_second_rise_with_the_micro_batch_unless_paged_state_spills(seed, model, gpus,
                                                                                micro_batch_size, seq_len):
    """``search._scan_sized`` times only a combination's largest fitting micro-batch: at twice the
    micro-batch (half the accumulation) a plan is strictly faster, unless its paged optimizer
    state spills to host RAM there (the spill grows with the activations)."""
    rng = random.Random(seed)
    kw = {s.field: rng.choice(list(s.choices)) for s in REGISTRY}
    m, hw = resolve_model(model), parse_gpus(gpus)
    small, large = (evaluate(m, hw, TrainingConfig(**kw, micro_batch_size=b, grad_accum=16 // b, seq_len=seq_len))
                    for b in (micro_batch_size, 2 * micro_batch_size))
    if not small.feasible or (large.paged is not None and large.paged.spilled_bytes):
        return
    assert large.tokens_per_second > small.tokens_per_second, kw


@pytest.mark.parametrize("model, gpus, seq_len, adapters", [
    pytest.param("meta-llama/Llama-3.1-8B", "8xH100-80", 2048, ["none"], marks=FULL),  # most fit at every size
    pytest.param("Qwen/Qwen2.5-0.5B", "1xRTX4090-24", 2048, ["none", "qlora"], marks=FULL),  # a consumer GPU, an adapter
    ("meta-llama/Llama-3.1-8B", "1xA100-40", 4096, ["none", "lora"]),  # boundaries inside the sizes
])
def test_timing_each_combinations_largest_size_keeps_every_answer(model, gpus, seq_len, adapters, monkeypatch):
    """With every combination searched as itself (no twins, no refusal memo), the sized search
    counts the same candidates fitting and rejected for the same reasons as the plain one, records
    each combination's largest fitting size as the plain search does (every size where paged
    state spills), and every ranking of both agrees."""
    from planner.core.numerics import NumericsPolicy
    from planner.engine import search
    from planner.engine.ranking import rank, searched

    monkeypatch.setattr("planner.engine.space._TWINS", ())
    monkeypatch.setattr(search, "RefusalMemo", lambda model, hardware, shared=None: None)
    m, hw = resolve_model(model), parse_gpus(gpus)
    space = build_space(hw.num_gpus, seq_len, {"adapter": adapters})
    monkeypatch.setattr(search, "PARALLEL_MIN_CANDIDATES", 10**12)
    sized = search.search_plans(space, m, hw)
    with monkeypatch.context() as plain_mode:
        plain_mode.setattr(search, "Sizing", lambda memory, time: None)
        plain = search.search_plans(space, m, hw)
    assert sized.fit_count == plain.fit_count == len(plain.fitting) > len(sized.fitting)
    assert sized.rejected == plain.rejected
    spilled = {r.combo for r in sized.fitting if (ev := evaluate(m, hw, sized.config(r))).paged and ev.paged.spilled_bytes}
    assert spilled  # paged AdamW spills at some largest size: each of that combination's sizes is timed
    for combo in spilled:
        assert {r for r in sized.fitting if r.combo == combo} == {r for r in plain.fitting if r.combo == combo}
    largest: dict[int, search.Record] = {}
    for r in plain.fitting:
        if r.micro_batch_size > largest.get(r.combo, r).micro_batch_size or r.combo not in largest:
            largest[r.combo] = r
    assert set(sized.fitting) <= set(plain.fitting) and set(largest.values()) <= set(sized.fitting)
    for policy in NumericsPolicy:
        a, b = rank(searched(sized), policy, 5), rank(searched(plain), policy, 5)
        assert [c.item for c in a.plans] == [c.item for c in b.plans]
        assert [c.item for c in a.trade_offs] == [c.item for c in b.trade_offs] and a.least.item == b.least.item
