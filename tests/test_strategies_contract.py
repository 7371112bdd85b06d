"""One contract, every registered strategy: the registry drives everything per technique.

For every technique of ``strategies.REGISTRY``: it is a field of TrainingConfig and of every
request, a flag of every command that plans, part of every rendered summary (the text changes when
only its value changes), read back by ``planner check`` from the files ``planner suggest --out``
writes (for every value a search can rank), and its hooks keep the ledger and the layout sound.
A new technique that misses any of these fails here, by name.
"""

import itertools
import json
from collections import Counter
from functools import partial
from types import SimpleNamespace

import pytest
import typer
from rich.console import Console

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.check import CheckRequest
from planner.cli import app
from planner.cli.flows import SuggestJob
from planner.core.ledger import TERMS, LedgerDraft
from planner.core.numerics import EXACT
from planner.core.vocabulary import WORKLOAD
from planner.emit import build_files, single_plan_result
from planner.engine.estimate import estimate_config, evaluate
from planner.render import report
from planner.render.tune import render_tune
from planner.schema.estimate import EstimateRequest
from planner.schema.suggest import SuggestRequest
from planner.schema.tune import TrialRow, TuneRequest, TuneResult
from planner.strategies import BY_FIELD, LADDER, REGISTRY, TECHNIQUES, Check, PlanContext, TrainingConfig
from planner.strategies.base import LAYOUT_FIELDS, Choice, resolve_layout

from helpers import round_trip, round_trip_errors

QWEN = "Qwen/Qwen2.5-0.5B"
CONTEXTS = [
    PlanContext(resolve_model(m), parse_gpus(g), TrainingConfig(**c))
    for m, g, c in itertools.product(
        ["meta-llama/Llama-3.1-8B", "openai-community/gpt2", "mistralai/Mixtral-8x7B-v0.1"],
        ["1xA100-40", "8xH100-80", "2x8xV100-32"],
        [{}, {"sharding": "zero3", "offload": "optimizer+params", "optimizer": "lion"},
         {"sharding": "fsdp", "precision": "bf16-pure", "checkpointing": "full", "loss": "chunked"},
         {"optimizer": "paged-adamw-8bit", "attention": "eager", "checkpointing": "selective", "grad_accum": 4}],
    )
]
PLANNING_COMMANDS = ("estimate", "suggest", "check", "probe", "tune")
GPUS = ("1xH100-80", "8xH100-80", "2x8xH100-80")
#: the other techniques' values a candidate starts from (padded batching: the batching TRL's DPO
#: trainer runs, which a DPO plan requires)
BASES = ({}, {"sharding": "zero3"}, {"sharding": "fsdp"}, {"sharding": "zero2"}, {"batching": "padded"},
         {"checkpointing": "full"},  # (checkpoint offload moves what full checkpointing keeps)
         {"batching": "padded", "micro_batch_size": 2},  # (KTO's KL estimate: micro-batches of 2 or more)
         {"batching": "padded", "method": "grpo", "generation": "transformers", "completion_len": 128,
          "num_generations": 2, "grad_accum": 2})
IDS = [s.field for s in TECHNIQUES]


def test_registry_covers_every_technique_once():
    fields_ = [s.field for s in REGISTRY]
    assert len(fields_) == len(set(fields_))
    settings = [x.name for s in TECHNIQUES for x in s.settings]
    assert set(fields_) | set(settings) == set(TrainingConfig.model_fields) - set(WORKLOAD)
    assert [s.field for s in TECHNIQUES] + settings == [f for f in TrainingConfig.model_fields if f not in WORKLOAD]
    assert len({s.order for s in REGISTRY}) == len(REGISTRY) and len({s.short for s in REGISTRY}) == len(REGISTRY)


@pytest.mark.parametrize("strategy", REGISTRY, ids=lambda s: s.field)
def test_strategy_contract(strategy):
    assert TrainingConfig.model_fields[strategy.field].default == strategy.default in strategy.choices
    assert set(strategy.searched or strategy.choices) <= set(strategy.choices)
    for ctx in CONTEXTS:
        check_ = Check()
        strategy.check(ctx, check_)  # never raises; reasons are plain sentences
        assert all(isinstance(x, str) and x for x in check_.infeasible + check_.warnings)
        draft = LedgerDraft()
        for s in REGISTRY[: REGISTRY.index(strategy) + 1]:
            s.apply(ctx, draft)
        assert all(row.term in TERMS and row.bytes >= 0 and row.shard >= 1 for row in draft.rows)
        for change, update in strategy.savers(ctx.config, ctx.hardware):
            assert change and set(update) <= set(TrainingConfig.model_fields)
            ctx.config.model_copy(update=update).model_validate(ctx.config.model_copy(update=update).model_dump())


