"""GRPO plans (strategies/method.py, strategies/generation.py): the rollout phase, vLLM's share of
each GPU, the reference model, the rows of a completion, and what is refused, as estimate,
suggest and check plan them."""

import re

import pytest

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.core.ledger import ALL_PHASES, Phase
from planner.cost import params, rollout

from helpers import FULL, run

MODEL, GPUS = "Qwen/Qwen2.5-1.5B", "8xH100-80"
BASE = dict(precision="bf16-mixed", checkpointing="full", sharding="zero2", batching="padded", seq_len=1536,
            completion_len=1024, method="grpo", micro_batch_size=4, grad_accum=4)


def rows(plan, *labels) -> dict[str, int]:
    return {r.label: r.bytes for r in plan.ledger if any(r.label.startswith(x) for x in labels)}


def test_a_completion_is_one_row_as_in_sft():
    """A micro-batch of k completions holds what SFT's k rows hold: every saved-activation row
    equal (same model, same techniques)."""
    grpo = run(MODEL, GPUS, generation="transformers", **BASE)
    sft = run(MODEL, GPUS, **(BASE | {"method": "sft", "completion_len": 512}))
    assert grpo.feasible and sft.feasible
    saved = ("saved activations", "final norm and head input")
    assert rows(grpo, *saved) == rows(sft, *saved) and rows(grpo, *saved)


def test_a_colocated_engine_holds_its_share_in_every_phase_or_only_while_generating():
    awake = run(MODEL, GPUS, generation="vllm-colocate", vllm_share=0.3, **BASE)
    asleep = run(MODEL, GPUS, generation="vllm-colocate-sleep", vllm_share=0.3, **BASE)
    memory = awake.hardware.gpu_memory_bytes
    engine = [r for r in awake.ledger if r.term == "generation_engine"]
    # the share of the GPU's total memory (vLLM's budget) and the CUDA graphs beyond it
    assert [r.bytes for r in engine] == [int(0.3 * memory) + rollout.CUDA_GRAPH_BYTES]
    assert set(engine[0].phases) == set(Phase)
    sleeping = {r.label: (r.bytes, frozenset(r.phases)) for r in asleep.ledger if r.term == "generation_engine"}
    assert sorted(sleeping.values(), key=lambda x: len(x[1])) == [
        (int(0.3 * memory), frozenset({Phase.ROLLOUT})), (rollout.CUDA_GRAPH_BYTES, frozenset(Phase))]
    # asleep, the training phases hold the graphs only: the forward peak is lower by the budget
    assert awake.phase_peaks[Phase.FORWARD] - asleep.phase_peaks[Phase.FORWARD] == int(0.3 * memory)


def test_the_rollout_holds_no_activations_or_gradients_of_training():
    plan = run(MODEL, GPUS, generation="vllm-colocate-sleep", **BASE)
    here = [r for r in plan.ledger if Phase.ROLLOUT in r.phases and set(r.phases) != set(ALL_PHASES)]
    assert {r.term for r in here} <= {"activations", "logits", "generation_engine", "allocator_reserve"}
    assert not any(r.label.startswith("saved activations") for r in here)
    persistent = sum(r.bytes for r in plan.ledger if set(r.phases) == set(ALL_PHASES) and not r.moment)
    awake = sum(r.bytes for r in here if r.term == "generation_engine")
    assert plan.phase_peaks[Phase.ROLLOUT] == persistent + awake  # generating: the engine beside the states
    sft = run(MODEL, GPUS, **(BASE | {"method": "sft"}))
    assert Phase.ROLLOUT not in sft.phase_peaks  # (no generation: the phase is not reported)


def test_transformers_generation_holds_a_kv_cache_of_the_whole_generation_batch():
    plan = run(MODEL, GPUS, generation="transformers", **BASE)
    [(_, kv)] = rows(plan, "generation: KV cache").items()
    spec = resolve_model(MODEL)
    generated = BASE["micro_batch_size"] * BASE["grad_accum"]  # steps_per_generation: the accumulation steps
    assert kv == rollout.transformers_kv_bytes(spec, generated, BASE["seq_len"], 2)
    assert kv == generated * BASE["seq_len"] * 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2


