"""DPO plans (strategies/method.py): the paired batch, the reference model, TRL's fused log-probability
head in place of the logits, and what is refused, as estimate, suggest and check plan them."""

import json

import pytest

from planner.cost import preference

from helpers import run

MODEL, GPUS = "meta-llama/Llama-3.2-1B", "1xH100-80"
BASE = dict(precision="bf16-mixed", checkpointing="full", batching="padded", seq_len=1024)


def rows(plan, *labels) -> dict[str, int]:
    return {r.label: r.bytes for r in plan.ledger if any(r.label.startswith(x) for x in labels)}


def test_a_pair_runs_two_sequences_through_every_activation_row():
    """A micro-batch of k pairs holds the activations of 2k sequences: every saved-activation row
    of DPO at k equals SFT's at 2k (same model, same techniques)."""
    dpo, sft = run(MODEL, GPUS, method="dpo", micro_batch_size=2, **BASE), run(MODEL, GPUS, micro_batch_size=4, **BASE)
    assert dpo.feasible and sft.feasible
    saved = ("saved activations", "final norm and head input")
    assert rows(dpo, *saved) == rows(sft, *saved) and rows(dpo, *saved)
    assert dpo.config.tokens_per_micro_batch == sft.config.tokens_per_micro_batch  # (both sequences of a pair)


def test_the_reference_model_is_a_whole_frozen_copy_unless_an_adapter_or_precomputation():
    m = run(MODEL, GPUS, method="dpo", **BASE)
    n = m.model.num_parameters
    [(label, held)] = rows(m, "the reference model").items()
    assert held == preference.reference_weight_bytes(n, 4, 1)  # bf16-mixed: the policy's fp32 weights
    ddp = run(MODEL, "2xH100-80", method="dpo", sharding="ddp", **BASE)
    assert rows(ddp, "the reference model") == {label: held}  # whole on each GPU
    # ZeRO-2 runs it at stage 0, whole on each GPU, in the 16-bit dtype DeepSpeed casts its modules to
    zero2 = run(MODEL, "2xH100-80", method="dpo", sharding="zero2", **BASE)
    assert rows(zero2, "the reference model") == {label: preference.reference_weight_bytes(n, 2, 1)}
    assert not rows(run(MODEL, GPUS, method="dpo", adapter="lora", **BASE), "the reference model")
    pre = run(MODEL, GPUS, method="dpo", dpo_reference="precomputed", **BASE)
    assert not rows(pre, "the reference model", "reference forward")
    assert m.memory["peak"] > pre.memory["peak"] and m.time.step_seconds > pre.time.step_seconds


def test_no_logits_the_fused_head_instead():
    """TRL >= 1.15 never materialises the logits: no cross-entropy row, the fused head's moment
    instead, and at a long context DPO holds far less at its loss than SFT at the same rows."""
    dpo = run(MODEL, GPUS, method="dpo", micro_batch_size=1, **(BASE | {"checkpointing": "full", "seq_len": 8192}))
    sft = run(MODEL, GPUS, micro_batch_size=2, **(BASE | {"checkpointing": "full", "seq_len": 8192}))
    labels = [r.label for r in dpo.ledger]
    assert not any("log-softmax" in x or "logits' hole" in x for x in labels)
    fused = rows(dpo, "TRL's fused LM head")
    assert fused and max(fused.values()) < min(v for k, v in rows(sft, "start of backward", "loss forward").items())


@pytest.mark.parametrize("change", [dict(sharding="fsdp", fsdp_version=1), dict(loss="chunked"),
                                    dict(batching="packed"), dict(batching="padded-max")])
def test_what_dpo_does_not_model_is_refused_with_the_reason(change):
    gpus = "2xH100-80" if "sharding" in change else GPUS
    plan = run(MODEL, gpus, method="dpo", **(BASE | change))
    field, value = list(change.items())[-1]  # (FSDP: its version is what is refused)
    assert not plan.feasible and any(f"dpo with {field} {value}" in r or f"dpo with {value} {field}" in r
                                     for r in plan.reasons), plan.reasons


def test_under_zero3_the_reference_is_partitioned_and_its_forward_gathers():
    """prepare_deepspeed partitions the reference under ZeRO-3 as the policy; its forward, beside
    the policy's saved activations, gathers the head and a prefetch bucket as a training forward."""
    zero3 = run(MODEL, "2xH100-80", method="dpo", sharding="zero3", **BASE)
    assert zero3.feasible, zero3.reasons
    n = zero3.model.num_parameters
    [(_, held)] = rows(zero3, "the reference model").items()
    assert held == preference.reference_weight_bytes(n, 2, preference.reference_divisor(True, 2))
    [gathered] = [r for r in zero3.ledger if r.label.startswith("reference forward: its gathers")]
    assert gathered.moment == "the reference forward"
    assert any(r.label == "all-gather of the reference forward" for r in zero3.time.rows)