@pytest.mark.parametrize("strategy", REGISTRY, ids=lambda s: s.field)
def test_every_value_is_one_record(strategy):
    """Each value of every technique is one typed record (strategies/base.py ``Choice``, or the
    technique's subclass of it), in vocabulary order, which the strategy's views (numerics,
    complexity, reserve, runtime_only, searched) derive from: a value missing its record, or a
    record on no rung of the ladder, fails here by name."""
    assert list(strategy.records) == list(strategy.enum)
    for value, record in strategy.records.items():
        assert isinstance(record, Choice), value
        assert record.help and len(record.help) <= 100 and record.help == record.help.strip(), value
        assert record.rung == EXACT or record.rung in LADDER, value
        assert record.complexity >= 0 and 0 <= record.reserve < 0.2, value
    assert strategy.records[strategy.default].searched and not strategy.records[strategy.default].runtime_only


def test_every_layout_field_is_decided_once():
    """Each PlanLayout field has one owner: a strategy's parallelism or storage hook, or the base
    (trainable parameters; parallel degrees of techniques not registered yet)."""
    ctx = CONTEXTS[0]
    owners = Counter()
    decided: dict = {"trainable_parameters": 0}
    for s in REGISTRY:
        if s.parallelism is not None:
            part = s.parallelism(ctx)
            owners.update(part.keys())
            decided |= part
    for s in REGISTRY:
        if s.storage is not None:
            part = s.storage(ctx, decided)
            owners.update(part.keys())
            decided |= part
    assert all(n == 1 for n in owners.values()), owners
    unregistered = {"trainable_parameters", "context_parallel",
                    "pipeline_parallel"}  # the base's, until a technique decides them
    assert set(owners) | unregistered == set(LAYOUT_FIELDS) and not set(owners) & (unregistered - {"trainable_parameters"})
    for ctx in CONTEXTS:
        assert resolve_layout(ctx, REGISTRY) == ctx.layout


def test_every_technique_is_a_flag_of_every_planning_command():
    group = typer.main.get_command(app)
    for name in PLANNING_COMMANDS:
        flags = {opt for p in group.commands[name].params for opt in p.opts}
        missing = [s.flag for s in TECHNIQUES if s.flag not in flags]
        assert not missing, f"planner {name} lacks {missing}"


def test_every_technique_is_a_field_of_every_request():
    probes = pytest.importorskip("planner.probes.command")
    for request in (EstimateRequest, SuggestRequest, SuggestJob, TuneRequest, CheckRequest, probes.ProbeRequest):
        missing = [s.field for s in TECHNIQUES if s.field not in request.model_fields]
        assert not missing, f"{request.__name__} lacks {missing}"


def _candidates(strategy, value):
    """(GPUs, configuration of QWEN with ``strategy`` at ``value``) on every GPU shape and base."""
    for gpus, base in itertools.product(GPUS, BASES):
        hardware = parse_gpus(gpus)
        fields_ = {s.field: s.default_on(hardware) for s in TECHNIQUES} | base | {strategy.field: value}
        yield gpus, TrainingConfig(**fields_, seq_len=512)


def _feasible(gpus: str, config: TrainingConfig) -> bool:
    return evaluate(resolve_model(QWEN), parse_gpus(gpus), config, skip_infeasible=True).feasible


def _example(strategy, value) -> tuple[str, TrainingConfig] | None:
    """GPUs and a feasible configuration of QWEN with ``strategy`` at ``value`` (what a search can rank)."""
    return next(((g, c) for g, c in _candidates(strategy, value) if _feasible(g, c)), None)


#: Values no plan can take: a check refuses them on every GPU and with every other choice
#: (DeepSpeed's parameter offload alone, strategies/offload.py PARAM_OFFLOAD_REFUSAL).
REFUSED_VALUES = {("offload", "params")}


def _plannable(strategy, value) -> bool:
    """Whether ``value`` can be planned; a value listed as refused must have no feasible example."""
    if (strategy.field, str(value)) in REFUSED_VALUES:
        assert _example(strategy, value) is None, f"{strategy.field} {value} is refused, yet a plan is feasible"
        return False
    return True