def test_the_generation_batch_sizes_the_rollout_and_num_iterations_spreads_it():
    """A generation batch of two steps (GRPOConfig generation_batch_size) holds a KV cache of twice
    the rows and generates every other step; TRL then scores each generation with the policy
    (``old_per_token_logps``: unaligned with the optimizer steps). num_iterations 2 generates every
    other step too, and scores each generation once for both passes."""
    from planner.strategies import PlanContext
    from planner.strategies.generation import generation_seconds
    from planner.strategies.method import forward_seconds

    spec, step = resolve_model(MODEL), BASE["micro_batch_size"] * BASE["grad_accum"]
    plans = {name: run(MODEL, GPUS, generation="transformers", **(BASE | extra)) for name, extra in (
        ("default", {}), ("two steps", {"generation_batch_size": 2 * step * 8}), ("mu 2", {"num_iterations": 2}))}
    assert all(p.feasible for p in plans.values())
    assert plans["default"].config.generation_batch_size == step * 8  # (the plan states TRL's default)
    for name, generated in (("default", step), ("two steps", 2 * step), ("mu 2", step)):
        [(_, kv)] = rows(plans[name], "generation: KV cache").items()
        assert kv == rollout.transformers_kv_bytes(spec, generated, BASE["seq_len"], 2), name
        ctx = PlanContext(spec, parse_gpus(GPUS), plans[name].config)
        [row] = [r for r in plans[name].time.rows if r.term == "generation"]
        assert row.seconds == pytest.approx(generation_seconds(ctx)[0] * (1 if name == "default" else 0.5)), name
        scoring = [r.seconds for r in plans[name].time.rows if r.label.startswith("GRPO scoring")]
        # one policy forward per micro-batch of each generation: per step, accumulation / num_iterations
        passes = 2 if name == "mu 2" else 1
        assert scoring == ([] if name == "default" else
                           [pytest.approx(forward_seconds(ctx) * BASE["grad_accum"] / passes, rel=0.05)]), name


@pytest.mark.parametrize("extra, words", [
    ({"generation_batch_size": 36}, "not a multiple of --num-generations"),
    ({"generation_batch_size": 48, "num_generations": 4}, "not a multiple of micro-batch 4 x 8 GPUs"),
])
def test_a_generation_batch_trl_refuses_is_refused(extra, words):
    plan = run(MODEL, GPUS, generation="transformers", **(BASE | extra))
    assert not plan.feasible and any(words in r for r in plan.reasons), plan.reasons


def test_suggest_refuses_a_batch_of_partial_groups_as_bad_input():
    """A generation batch (named, or the global batch) that is not whole groups is bad input naming
    the flag; a named one whole groups but not whole micro-batches of every GPU leaves only the
    sizes that divide it."""
    from planner.core.errors import PlannerInputError
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    base = dict(model=MODEL, gpus=GPUS, method=["grpo"], seq_len=1536, completion_len=1024)
    with pytest.raises(PlannerInputError, match="--generation-batch-size 36 must be whole groups"):
        suggest(SuggestRequest(**base, generation_batch_size=36))
    with pytest.raises(PlannerInputError, match="the global batch 12 must be whole groups"):
        suggest(SuggestRequest(**base, global_batch_size=12))
    plans = suggest(SuggestRequest(**base, generation_batch_size=8 * 8 * 3, global_batch_size=8 * 16)).plans
    assert plans and all((8 * 3) % p.config.micro_batch_size == 0 for p in plans)