def test_suggest_plans_dpo_only_when_named():
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    plain = suggest(SuggestRequest(model=MODEL, gpus="8xH100-80"))
    dpo = suggest(SuggestRequest(model=MODEL, gpus="8xH100-80", method=["dpo"]))
    assert {p.config.method for p in plain.plans} == {"sft"}
    assert {p.config.method for p in dpo.plans} == {"dpo"} and dpo.plans[0].config.batching == "padded"
    assert {p.config.sharding for p in dpo.plans} <= {"none", "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "fsdp-hybrid"}


def test_check_plans_a_trl_dpo_recipe_as_dpo(tmp_path):
    """A recipe with a key only DPOConfig has (here f_divergence_type) is checked as DPO: its pairs,
    padded, and its reference."""
    from planner.check import CheckRequest, check

    recipe = tmp_path / "dpo.json"
    recipe.write_text(json.dumps({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True,
                                  "max_length": 1024, "beta": 0.1, "f_divergence_type": "reverse_kl",
                                  "gradient_checkpointing": True}))
    result = check(CheckRequest(model=MODEL, gpus=GPUS, training_args=recipe, alternatives=0))
    c = result.estimate.config
    assert (c.method, c.batching, c.dpo_reference, c.micro_batch_size) == ("dpo", "padded", "model", 2)
    assert "f_divergence_type" in result.sources["method"]
    assert rows(result.estimate, "the reference model")


def test_suggest_states_the_global_batch_in_pairs_and_sequences():
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    r = suggest(SuggestRequest(model=MODEL, gpus="8xH100-80", method=["dpo"], global_batch_size=64, seq_len=1024))
    assert any(a.startswith("global batch 64 pairs = 128 seq = 131,072 tokens") for a in r.assumptions), r.assumptions


def test_the_reference_forward_over_a_4bit_base_dequantizes_it_again():
    """With QLoRA the reference is the adapter-disabled 4-bit base: its forward dequantizes every
    NF4 weight as the policy's forward does (one more pass than LoRA's reference forward)."""
    from planner.catalog.models import resolve_model
    from planner.catalog.gpus import parse_gpus
    from planner.strategies import PlanContext, TrainingConfig
    from planner.strategies.adapter import nf4_dequantize_seconds

    def reference_seconds(plan):
        [row] = [r for r in plan.time.rows if r.label == "DPO reference forward (no_grad)"]
        return row.seconds

    lora = run(MODEL, GPUS, method="dpo", adapter="lora", **BASE)
    qlora = run(MODEL, GPUS, method="dpo", adapter="qlora", **BASE)
    ctx = PlanContext(resolve_model(MODEL), parse_gpus(GPUS), TrainingConfig(method="dpo", adapter="qlora", **BASE))
    assert reference_seconds(qlora) - reference_seconds(lora) == pytest.approx(nf4_dequantize_seconds(ctx), rel=1e-9)


def test_a_dpo_recipes_evaluation_is_said_in_pairs_through_the_fused_head(tmp_path):
    from planner.check import CheckRequest, check

    recipe = tmp_path / "dpo.json"
    recipe.write_text(json.dumps({"per_device_train_batch_size": 2, "bf16": True, "max_length": 512,
                                  "f_divergence_type": "reverse_kl", "eval_strategy": "steps",
                                  "per_device_eval_batch_size": 4}))
    result = check(CheckRequest(model=MODEL, gpus=GPUS, training_args=recipe, alternatives=0))
    [said] = [w for w in result.warnings if "evaluation is not planned" in w]
    assert "4 pairs (8 sequences" in said and "no logits" in said


def test_the_launch_reads_preference_pairs_and_refuses_bad_ones_with_the_line(tmp_path):
    from planner.core.errors import PlannerInputError
    from planner.launch.data import preference_pairs

    good = tmp_path / "pairs.jsonl"
    good.write_text('{"prompt": "p", "chosen": "c", "rejected": "r", "id": 1}\n\n')
    assert preference_pairs(str(good), 64, 1) == [{"prompt": "p", "chosen": "c", "rejected": "r"}]
    for text, said in (('{"prompt": "p"\n', "line 1 is not JSON"),
                       ('{"prompt": "p", "chosen": "c"}\n', "line 1 needs fields prompt, chosen, rejected"),
                       ('{"prompt": [{"role": "user", "content": "p"}], "chosen": "c", "rejected": "r"}\n',
                        "all strings or all lists of messages")):
        good.write_text(text)
        with pytest.raises(PlannerInputError, match=said):
            preference_pairs(str(good), 64, 1)
    with pytest.raises(PlannerInputError, match="a JSONL file of preference pairs"):
        preference_pairs(str(tmp_path / "pairs.txt"), 64, 1)
    assert len(preference_pairs("sample", 64, 5)) == 5
    chat = [{"role": "user", "content": "p"}]
    good.write_text(json.dumps({"prompt": chat, "chosen": [{"role": "assistant", "content": "c"}],
                                "rejected": [{"role": "assistant", "content": "r"}]}) + "\n")
    assert preference_pairs(str(good), 64, 1)[0]["prompt"] == chat  # (TRL renders them with the chat template)


def test_under_fsdp2_the_reference_is_one_unit_gathered_whole_by_its_forward():
    """TRL's prepare_fsdp shards the reference with one fully_shard of the whole model: partitioned
    at rest, all of it gathered by its forward (beside the policy's saved activations)."""
    plan = run(MODEL, "2xH100-80", method="dpo", sharding="fsdp", **BASE)
    assert plan.feasible, plan.reasons
    n = plan.model.num_parameters
    [(_, held)] = rows(plan, "the reference model").items()
    assert held == preference.reference_weight_bytes(n, 4, 2)  # (its stored dtype, over the 2 GPUs)
    [whole] = [r for r in plan.ledger if r.label.startswith("reference forward: the whole reference")]
    assert whole.moment == "the reference forward" and whole.bytes >= n * 2
    fsdp1 = run(MODEL, "2xH100-80", method="dpo", sharding="fsdp", fsdp_version=1, **BASE)
    assert not fsdp1.feasible and any("fsdp_version 1" in r for r in fsdp1.reasons)