def _rendered(gpus: str, config: TrainingConfig) -> dict[str, str]:
    """Every text that summarises a plan's techniques, for one plan."""
    plan = estimate_config(resolve_model(QWEN), parse_gpus(gpus), config)
    suggestion = single_plan_result(plan)

    def capture(render, result) -> str:
        console = Console(record=True, width=400)
        render(result, console)
        return console.export_text()

    files = build_files(suggestion)
    row = TrialRow(number=0, state="COMPLETE", config=config.model_dump(mode="json"), fidelity="analytic", status="ok",
                   probed=True, predicted_peak_bytes=1, predicted_tokens_per_second=1.0, peak_bytes=1,
                   tokens_per_second=1.0, message="", feasible=True)
    tuned = TuneResult(study_name="s", storage="sqlite://", fidelity="analytic", probes=1, stopped="budget", best=row,
                       best_plan=plan, trials=[row], notes=[])
    from planner.engine.nothing_fits import nearest_words

    nearest = [nearest_words(plan)]
    out = {"estimate": capture(report.render_estimate, plan), "suggest": capture(report.render_suggest, suggestion),
           "PLAN.md": files["PLAN.md"], "launch.sh": files["launch.sh"], "tune": capture(render_tune, tuned),
           "nearest": "\n".join(nearest)}
    probe = pytest.importorskip("planner.render.probe")
    measured = SimpleNamespace(config=config, predicted_peak_bytes=1, measured_peak_bytes=1, predicted_step_seconds=1.0,
                               tokens_per_second=1.0, verdict="ok", status="ok", device="cpu", message="", where="")
    out["suggest --probe"] = capture(probe.render_probed, SimpleNamespace(suggestion=suggestion, probes=[measured],
                                                                          best_rank=1))
    return out


@pytest.mark.parametrize("strategy", TECHNIQUES, ids=IDS)
def test_every_technique_is_rendered_everywhere(strategy):
    """Two plans that differ only in this technique read differently in every summary."""
    pair = None
    for gpus, a in _candidates(strategy, strategy.choices[0]):
        others = [a.model_copy(update={strategy.field: v}) for v in strategy.choices[1:]]
        feasible = [c for c in [a, *others] if _feasible(gpus, c)]
        if len(feasible) >= 2:
            pair = gpus, feasible[0], feasible[1]
            break
    assert pair, f"no two feasible plans differ only in {strategy.field}"
    gpus, a, b = pair
    texts_a, texts_b = _rendered(gpus, a), _rendered(gpus, b)
    same = [where for where in texts_a if _strip(texts_a[where]) == _strip(texts_b[where])]
    assert not same, f"{strategy.field} ({getattr(a, strategy.field)} vs {getattr(b, strategy.field)}) is not shown in {same}"


def _strip(text: str) -> str:
    """The text without figures (memory and time differ between the two plans anyway): what is left
    differs only if the technique's value is written."""
    return "".join(ch for ch in text if not ch.isdigit() and ch not in ".,%")


@pytest.mark.parametrize("strategy", TECHNIQUES, ids=IDS)
def test_every_value_is_read_back_by_check(strategy, tmp_path):
    """For every value a search can rank: ``planner check`` on the launch files alone (no plan.json)
    reads the same configuration, every field from the files, and the same peak (tests/helpers.py
    round_trip)."""
    for value in filter(partial(_plannable, strategy), strategy.choices):
        example = _example(strategy, value)
        assert example is not None, f"{strategy.field} {value}: no feasible plan on {GPUS}"
        gpus, config = example
        plan = estimate_config(resolve_model(QWEN), parse_gpus(gpus), config)
        result = round_trip(plan, tmp_path / str(value).replace("+", "-"))
        assert not round_trip_errors(plan, result), (strategy.field, value, round_trip_errors(plan, result))