def test_check_resolves_steps_per_generation_with_the_micro_batch_and_the_gpus(tmp_path):
    """A recipe's steps_per_generation is a generation batch of that many micro-batches of every
    GPU (GRPOConfig.__post_init__); with generation_batch_size too it is GRPOConfig's error, and so
    is a generation_batch_size of partial micro-batches or groups."""
    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    recipe = tmp_path / "grpo.yaml"
    recipe.write_text("num_generations: 8\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"
                      "max_prompt_length: 512\nmax_completion_length: 1024\nsteps_per_generation: 4\n"
                      "num_iterations: 2\n")
    result = check(CheckRequest(model=MODEL, gpus="4xH100-80", alternatives=0, training_args=recipe))
    assert (result.estimate.config.generation_batch_size, result.estimate.config.num_iterations) == (4 * 4 * 4, 2)
    assert "steps_per_generation = 4 x micro-batch 4 x 4 GPUs" in result.sources["generation_batch_size"]
    recipe.write_text(recipe.read_text() + "generation_batch_size: 64\n")
    with pytest.raises(PlannerInputError, match="can not be both configured"):
        check(CheckRequest(model=MODEL, gpus="4xH100-80", alternatives=0, training_args=recipe))
    recipe.write_text(recipe.read_text().replace("steps_per_generation: 4\n", "").replace(": 64", ": 36"))
    with pytest.raises(PlannerInputError) as e:  # 36 is neither 4 x 4 x k nor 8 x k: both, as GRPOConfig raises
        check(CheckRequest(model=MODEL, gpus="4xH100-80", alternatives=0, training_args=recipe))
    assert [p.split(" is not a multiple of ")[1].split(":")[0] for p in e.value.problems] == [
        "micro-batch 4 x 4 GPUs", "num_generations 8"]


def test_the_reference_model_only_with_beta_and_without_an_adapter():
    none = run(MODEL, GPUS, generation="vllm-colocate", **BASE)
    beta = run(MODEL, GPUS, generation="vllm-colocate", kl_beta=0.04, **BASE)
    lora = run(MODEL, GPUS, generation="vllm-colocate", kl_beta=0.04, adapter="lora", **BASE)
    assert not rows(none, "the reference model") and not rows(lora, "the reference model")
    [(_, held)] = rows(beta, "the reference model").items()
    assert held == params.total_parameters(resolve_model(MODEL)) * 2  # ZeRO-2 runs it at stage 0, 16-bit
    # beta adds the reference's scoring forward to the policy's (vLLM's importance sampling)
    scoring = {r.label: r.seconds for r in beta.time.rows if r.label.startswith("GRPO scoring")}
    assert "2 per micro-batch" in next(iter(scoring)) and beta.time.step_seconds > none.time.step_seconds


@pytest.mark.parametrize("change, words", [
    (dict(sharding="fsdp", fsdp_version=1), "not modelled"),
    (dict(loss="chunked"), "fused LM head"), (dict(batching="packed"), "never packs"),
    (dict(completion_len=1536), "leaves no prompt"), (dict(num_generations=3), "whole groups"),
    (dict(generation="none"), "generates its completions"), (dict(vllm_share=0.04), "cannot hold"),
])
def test_what_grpo_does_not_model_is_refused_with_the_reason(change, words):
    plan = run(MODEL, GPUS, **({"generation": "vllm-colocate"} | BASE | change))
    assert not plan.feasible and any(words in x for x in plan.reasons), plan.reasons


def test_generation_without_grpo_is_refused():
    plan = run(MODEL, GPUS, **(BASE | {"method": "sft", "generation": "transformers", "completion_len": 512}))
    assert not plan.feasible and any("--method grpo" in x for x in plan.reasons)


def test_an_unstated_share_is_the_smallest_that_holds_the_generation_batch_and_the_plan_states_it():
    plan = run(MODEL, GPUS, generation="vllm-colocate", **BASE)
    share = plan.config.vllm_share
    assert share > 0 and round(share / 0.05, 6) == round(share / 0.05)
    memory, spec = plan.hardware.gpu_memory_bytes, resolve_model(MODEL)
    generated = BASE["micro_batch_size"] * BASE["grad_accum"]
    fixed = rollout.engine_fixed_bytes(params.total_parameters(spec) * 2, spec, generated, 2)

    def holds(s):
        tokens = rollout.kv_capacity_tokens(int(s * memory), fixed, spec, 2)
        return rollout.concurrent_rows(tokens, BASE["seq_len"], generated) == generated

    assert holds(share) and not holds(share - 0.05)


