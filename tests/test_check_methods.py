"""planner check refuses preference and RL recipes (planner/check/methods.py): the keys it reads
them by are those trainers' own, checked against the installed TRL's config dataclasses."""

import dataclasses
import importlib

import pytest

from planner.check.methods import REFUSAL, REFUSAL_HINT, TRL_MARKERS, framework_method, grpo_recipe, trl_method

trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

#: TRL 1.16's trainer configs beside SFTConfig, and a word the refusal of each must name.
CONFIGS = {"DPOConfig": "DPO", "GRPOConfig": "GRPO", "KTOConfig": "KTO", "RewardConfig": "reward model",
           "RLOOConfig": "RLOO", "trl.experimental.orpo:ORPOConfig": "ORPO", "trl.experimental.cpo:CPOConfig": "CPO",
           "trl.experimental.online_dpo:OnlineDPOConfig": "online DPO", "trl.experimental.gkd:GKDConfig": "GKD"}
#: Marker keys of older releases or of recipe scripts, which the installed TRL's configs lack.
NOT_IN_TRL_1_16 = {"max_prompt_length", "reward_funcs"}


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _config(name: str):
    if ":" in name:
        module, cls = name.split(":")
        return getattr(importlib.import_module(module), cls)
    return getattr(trl, name)


SFT = _fields(transformers.TrainingArguments) | _fields(trl.SFTConfig)


def test_every_marker_is_a_key_sft_recipes_cannot_hold():
    """Each marker the installed TRL knows is a field of a preference or RL config and of neither
    SFTConfig nor TrainingArguments (so an SFT recipe never holds it: TrlParser refuses it)."""
    known = set().union(*(_fields(_config(n)) for n in CONFIGS))
    for _, keys in TRL_MARKERS:
        for key in keys:
            assert key not in SFT, key
            assert (key in known) != (key in NOT_IN_TRL_1_16), key


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in ("DPOConfig", "GRPOConfig", "KTOConfig")])  # (planned)
def test_a_recipe_of_every_trl_trainer_config_is_refused_as_its_method(name):
    """A recipe holding every key of the config that SFT's lack is refused, naming its method."""
    recipe = dict.fromkeys(_fields(_config(name)) - SFT, 1)
    refusal = trl_method(recipe, "recipe.yaml")
    assert refusal and REFUSAL in refusal and CONFIGS[name] in refusal, (name, refusal)


def test_dpo_is_planned_when_its_own_keys_say_so_under_a_fused_head_trl(monkeypatch):
    """A recipe with a key only DPOConfig has is planned (strategies/method.py reads it) under TRL
    >= 1.15 or none installed; under an older TRL (full logits) it is refused; one whose keys DPO
    shares with ORPO (beta alone) is refused as ambiguous."""
    from planner.core import job as job_module
    from planner.strategies.method import DPO_ONLY

    own = dict.fromkeys(_fields(trl.DPOConfig) - SFT, 1)
    assert set(DPO_ONLY) & set(own) and trl_method(own, "dpo.yaml") is None
    for installed, refused in (((1, 14), True), ((1, 15), False), (None, False)):
        monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2, v=installed: v)
        assert bool(trl_method({"f_divergence_type": "reverse_kl"}, "dpo.yaml")) is refused
    assert "DPO or ORPO" in trl_method({"beta": 0.1}, "dpo.yaml")


def test_sft_recipes_and_sft_loss_types_are_not_refused():
    recipe = dict.fromkeys(_fields(trl.SFTConfig), 1)
    for loss in ("nll", "chunked_nll", ["dft"]):
        assert trl_method(recipe | {"loss_type": loss}, "sft.yaml") is None
    assert "sigmoid" in trl_method({"loss_type": "sigmoid"}, "dpo.yaml")


@pytest.mark.parametrize("llamafactory, d, refused", [
    (True, {"stage": "sft"}, False), (True, {"stage": "pt"}, False), (True, {}, False),
    (True, {"stage": "dpo", "pref_loss": "simpo"}, False),
    (True, {"stage": "dpo", "ref_model": "other/model", "ref_model_quantization_bit": 4}, True),
    (True, {"stage": "dpo", "pref_loss": "dpop"}, True), (True, {"stage": "kto"}, True), (True, {"stage": "rm"}, True),
    (True, {"stage": "ppo"}, True), (False, {}, False), (False, {"rl": None}, False), (False, {"rl": "grpo"}, False),
    (False, {"rl": "grpo", "trl": {"async_prefetch": True}}, True),
    (False, {"rl": "gdpo"}, True),
    (False, {"rl": "orpo"}, True), (False, {"reward_model": True}, True), (False, {"rl": "dpo"}, False),
    (False, {"rl": "ipo"}, False), (False, {"rl": "dpo", "dpo_padding_free": True}, True),
    (False, {"rl": "dpo", "dpo_use_liger_kernel": True}, True), (False, {"rl": "kto"}, False)])