@pytest.mark.parametrize("strategy", TECHNIQUES, ids=IDS)
def test_runtime_only_choices_are_exactly_what_needs_runtime_json(strategy):
    """A plan's runtime.json says more than the libraries' defaults (and the sequence length) exactly
    when one of its choices is runtime_only: the one rule --launcher trainer ranks by."""
    from planner.core.launch_contract import RuntimeArgs

    for value in filter(partial(_plannable, strategy), strategy.choices):
        gpus, config = _example(strategy, value)
        runtime = json.loads(build_files(single_plan_result(
            estimate_config(resolve_model(QWEN), parse_gpus(gpus), config)))["runtime.json"])
        needs = {k: v for k, v in runtime.items() if k in RuntimeArgs.neutral() and v != RuntimeArgs.neutral()[k]}
        only = [f"{s.field} {getattr(config, s.field)}" for s in TECHNIQUES if getattr(config, s.field) in s.runtime_only]
        assert bool(needs) == bool(only), (strategy.field, value, needs, only)


def test_every_runtime_module_exists_and_has_a_hook():
    pytest.importorskip("torch")
    from importlib import import_module

    for s in REGISTRY:
        if s.runtime:
            module = import_module(s.runtime)
            hooks = [h for h in ("model_kwargs", "load_kwargs", "prepare", "build", "apply_fsdp") if hasattr(module, h)]
            assert hooks, f"{s.runtime} applies nothing"
    assert BY_FIELD["checkpointing"].runtime and BY_FIELD["precision"].runtime


@pytest.mark.parametrize("name", ["TrainingConfig", "TechniqueChoices", "TechniqueLists"])
def test_what_type_checkers_see_is_the_registrys_model(name):
    """strategies/static_types.py writes out the models the registry builds: the same fields in the
    same order, with the same types and defaults (pydantic checks the bounds at run time, on the
    registry's model)."""
    from planner import strategies
    from planner.strategies import request_fields, static_types

    built = getattr(strategies, name, None) or getattr(request_fields, name)
    written = getattr(static_types, name)
    assert list(written.model_fields) == list(built.model_fields)
    for field, info in built.model_fields.items():
        other = written.model_fields[field]
        assert other.annotation == info.annotation, field
        assert other.get_default(call_default_factory=True) == info.get_default(call_default_factory=True), field


#: Plans whose rows other strategies once rewrote: sharded, offloaded (DeepSpeed's host gradient
#: partition, FSDP2's CPU offload), FSDP2's padded chunks of an adapter's base, QLoRA's unsharded
#: state, fsdp-grad-op, and the backward peak at each of its instants.
REWRITTEN = [
    {"sharding": "zero2", "offload": "optimizer"},
    {"sharding": "zero3", "offload": "optimizer+params", "grad_accum": 2},
    {"sharding": "zero3", "offload": "params"},
    {"sharding": "fsdp", "offload": "optimizer+params", "precision": "bf16-pure"},
    {"sharding": "fsdp", "adapter": "qlora", "checkpointing": "full"},
    {"sharding": "fsdp", "adapter": "lora"},
    {"sharding": "fsdp-grad-op", "checkpointing": "selective"},
    {"sharding": "fsdp", "fsdp_version": 1, "optimizer": "adamw-8bit"},
    {"sharding": "fsdp", "attention": "eager", "micro_batch_size": 4, "seq_len": 4096},
    {"sharding": "ddp", "optimizer": "paged-adamw-8bit"},
]


def _rows(ev) -> list[tuple]:
    return sorted((r.term, r.label, r.bytes, r.location, sorted(r.phases), r.moment) for r in ev.draft.rows)


@pytest.mark.parametrize("update", REWRITTEN, ids=lambda u: "-".join(map(str, u.values())))
def test_rows_are_final_whatever_order_the_strategies_write_them(update, monkeypatch):
    """No strategy edits another's rows: a model state is placed by the layout as it is written
    (sharding's divisor, offload's location), the backward phase's peak is decided once and each
    writer writes its row only where that instant holds it. So writing the ledger in the reverse
    of the registry's order gives the same rows, the same peak and the same host memory."""
    from planner.engine import estimate

    hardware = parse_gpus("8xH100-80")
    for m in (resolve_model("meta-llama/Llama-3.1-8B"), resolve_model("mistralai/Mixtral-8x7B-v0.1")):
        config = TrainingConfig(**update)
        ahead = evaluate(m, hardware, config)
        monkeypatch.setattr(estimate, "REGISTRY", tuple(reversed(REGISTRY)))
        reverse = evaluate(m, hardware, config)
        monkeypatch.undo()
        assert _rows(reverse) == _rows(ahead) and len(ahead.draft.rows) > 10
        assert (reverse.peak, reverse.host) == (ahead.peak, ahead.host)
        assert reverse.step_seconds == pytest.approx(ahead.step_seconds, rel=1e-12)