def test_a_larger_share_decodes_more_rows_at_once_and_so_sooner():
    """Where the KV cache bounds the rows decoded at once, a larger share shortens the generation."""
    long = BASE | {"seq_len": 16384, "completion_len": 15360, "micro_batch_size": 8}
    small = run(MODEL, GPUS, generation="vllm-colocate-sleep", vllm_share=0.2, **long)
    large = run(MODEL, GPUS, generation="vllm-colocate-sleep", vllm_share=0.5, **long)
    seconds = [sum(r.seconds for r in p.time.rows if r.term == "generation") for p in (small, large)]
    assert seconds[0] > seconds[1] > 0


def test_a_server_plan_holds_no_engine_and_waits_for_the_weights_broadcast():
    server = run(MODEL, GPUS, generation="vllm-server", vllm_gpus=2, **BASE)
    assert not [r for r in server.ledger if r.term == "generation_engine"]
    [row] = [r for r in server.time.rows if r.term == "generation"]
    broadcast = params.total_parameters(resolve_model(MODEL)) * 2 / parse_gpus(GPUS).gpu.gpu_link_bytes_per_s
    assert row.seconds > broadcast and "per server engine" in row.note


def test_check_refuses_a_job_it_cannot_model_rather_than_calling_it_too_big():
    """open-r1's GRPO demo under its FSDP config: FSDP's gathers around generation are not
    modelled, so check refuses it (exit 2) with the reason, never "will not fit"."""
    from pathlib import Path

    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    root = Path(__file__).parent / "data" / "recipes" / "huggingface__open-r1" / "recipes"
    with pytest.raises(PlannerInputError) as e:
        check(CheckRequest(model=MODEL, gpus=GPUS, alternatives=0,
                           training_args=root / "Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml",
                           accelerate_config=root / "accelerate_configs/fsdp.yaml"))
    assert any("fsdp" in p and "not modelled" in p for p in e.value.problems)
    assert "cannot give this job a verdict" in e.value.hint


def test_vllm_splits_a_large_model_over_gpus_and_each_gpu_holds_its_shard():
    """Qwen2.5-32B's 65 GB of bf16 weights: the colocated engine's rule splits them four ways on
    H100s (16 GB each, at most a quarter of a GPU); each GPU's KV cache holds its share of the KV
    heads, and its group's rows (TRL's max_num_seqs: per_device x tp x steps_per_generation)."""
    spec = resolve_model("Qwen/Qwen2.5-32B")
    weights = params.total_parameters(spec) * 2
    assert rollout.tensor_parallel(weights, 80 * 10**9, 8, rollout.COLOCATED_WEIGHT_SHARE, spec) == 4
    assert rollout.kv_bytes_per_token(spec, 2, 4) * 4 == rollout.kv_bytes_per_token(spec, 2)
    assert rollout.kv_bytes_per_token(spec, 2, 16) == rollout.kv_bytes_per_token(spec, 2, 8)  # heads replicated
    plan = run("Qwen/Qwen2.5-32B", GPUS, **(BASE | {"generation": "vllm-colocate-sleep", "adapter": "lora",
                                                   "micro_batch_size": 2}))
    assert plan.config.vllm_tp == 4 and plan.feasible
    [row] = [r for r in plan.time.rows if r.term == "generation"]
    assert row.note.startswith(f"{2 * BASE['grad_accum'] * 4} rows over 4 GPUs")
    bad = run("Qwen/Qwen2.5-32B", GPUS, **(BASE | {"generation": "vllm-colocate", "adapter": "lora", "vllm_tp": 3}))
    assert not bad.feasible and any("tensor parallelism 3" in r for r in bad.reasons)