def test_framework_stages_other_than_sft_are_refused(llamafactory, d, refused):
    """Refused: what planner does not model, each with its reason; axolotl's rl dpo / ipo run TRL's
    DPOTrainer and rl grpo its GRPOTrainer, which are planned (under a TRL whose trainers use the
    fused head)."""
    assert bool(framework_method(llamafactory, d, "job.yaml")) is refused


@pytest.mark.parametrize("framework, d, key", [
    ("axolotl", {"base_model": "m", "context_parallel_size": 2}, "context_parallel_size 2"),
    ("axolotl", {"base_model": "m", "rl": "grpo", "context_parallel_size": 4}, "context_parallel_size 4"),
    ("axolotl", {"base_model": "m", "sequence_parallel_degree": 4}, "sequence_parallel_degree 4"),
    ("axolotl", {"base_model": "m", "tensor_parallel_size": 2}, "tensor_parallel_size 2"),
    ("llamafactory", {"stage": "sft", "sequence_parallel_size": 8}, "sequence_parallel_size 8"),
    ("axolotl", {"base_model": "m", "context_parallel_size": 1}, None),
])
def test_framework_degrees_are_refused_not_planned_as_data_parallelism(framework, d, key):
    """A file that splits sequences or layers over GPUs with its framework's own implementation
    (ring-flash-attn, 360-LLaMA-Factory's attention, axolotl's TP) is refused with what it is; a
    degree of 1 is plain data parallelism; LLaMA-Factory's key is not called unknown."""
    from planner.check.frameworks import check_keys, translate

    problems, warnings = check_keys(framework, d, frozenset(), "job.yaml")
    assert not any("unknown" in x for x in problems + warnings)
    said = " ".join(translate(framework, d, "job.yaml").problems)
    if key is None:
        assert "parallel" not in said
    else:
        assert f"{key}: " in said and "not modelled yet" in said and "unknown" not in said


def test_axolotl_dpo_is_refused_under_a_trl_that_computes_full_logits(monkeypatch):
    from planner.core import job as job_module

    monkeypatch.setattr(job_module, "installed_release", lambda package, parts=2: (1, 14))
    refusal = framework_method(False, {"rl": "dpo"}, "job.yaml")
    assert refusal and "full logits" in refusal and "rl dpo" in refusal


def test_check_refuses_an_rloo_recipe_with_the_reason_and_what_to_do(tmp_path):
    """The command: exit 2, the method and its keys first, the next step last, no verdict."""
    import subprocess
    import sys

    recipe = tmp_path / "rloo.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 8\nnum_generations: 8\n"
                      "use_vllm: true\nmax_completion_length: 1024\nnormalize_advantages: true\n")
    r = subprocess.run([sys.executable, "-P", "-m", "planner", "check", "--training-args", str(recipe), "--gpus",
                        "1xH100-80"], capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "COLUMNS": "80",
                                                                           "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    text = r.stderr + r.stdout
    assert "num_generations, use_vllm" in text and "RLOO" in text and "FIT" not in text
    assert " ".join(text.split()).endswith(" ".join(REFUSAL_HINT.split()))


def test_a_grpo_recipe_is_planned_as_grpo_and_what_grpo_cannot_be_is_refused():
    """GRPOConfig's keys are GRPO (planned, vLLM's tensor parallelism and the generation batch too);
    RLOO's own keys are refused with the reason."""
    grpo = {"num_generations": 8, "use_vllm": True, "max_completion_length": 1024}
    assert grpo_recipe(grpo) and trl_method(grpo, "grpo.yaml") is None
    assert not grpo_recipe(grpo | {"normalize_advantages": True})
    assert not grpo_recipe(grpo | {"teacher_model_name_or_path": "t"})  # GKD's keys come first
    assert trl_method(grpo | {"vllm_tensor_parallel_size": 2}, "grpo.yaml") is None
    for extra in ({"steps_per_generation": 8}, {"generation_batch_size": 256}, {"num_iterations": 2}):
        assert trl_method(grpo | extra, "grpo.yaml") is None


def test_method_dpo_settles_only_the_keys_dpo_shares_with_orpo():
    shared = {"beta": 0.1, "max_prompt_length": 512}
    assert "DPO or ORPO" in trl_method(shared, "dpo.yaml")
    assert trl_method(shared, "dpo.yaml", named="dpo") is None
    assert "RLOO" in trl_method(shared | {"num_generations": 8, "reward_clip_range": [0, 1]}, "rloo.yaml", named="dpo")
    assert "a KTOConfig recipe, not --method dpo" in trl_method(shared | {"desirable_weight": 1.0}, "kto.yaml",
                                                                 named="dpo")
    assert trl_method(shared | {"desirable_weight": 1.0}, "kto.yaml") is None  # (planned as KTO)
