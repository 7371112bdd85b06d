"""Adapter plans (LoRA, QLoRA, DoRA) end to end: the vocabulary and its flags, the estimate's
trainable parameters, properties of the memory and time model, the search's use of adapters only
when asked, and the round trip of the emitted files through ``planner check`` and the real peft /
transformers config classes."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog.models import resolve_model
from planner.cost import adapters, params
from planner.emit import build_files, single_plan_result
from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies import TrainingConfig
from planner.strategies import adapter as strategies_adapter

from helpers import FULL_SUITE, examples, round_trip, round_trip_errors, run

LLAMA = "meta-llama/Llama-3.1-8B"
DENSE = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B", "microsoft/Phi-3-mini-4k-instruct", "openai-community/gpt2",
         "google/gemma-2-9b", "Qwen/Qwen3-8B"]


def test_estimate_reports_the_adapters_trainable_parameters():
    plan = run(LLAMA, "1xA100-40", adapter="lora")
    assert plan.model.num_trainable_parameters == 41_943_040  # the published figure (peft, r 16, all-linear)
    assert plan.model.num_parameters == 8_030_261_248
    full = run(LLAMA, "1xA100-40")
    assert full.model.num_trainable_parameters == full.model.num_parameters


def needs(plan) -> int:
    """The tensors a plan holds: its GPU peak less the caching allocator's reserve (measured on an
    H100, an adapter's many small tensors keep a larger one: strategies/adapter.py ``reserve``),
    and the paged optimizer state spilled to the host (which full fine-tuning's paged state does
    when the GPU is full)."""
    reserve = sum(r.bytes for r in plan.ledger if r.term == "allocator_reserve")
    return plan.memory["peak"] - reserve + (plan.paged.spilled_bytes if plan.paged else 0)


@settings(max_examples=examples(200), deadline=None)
@given(model=st.sampled_from(DENSE), adapter=st.sampled_from(["lora", "qlora"]),
       precision=st.sampled_from(["bf16-mixed", "bf16-pure", "fp32", "fp16-mixed"]),
       checkpointing=st.sampled_from(["none", "full"]), attention=st.sampled_from(["sdpa", "eager"]),
       targets=st.sampled_from(["all-linear", "attention"]), rank=st.sampled_from([4, 16, 64]),
       mbs=st.integers(1, 8), seq=st.sampled_from([256, 1024, 4096]),
       optimizer=st.sampled_from(["adamw", "adamw-8bit", "paged-adamw"]))
def test_an_adapter_never_needs_more_memory_than_full_fine_tuning(model, adapter, precision, checkpointing, attention,
                                                                   targets, rank, mbs, seq, optimizer):
    """The same settings trained in full hold every tensor a LoRA or QLoRA plan holds, and more
    (the issue's property); QLoRA's weights are below LoRA's. Not DoRA: its output multiplies the
    trained magnitude by the base and the adapter outputs, so every wrapped matmul saves both
    (measured on real peft layers, planner.cost.adapters.adapter_layer_saved), and without
    checkpointing at long sequences that outgrows what the frozen weights free (Llama-3.1-8B,
    2 x 4096 tokens, all-linear: above full fine-tuning's peak). Nor LoRA's dropout,
    which saves a mask and a dropped copy of the input of every wrapped matmul
    (``test_lora_dropout_can_outgrow_full_fine_tuning``): the property holds with dropout 0."""
    dropout = 0.0
    shape = dict(precision=precision, checkpointing=checkpointing, attention=attention, micro_batch_size=mbs,
                 seq_len=seq, optimizer=optimizer)
    if model == "openai-community/gpt2":
        shape["seq_len"] = min(seq, 1024)
    if model == "google/gemma-2-9b":  # soft-capping: eager attention only
        shape["attention"] = "eager"
    full = run(model, "1xH100-80", **shape)
    tuned = run(model, "1xH100-80", **shape, adapter=adapter, lora_targets=targets, lora_rank=rank, lora_dropout=dropout)
    assert tuned.feasible, tuned.reasons
    assert needs(tuned) < needs(full)
    if adapter == "qlora":
        lora = run(model, "1xH100-80", **shape, adapter="lora", lora_targets=targets, lora_rank=rank, lora_dropout=dropout)
        weights = lambda p: sum(r.bytes for r in p.ledger if r.term == "weights")  # noqa: E731
        assert weights(tuned) < weights(lora)


def test_lora_dropout_can_outgrow_full_fine_tuning():
    """A fact the search must know: each wrapped matmul's dropout saves a mask and its own dropped
    input (traced on real peft layers), so at long sequences without checkpointing LoRA with
    dropout needs more than full fine-tuning of the same shape (Llama-3.1-8B, bf16-pure, AdamW,
    4 x 8192 tokens: 330 against 304 GiB), and the plan warns; dropout 0 (257 GiB) or checkpointing
    removes it."""
    shape = dict(precision="bf16-pure", checkpointing="none", micro_batch_size=4, seq_len=8192, optimizer="adamw")
    full = run(LLAMA, "1xH100-80", **shape)
    dropped = run(LLAMA, "1xH100-80", **shape, adapter="lora", lora_dropout=0.05)
    plain = run(LLAMA, "1xH100-80", **shape, adapter="lora", lora_dropout=0.0)
    assert needs(plain) < needs(full) < needs(dropped)
    assert any("--lora-dropout 0" in w for w in dropped.warnings)
    assert not any("--lora-dropout 0" in w for w in plain.warnings)


def test_the_frozen_base_is_its_parameters_in_the_load_dtype():
    """bf16-mixed LoRA: every base parameter in bf16, the adapters in fp32 (peft's
    autocast_adapter_dtype); QLoRA: the decoder linears in NF4 (planner.cost.adapters.nf4_bytes)."""
    m = resolve_model(LLAMA)
    lora = {r.label: r.bytes for r in run(LLAMA, "1xA100-40", adapter="lora").ledger}
    assert lora["frozen base weights (16-bit)"] == 2 * 8_030_261_248
    assert lora["adapter weights (fp32)"] == 4 * 41_943_040
    qlora = {r.label: r.bytes for r in run(LLAMA, "1xA100-40", adapter="qlora").ledger}
    assert qlora["frozen decoder linears (NF4, double quantization)"] + qlora["frozen embeddings, norms, head (16-bit)"] \
        == adapters.qlora_weight_bytes(m, True)
    assert "master weights (fp32)" not in lora


def test_frozen_weights_get_no_weight_gradient_time():
    """The backward matmuls of an adapter plan are the input gradients (the forward's FLOPs), not
    twice the forward; the adapters' own matmuls are a row of their own."""
    full = run(LLAMA, "1xA100-40", checkpointing="full", seq_len=1024)
    tuned = run(LLAMA, "1xA100-40", checkpointing="full", seq_len=1024, adapter="lora")
    rows = lambda p: {r.label: r.seconds for r in p.time.rows}  # noqa: E731
    f, t = rows(full), rows(tuned)
    fwd = "forward matmuls (bf16)"
    assert f["backward matmuls (bf16)"] == pytest.approx(2 * f[fwd])
    assert t["backward matmuls (bf16)"] == pytest.approx(t[fwd])
    assert tuned.time.step_seconds < full.time.step_seconds
    assert any(label.startswith("adapter matmuls") for label in t)


@pytest.mark.parametrize("adapter, config", [
    ("lora-int8", dict(sharding="zero3")), ("qlora", dict(sharding="zero2", kbit_prep="fp32")),
    ("lora", dict(checkpointing="selective")), ("lora", dict(precision="fp8-mixed")),
    ("dora", dict(sharding="zero3", offload="optimizer")), ("lora", dict(sharding="zero2", offload="optimizer")),
])
def test_what_is_not_modelled_yet_is_refused_with_a_reason(adapter, config):
    gpus = "2xH100-80" if "sharding" in config else "1xH100-80"
    plan = run(LLAMA, gpus, adapter=adapter, **config)
    assert not plan.feasible and plan.reasons and all(adapter in r for r in plan.reasons)


def test_fsdp_offload_of_an_adapter_plan_moves_its_whole_shard_to_the_host():
    """FSDP CPU offload (optimizer+params) of FSDP-QLoRA: every row the GPU held of the frozen base
    and the adapters' states moves to the host, byte for byte; the host-link copies carry that
    shard (not fp32 copies of the whole model) and the CPU steps the adapters only."""
    on, off = (run(LLAMA, "2xH100-80", adapter="qlora", sharding="fsdp", offload=o) for o in ("optimizer+params", "none"))
    assert on.feasible and off.feasible
    kept = {(r.term, r.label): r.bytes for r in off.ledger if r.term in ("weights", "gradients", "optimizer_states")}
    moved = {(r.term, r.label): r.bytes for r in on.ledger if r.location == "host"}
    assert moved == kept
    shard = sum(b for (term, _), b in moved.items() if term == "weights")
    full = run(LLAMA, "2xH100-80", sharding="fsdp", offload="optimizer+params")  # full fine-tuning's offload
    assert on.time.terms["cpu_optimizer_step"] < full.time.terms["cpu_optimizer_step"] / 50
    assert on.time.terms["offload"] < full.time.terms["offload"]
    assert shard < 0.3 * sum(r.bytes for r in full.ledger if r.location == "host" and r.term == "weights")


def test_fsdp_qlora_shards_the_packed_codes_and_keeps_the_state_on_every_rank():
    """FSDP-QLoRA (bnb_4bit_quant_storage bf16): on 8 ranks each GPU holds an eighth of the NF4
    codes and of the 16-bit embeddings, norms and head, and the whole quantization state; together
    the rows are the single-GPU QLoRA base; and the per-GPU base is below FSDP-LoRA's."""
    one, fsdp, lora = (run(LLAMA, g, adapter=a, sharding=s) for g, a, s in
                       (("1xH100-80", "qlora", "none"), ("8xH100-80", "qlora", "fsdp"), ("8xH100-80", "lora", "fsdp")))
    rows = lambda p: {r.label: r.bytes for r in p.ledger if r.label.startswith("frozen")}  # noqa: E731
    sharded, whole = rows(fsdp), rows(one)
    codes = sharded["frozen decoder linears: NF4 codes (16-bit quant storage)"]
    state = sharded["frozen decoder linears: NF4 quantization state"]
    assert codes * 8 + state == pytest.approx(whole["frozen decoder linears (NF4, double quantization)"], rel=1e-6)
    rest = "frozen embeddings, norms, head (16-bit)"
    assert sharded[rest] * 8 == pytest.approx(whole[rest], rel=1e-6)
    assert sum(sharded.values()) < sum(rows(lora).values())
    import torch
    import transformers

    runtime = json.loads(build_files(single_plan_result(fsdp))["runtime.json"])
    q = transformers.BitsAndBytesConfig(**runtime["quantization"])
    assert q.bnb_4bit_quant_storage == torch.bfloat16 and q.bnb_4bit_compute_dtype == torch.bfloat16
    assert "bnb_4bit_quant_storage" not in json.loads(build_files(single_plan_result(one))["runtime.json"])["quantization"]


def test_an_fsdp_qlora_job_round_trips_and_one_without_quant_storage_is_named(tmp_path):
    """The emitted FSDP-QLoRA files read back as the plan; the same job with the 4-bit weights in
    bitsandbytes' default uint8 storage (which accelerate leaves unsharded) reads with a warning
    saying what to set."""
    plan = run(LLAMA, "4xA100-40", adapter="qlora", sharding="fsdp", checkpointing="full")
    result = round_trip(plan, tmp_path)
    assert round_trip_errors(plan, result) == []
    assert not any("quant_storage" in w for w in result.warnings)
    runtime = tmp_path / "runtime.json"
    job = json.loads(runtime.read_text())
    del job["quantization"]["bnb_4bit_quant_storage"]
    runtime.write_text(json.dumps(job))
    from planner.check import CheckRequest, check

    again = check(CheckRequest(model=LLAMA, gpus="4xA100-40", job_dir=tmp_path, alternatives=0))
    assert any("bnb_4bit_quant_storage uint8" in w for w in again.warnings)


@pytest.mark.parametrize("sharding", ["zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op"])
def test_lora_is_planned_under_every_sharded_engine(sharding):
    """ZeRO and FSDP2 shard an adapter plan: the frozen base is divided only where the engine
    shards parameters (ZeRO-3, FSDP), and the step moves only the adapters' states."""
    ddp, plan = (run(LLAMA, "8xH100-80", adapter="lora", sharding=s) for s in ("ddp", sharding))
    assert plan.feasible, plan.reasons
    frozen = lambda p: sum(r.bytes for r in p.ledger if r.label.startswith("frozen base"))  # noqa: E731
    shards_weights = sharding in ("zero3", "fsdp", "fsdp-grad-op")
    assert frozen(plan) == pytest.approx(frozen(ddp) / 8 if shards_weights else frozen(ddp), rel=1e-3)
    step = next(r for r in plan.time.rows if r.term == "optimizer_step")
    assert float(step.note.split()[0]) < 1.0  # GiB: the adapters' states, not the 16 GB base


def test_moe_adapters_are_refused_with_a_reason():
    plan = run("mistralai/Mixtral-8x7B-v0.1", "1xH100-80", adapter="lora")
    assert not plan.feasible and "MoE" in plan.reasons[0]


def _suggest(**kw):
    return suggest(SuggestRequest(model=LLAMA, gpus="1xRTX4090-24", engine="exhaustive", **kw))


def test_the_search_uses_an_adapter_only_when_asked():
    assert all(p.config.adapter == "none" for p in _suggest().plans + _suggest().nearest)
    lora = _suggest(adapter=["lora"])
    assert lora.fits and all(p.config.adapter == "lora" for p in lora.plans)
    every = _suggest(adapter=["none", "lora", "qlora", "dora"])
    assert every.plans[0].config.adapter in ("lora", "qlora")  # full fine-tuning needs CPU offload here: slower


def test_settings_reach_every_candidate():
    result = _suggest(adapter=["lora"], lora_rank=8, lora_targets="attention", lora_dropout=0.0)
    best = result.plans[0]
    assert (best.config.lora_rank, best.config.lora_targets, best.config.lora_dropout) == (8, "attention", 0.0)
    assert best.model.num_trainable_parameters == adapters.adapter_parameters(resolve_model(LLAMA), "attention", 8)


@pytest.mark.parametrize("config", [
    dict(adapter="lora"), dict(adapter="qlora", lora_rank=8, lora_dropout=0.0),
    dict(adapter="dora", lora_targets="attention", lora_alpha=64), dict(adapter="lora", precision="bf16-pure"),
    dict(adapter="qlora", precision="fp16-mixed", checkpointing="full"),
])
def test_emitted_adapter_files_round_trip_through_check(tmp_path, config):
    plan = run(LLAMA, "1xA100-80", **config)
    assert plan.feasible, plan.reasons
    result = round_trip(plan, tmp_path)
    assert not round_trip_errors(plan, result), round_trip_errors(plan, result)


@pytest.mark.parametrize("family_model", ["meta-llama/Llama-3.1-8B", "openai-community/gpt2",
                                          "microsoft/Phi-3-mini-4k-instruct"])
@pytest.mark.parametrize("adapter, targets", [("lora", "all-linear"), ("qlora", "attention"), ("dora", "attention")])
def test_runtime_json_is_what_peft_and_transformers_build(family_model, adapter, targets):
    """runtime.json's ``lora`` and ``quantization`` are accepted by the real LoraConfig and
    BitsAndBytesConfig and say the plan: its rank, alpha, dropout, DoRA, NF4 with double
    quantization; and peft, wrapping the real model on the meta device with that LoraConfig,
    trains exactly the plan's parameters."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    import torch

    plan = run(family_model, "1xA100-80", adapter=adapter, lora_targets=targets, lora_rank=8)
    runtime = json.loads(build_files(single_plan_result(plan))["runtime.json"])
    lora = peft.LoraConfig(**runtime["lora"])
    assert (lora.r, lora.lora_alpha, lora.lora_dropout, lora.use_dora) == (8, 32, 0.05, adapter == "dora")
    if adapter == "qlora":
        q = transformers.BitsAndBytesConfig(**runtime["quantization"])
        assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant
    else:
        assert "quantization" not in runtime
    from planner.catalog.models import catalog

    config = transformers.AutoConfig.for_model(**catalog()[family_model].config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    wrapped = peft.get_peft_model(model, lora)
    assert sum(p.numel() for p in wrapped.parameters() if p.requires_grad) == plan.model.num_trainable_parameters


def test_bad_settings_are_refused_clearly():
    from typer.testing import CliRunner

    from planner.cli import app

    for args in (["--lora-rank", "0"], ["--lora-targets", "embeddings"], ["--lora-dropout", "2"], ["--adapter", "prefix"]):
        r = CliRunner().invoke(app, ["estimate", "--model", LLAMA, "--gpus", "1xA100-40", *args])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output


def test_adapter_any_lets_the_search_pick():
    from typer.testing import CliRunner

    from planner.cli import app

    r = CliRunner().invoke(app, ["suggest", "--model", LLAMA, "--gpus", "1xRTX4090-24", "--adapter", "any", "--json"])
    assert r.exit_code == 0, r.output[-2000:]
    out = json.loads(r.output)
    assert out["plans"][0]["config"]["adapter"] in ("lora", "qlora", "dora")


def test_trainable_tensors_cover_the_adapter_exactly():
    m = resolve_model(LLAMA)
    spec = adapters.AdapterSpec(targets="all-linear", rank=16, dropout=0.0)
    total = sum(t.numel * params.multiplicity(m, t) for t in adapters.trainable_tensors(m, spec))
    assert total == 41_943_040
    assert TrainingConfig().adapter == "none"


#: (model, plan, world, in CI): CI traces one of each adapter, one checkpointing and one FSDP
#: cell; the full suite every row.
TRACED = [("Qwen/Qwen2.5-0.5B", dict(adapter="lora", checkpointing="none"), 1, True),
          ("Qwen/Qwen2.5-0.5B", dict(adapter="lora", checkpointing="full"), 1, False),
          ("meta-llama/Llama-3.2-1B", dict(adapter="qlora", checkpointing="full"), 1, True),
          ("openai-community/gpt2", dict(adapter="dora", lora_targets="attention", precision="bf16-pure"), 1, False),
          ("openai-community/gpt2", dict(adapter="lora", sharding="fsdp"), 2, False),
          ("Qwen/Qwen2.5-0.5B", dict(adapter="dora", lora_targets="attention", sharding="fsdp-grad-op"), 2, True),
          ("meta-llama/Llama-3.2-1B", dict(adapter="lora", lora_targets="qv", precision="bf16-pure",
                                           adapter_dtype="fp32"), 1, False)]


@pytest.mark.heavy
def test_adapter_plans_against_the_traced_peft_model():
    """The peft-wrapped model traced on fake tensors (QLoRA's NF4 bytes computed) against the
    ledger, 2 layers x 2 x 1024 tokens, on one GPU and under FSDP2 at 2 ranks (a fake process
    group): model states to the byte, the step peak never more than 1 % under the trace (issue
    17's target), the backward phase within -10 % and +15 %.
    benchmarks/adapter_traced_matrix.py runs 112 cells."""
    pytest.importorskip("peft")
    from planner.catalog.models import catalog
    from planner.probes.compare import compare_result
    from planner.probes.traced import TraceRequest, trace_many

    configs = [(m, TrainingConfig(micro_batch_size=2, seq_len=1024, **c), w) for m, c, w, ci in TRACED
               if ci or FULL_SUITE]
    traces = trace_many([TraceRequest(config_json=catalog()[m].config, config=c, layers=2, world_size=w)
                         for m, c, w in configs], timeout=900)
    for (m, c, w), t in zip(configs, traces, strict=True):
        assert not isinstance(t, str), t
        terms = {x.term: x for x in compare_result(m, c, w, 2, t).terms}
        assert all(terms[k].analytic == terms[k].traced for k in ("parameters", "gradients", "optimizer_states")), terms
        assert terms["step_peak"].error >= -0.01, (m, c.adapter, terms["step_peak"])
        assert -0.10 <= terms["backward_phase"].error <= 0.15, (m, c.adapter, terms["backward_phase"])


def test_the_extras_a_plan_names_are_the_packages_extras():
    """PLAN.md's ``pip install 'llm-train-planner[...]'`` names only extras pyproject.toml defines (an
    adapter plan: peft, and for QLoRA bitsandbytes)."""
    import re
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    defined = extras["project"]["optional-dependencies"]
    doc = build_files(single_plan_result(run(LLAMA, "1xA100-40", adapter="qlora")))["PLAN.md"]
    named = [x for group in re.findall(r"llm-train-planner\[([^\]]*)\]", doc) for x in group.split(",")]
    assert {"adapters", "qlora"} <= set(named) <= set(defined)
    assert any(d.startswith("peft") for d in defined["adapters"]) and any(d.startswith("bitsandbytes") for d in defined["qlora"])


def test_full_fine_tuning_answers_say_what_an_adapter_would_give():
    """Without --adapter the answer stays full fine-tuning; where that is far slower (Llama-3.1-8B
    on one RTX 4090 needs FSDP + CPU offload, whose host optimizer step a batch of 16 sequences
    does not hide) one line says what LoRA/QLoRA would give; where it is not far slower (the
    default batch of 64 hides the host step) or on a GPU where full fine-tuning runs at full
    speed, nothing is said."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = _suggest(global_batch_size=16)
    option = result.adapter_option
    assert result.plans[0].config.adapter == "none" and option is not None
    assert option.adapter in ("lora", "qlora") and option.gain >= 0.25
    assert option.tokens_per_second == pytest.approx(result.plans[0].time.tokens_per_second * (1 + option.gain))
    assert _suggest(adapter=["lora"], global_batch_size=16).adapter_option is None
    hidden = _suggest()
    assert hidden.adapter_option is None and hidden.plans[0].config.offload != "none"
    roomy = suggest(SuggestRequest(model="Qwen/Qwen2.5-0.5B", gpus="1xH100-80"))
    assert roomy.adapter_option is None
    r = CliRunner().invoke(app, ["suggest", "--model", LLAMA, "--gpus", "1xRTX4090-24", "--global-batch-size", "16"])
    assert r.exit_code == 0 and f"--adapter {option.adapter} would give" in r.output


@pytest.mark.parametrize("model, gpus", [
    (LLAMA, "2xA100-80"),  # the winner needs paged AdamW (exact) to fit under DDP
    (LLAMA, "1xRTX4090-24"),  # QLoRA where full fine-tuning needs offload
    ("google/gemma-2-9b", "1xA100-40"),  # eager attention (no SDPA for gemma2), ZeRO-1
    ("meta-llama/Llama-3.1-70B", "1xA100-40"),  # no adapter plan fits: the full space is searched too
])
def test_the_adapter_line_from_the_exact_choices_is_the_full_searchs(model, gpus):
    """The one-line adapter option searches every technique's exact values first, then the exact
    optimizers, and the rest only when no exact plan fits; its plan is the one the full space
    ranks first."""
    from planner.engine import suggest as engine

    spec = resolve_model(model)
    request = SuggestRequest(model=model, gpus=gpus, seq_len=engine.default_seq_len(spec))
    hardware = request.hardware()
    outcome = engine._search(request, spec, hardware, engine._space(request, hardware.num_gpus, None))
    ranked = engine._rank(request, outcome).plans
    winner = engine._result(request, spec, hardware, outcome, ranked[0].item) if ranked else None
    bounded = engine._adapter_plan(request, spec, hardware, winner is not None)
    full = engine._adapter_plan(request, spec, hardware, winner is not None, bounded=False)
    assert bounded == full and engine._option(bounded, winner) == engine._option(full, winner)
    # suggest searches the exact values first whether or not a full plan fits (beside its main search)
    assert engine._adapter_plan(request, spec, hardware, True) == full
    assert (bounded is None) == (model == "meta-llama/Llama-3.1-70B")
    # the skip when no exact plan fits assumes AdamW runs wherever another optimizer does
    from planner.strategies.optimizer import CHOICES, Optimizer
    assert not CHOICES[Optimizer.ADAMW].refused_on and CHOICES[Optimizer.ADAMW].deepspeed_cpu


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
@pytest.mark.parametrize("adapter", ["qlora", "lora-int8"])
def test_a_model_built_from_its_config_is_quantized_as_the_plan_counts(tmp_path, model_type, adapter):
    """The measured probe builds a quantized base from a config (from_config cannot quantize):
    the runtime replaces the decoder linears by bitsandbytes NF4 (QLoRA) or int8 (lora-int8)
    layers in place. On the CPU, the quantized model's parameter and quantization-state bytes
    equal the planner's quantized base exactly (GPT-2's Conv1D layers included), and the
    peft-wrapped model trains a step."""
    pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    import torch
    import transformers

    from planner import runtime

    sizes = (dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512) if model_type == "llama"
             else dict(n_embd=256, n_layer=2, n_head=4, vocab_size=512, n_positions=64))  # GPT-2: Conv1D layers
    cfg = transformers.AutoConfig.for_model(model_type=model_type, **sizes)
    cfg.save_pretrained(tmp_path)
    config = TrainingConfig(adapter=adapter, lora_rank=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    assert any(("NF4" if adapter == "qlora" else "int8") in n for n in runtime.prepare(model, config,
                                                                                          runtime.Site.MEASURED))

    def stored(p):
        q = getattr(p, "quant_state", None)
        if getattr(p, "SCB", None) is not None:  # int8: the fp32 scale per row
            return p.numel() + p.SCB.numel() * 4
        if q is None:
            return p.numel() * p.element_size()
        nested = q.state2.absmax.numel() * 4 + q.state2.code.numel() * 4 + 4 if q.state2 is not None else 0
        return p.numel() * p.element_size() + q.absmax.numel() * q.absmax.element_size() + q.code.numel() * 4 + nested

    packed, rest = adapters.quantized_weight_parts(resolve_model(str(tmp_path / "config.json")), strategies_adapter.spec_of(config))
    assert sum(stored(p) for p in model.parameters()) == packed + 2 * rest
    wrapped, _ = runtime.wrap(model, config, runtime.Site.MEASURED)
    assert isinstance(wrapped, peft.PeftModel)
    ids = torch.randint(0, 512, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        wrapped(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in wrapped.parameters() if p.requires_grad)


def test_next_steps_keep_the_training_method(tmp_path):
    """After checking an adapter job, "search for faster plans" searches adapter plans (a plain
    suggest would plan full fine-tuning)."""
    from typer.testing import CliRunner

    from planner.cli import app

    out = tmp_path / "job"
    cli = CliRunner()
    r = cli.invoke(app, ["suggest", "--model", LLAMA, "--gpus", "1xA100-40", "--adapter", "qlora", "--lora-rank", "8",
                         "--out", str(out)])
    assert r.exit_code == 0, r.output[-1500:]
    r = cli.invoke(app, ["check", "--job-dir", str(out), "--model", LLAMA, "--gpus", "1xA100-40"])
    assert r.exit_code == 0, r.output[-1500:]
    assert "--adapter qlora --lora-rank 8" in r.output.strip().splitlines()[-1]


def test_a_frozen_head_and_embedding_make_no_gradients():
    """An adapter plan's head and embeddings are frozen: no head weight gradient after the loss,
    no embedding backward (the token ids need no gradient), so nothing but model states is alive
    when the backward ends. Full fine-tuning of the same tied-embedding model holds the two table
    gradients there (traced: a probe of Qwen2.5-0.5B QLoRA never enters the embeddings' backward)."""
    from planner.core.ledger import Location, Phase, resident

    def at_end(plan):
        return sum(r.bytes for r in resident(plan.ledger, Phase.BACKWARD_END, Location.GPU)
                   if r.term in ("activations", "logits"))

    shape = dict(seq_len=512, checkpointing="full")
    assert at_end(run("Qwen/Qwen2.5-0.5B", "1xA100-40", adapter="qlora", **shape)) == 0
    assert at_end(run("Qwen/Qwen2.5-0.5B", "1xA100-40", **shape)) > 0


def test_lora_over_an_int8_base_is_read_planned_and_emitted(tmp_path):
    """LoRA over an LLM.int8() base (``load_in_8bit``), as each reader names it (a TRL recipe's
    ModelConfig, axolotl's lora + load_in_8bit, LLaMA-Factory's quantization_bit 8, runtime.json's
    quantization): read as lora-int8; its plan holds int8 weights with fp32 row scales
    (half LoRA's 16-bit base and more than QLoRA's NF4), emits ``load_in_8bit`` and reads back as
    itself; FSDP, ZeRO-3 and bf16-pure are refused with a reason."""
    from planner.check import CheckRequest, check

    recipes = {"trl.yaml": "use_peft: true\nload_in_8bit: true\nbf16: true\n",
               "ax.yml": "base_model: x\nadapter: lora\nload_in_8bit: true\nlora_r: 8\nlora_alpha: 16\n",
               "lf.yaml": "model_name_or_path: x\nstage: sft\nquantization_bit: 8\nbf16: true\n"}
    for name, text in recipes.items():
        (tmp_path / name).write_text(text)
        r = check(CheckRequest(model=LLAMA, gpus="1xA100-80", training_args=tmp_path / name, alternatives=0))
        assert r.estimate.config.adapter == "lora-int8", name
    plans = {a: run(LLAMA, "1xA100-40", adapter=a, checkpointing="full") for a in ("lora", "lora-int8", "qlora")}
    weights = {a: sum(r.bytes for r in p.ledger if r.term == "weights") for a, p in plans.items()}
    assert weights["qlora"] < weights["lora-int8"] < weights["lora"]
    m = resolve_model(LLAMA)
    quantized = sum(t.numel * params.multiplicity(m, t) for t in params.model_tensors(m) if adapters.bnb_quantized(m, t))
    rows = {r.label: r.bytes for r in plans["lora-int8"].ledger}
    assert rows["frozen decoder linears (int8, fp32 scale per row)"] == quantized + 4 * sum(
        t.shape[0] * params.multiplicity(m, t) for t in params.model_tensors(m) if adapters.bnb_quantized(m, t))
    files = build_files(single_plan_result(plans["lora-int8"]))
    assert json.loads(files["runtime.json"])["quantization"] == {"load_in_8bit": True}
    assert round_trip_errors(plans["lora-int8"], round_trip(plans["lora-int8"], tmp_path / "plan")) == []
    for bad in (dict(sharding="fsdp"), dict(sharding="zero3"), dict(precision="bf16-pure")):
        refused = run(LLAMA, "2xA100-40", adapter="lora-int8", **bad)
        assert not refused.feasible and any("lora-int8" in x for x in refused.reasons), bad