def test_under_zero3_the_rollout_gathers_what_trl_gathers():
    """transformers' generation gathers every parameter for the whole generation
    (ds3_gather_for_generation); the push to vLLM one parameter at a time, or every one with an
    adapter to merge; the scoring forwards gather as a training forward; the reference is
    partitioned like the policy."""
    every = params.total_parameters(resolve_model(MODEL))
    zero3 = BASE | {"sharding": "zero3"}
    hf = run(MODEL, GPUS, generation="transformers", **zero3)
    [row] = [r for r in hf.ledger if r.label.startswith("generation: every parameter gathered (ZeRO-3)")]
    assert row.bytes == every * 2 and row.moment.startswith("generating")
    full = run(MODEL, GPUS, generation="vllm-colocate-sleep", kl_beta=0.04, **zero3)
    assert rows(full, "the push to vLLM: the largest parameter")
    assert rows(full, "scoring forward: its gathers")
    [(_, reference)] = rows(full, "the reference model").items()
    assert reference == -(-every * 2 // 8)  # 16-bit, partitioned over the 8 GPUs
    lora = run(MODEL, GPUS, generation="vllm-colocate-sleep", adapter="lora", **zero3)
    [(_, merged)] = rows(lora, "the push to vLLM: every parameter gathered to merge").items()
    assert merged == every * 2
    assert any(r.label == "all-gather of the partitioned model for generation" for r in lora.time.rows)


def test_suggest_weighs_a_vllm_server_against_colocating_and_names_the_split():
    """On one machine with the generation left to it, suggest also plans a server on 1, 2 or 4 of
    its GPUs (training on the rest), answers with the fastest and lists every split's speed; where
    colocating cannot fit (Qwen2.5-32B LoRA on 4xH100-80), a server plan on fewer training GPUs."""
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    seven = suggest(SuggestRequest(model="Qwen/Qwen2.5-7B", gpus="8xH100-80", method=["grpo"], seq_len=1536,
                                   completion_len=1024))
    [line] = [r for r in seven.reasons if r.startswith("GRPO's generation, fastest first")]
    assert line.count("tokens/s") == 4 and all(f"a vLLM server on {k}, training on {8 - k}" in line for k in (1, 2, 4))
    # a split whose generation and matmuls alone are slower than colocating is given its bound, unsearched
    assert line.count("at most") == 3
    default = suggest(SuggestRequest(model="Qwen/Qwen2.5-7B", gpus="8xH100-80", method=["grpo"]))
    [line] = [r for r in default.reasons if r.startswith("GRPO's generation, fastest first")]
    assert re.search(r"a vLLM server on 2, training on 6 [\d,]+ tokens/s", line) and line.count("at most") == 2
    named = suggest(SuggestRequest(model="Qwen/Qwen2.5-7B", gpus="8xH100-80", method=["grpo"], seq_len=1536,
                                   completion_len=1024, generation=["transformers"]))
    assert not any(r.startswith("GRPO's generation") for r in named.reasons)
    big = suggest(SuggestRequest(model="Qwen/Qwen2.5-32B", gpus="4xH100-80", method=["grpo"], seq_len=1536,
                                 completion_len=1024, adapter=["lora"]))
    plan = big.plans[0]
    assert plan.config.generation == "vllm-server" and plan.hardware.num_gpus + plan.config.vllm_gpus == 4


def test_check_reads_a_server_job_on_one_machine_as_training_beside_the_server(tmp_path):
    """open-r1's layout: accelerate runs 7 processes on an 8-GPU machine, the eighth serving vLLM:
    check plans training on 7 GPUs and a one-GPU server, says where that came from, and no
    warning of a process count that differs from --gpus."""
    from pathlib import Path

    from planner.check import CheckRequest, check

    root = Path(__file__).parent / "data" / "recipes" / "huggingface__open-r1" / "recipes"
    accelerate = tmp_path / "zero2.yaml"
    accelerate.write_text((root / "accelerate_configs/zero2.yaml").read_text().replace("num_processes: 8",
                                                                                      "num_processes: 7"))
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text((root / "Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml").read_text() + "vllm_mode: server\n")
    result = check(CheckRequest(model=MODEL, gpus="8xH100-80", alternatives=0, training_args=recipe,
                                accelerate_config=accelerate))
    assert result.estimate.hardware.num_gpus == 7 and result.estimate.config.vllm_gpus == 1
    assert "the other GPUs serve vLLM" in result.sources["vllm_gpus"] and result.fits
    assert not any("num_processes" in w for w in result.warnings)


def test_under_fsdp2_each_decode_step_gathers_and_an_adapter_push_is_refused():
    """summon_full_params is a no-op for FSDP2: transformers' generation gathers unit by unit in
    every decode step's forward (memory of a forward's gathers, an all-gather of the model per
    step); merging an adapter into sharded weights for vLLM is not modelled (refused)."""
    fsdp = BASE | {"sharding": "fsdp"}
    hf = run(MODEL, GPUS, generation="transformers", **fsdp)
    assert hf.feasible, hf.reasons
    assert rows(hf, "generation: each step's forward gathers (FSDP2)")
    [comm] = [r for r in hf.time.rows if r.label == "all-gather of the partitioned model for generation"]
    one = run(MODEL, GPUS, generation="vllm-colocate", **fsdp)
    [once] = [r for r in one.time.rows if r.label == "all-gather of the partitioned model for generation"]
    assert comm.seconds == pytest.approx(BASE["completion_len"] * once.seconds)
    lora = run(MODEL, GPUS, generation="vllm-colocate", adapter="lora", **fsdp)
    assert not lora.feasible and any("not modelled" in r for r in lora.reasons)


@pytest.mark.parametrize("model, gpus, extra", [  # (CI: the defaults' case; the full suite: every one)
    pytest.param("Qwen/Qwen2.5-7B", "8xH100-80", {}, marks=FULL),
    pytest.param("Qwen/Qwen2.5-1.5B", "4xA100-80", {"adapter": ["lora", "qlora"]}, marks=FULL),
    pytest.param("Qwen/Qwen2.5-14B", "8xA100-40", {"kl_beta": 0.04}, marks=FULL),
    ("Qwen/Qwen2.5-7B", "8xH100-80", {"seq_len": 2048, "completion_len": 512}),  # (the defaults)
])
def test_a_server_split_is_never_faster_than_its_speed_bound_and_pruning_keeps_the_answer(model, gpus, extra):
    """Every fitting plan of each split's full search runs at most the split's bound (a step's
    tokens over the seconds of its generations and of the matmuls every plan runs), and suggest,
    which searches only the splits whose bound beats colocating, answers with what searching every
    split gives."""
    from planner.engine import suggest as engine
    from planner.engine.grpo_splits import server_splits, worth_searching
    from planner.schema.suggest import SuggestRequest

    request = SuggestRequest(model=model, gpus=gpus, method=["grpo"], **(dict(seq_len=1536, completion_len=1024) | extra))
    splits = server_splits(request, engine._resolved_space)
    assert [s.server_gpus for s in splits] == [k for k in (1, 2, 4) if 2 * k <= int(gpus.split("x")[0])]
    m = resolve_model(model)
    speeds, best = [], []  # (each split searched once: its best is _best_speed's, ranked from that search)
    for split in splits:
        space = engine._resolved_space(split.request)
        outcome = engine._search(split.request, m, split.request.hardware(), space)
        # each fitting combination's fastest size (planner/engine/search.py ``_scan_sized``)
        assert all(r.tokens_per_second <= split.bound * (1 + 1e-12) for r in outcome.fitting)
        speeds.append(outcome.fitting[0].tokens_per_second if outcome.fitting else None)
        plans = engine._rank(split.request, outcome).plans
        best.append(plans[0].tokens_per_second if plans else 0.0)
    assert any(s is not None for s in speeds)
    colocated = engine._suggest_one(request)
    best_colocated = colocated.plans[0].time.tokens_per_second if colocated.plans else 0.0
    answer = engine.suggest(request)
    every = max([best_colocated] + best)
    searched = max([best_colocated] + [b for s, b in zip(splits, best, strict=True)
                                       if worth_searching(best_colocated or None, s)])
    assert every == searched
    if every > best_colocated:
        assert answer.plans[0].config.generation == "vllm-server"
    else:
        assert answer.plans[0].config.generation != "vllm-server"
