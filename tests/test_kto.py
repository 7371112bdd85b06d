"""KTO (strategies/method.py) against TRL's KTOTrainer itself, on the CPU: the rows of a
micro-batch and of its KL batch, the reference model, the no-grad forwards of the policy and of
the reference per micro-batch, and the one-row micro-batch TRL refuses."""

import warnings

import pytest

from planner.cost import preference

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

MAX_LENGTH = 64


def _trainer(path, tmp_path, rows: int = 2, peft_config=None, **kwargs):
    """TRL's KTOTrainer over the tiny model and eight unpaired completions longer than ``MAX_LENGTH``."""
    import datasets
    import transformers

    text = "the quick brown fox jumps over the lazy dog and runs far away " * 40
    data = [{"prompt": text[:30 + i], "completion": text[:900 - i], "label": i % 2 == 0} for i in range(8)]
    args = trl.KTOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=rows, max_length=MAX_LENGTH,
                         max_steps=1, report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False,
                         save_strategy="no", dataloader_num_workers=0, model_init_kwargs={"dtype": "float32"},
                         **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        return trl.KTOTrainer(model=str(path), args=args, train_dataset=datasets.Dataset.from_list(data),
                              processing_class=tokenizer, peft_config=peft_config)


def _context(tmp_path, **config):
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.strategies import PlanContext, TrainingConfig

    return PlanContext(resolve_model("Qwen/Qwen2.5-0.5B"), parse_gpus("1xA100-80"),
                       TrainingConfig(method="kto", batching="padded", seq_len=MAX_LENGTH, **config))


def test_a_micro_batch_runs_one_row_per_sample_and_a_kl_batch_as_wide(tiny, tmp_path):
    batch = next(iter(_trainer(tiny, tmp_path, 3).get_train_dataloader()))
    assert tuple(batch["input_ids"].shape) == (3, MAX_LENGTH)
    assert batch["KL_input_ids"].shape[0] == 3 and batch["KL_input_ids"].shape[1] <= MAX_LENGTH
    assert _context(tmp_path, micro_batch_size=3).config.rows_per_micro_batch == 3


@pytest.mark.parametrize("loss_type, precompute, adapter", [
    ("kto", False, False), ("apo_zero_unpaired", False, False), ("kto", True, False), ("kto", False, True)])
def test_the_no_grad_forwards_and_the_reference_are_trls(tiny, tmp_path, loss_type, precompute, adapter):
    """One micro-batch of TRL's training step: the policy's and the reference's forwards under
    no_grad (a reference copy, or the policy with its adapter disabled) are the plan's, and a
    reference copy is held exactly where the plan holds one."""
    from peft import LoraConfig

    from planner.strategies.method import no_grad_forwards, reference_kept

    peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if adapter else None
    trainer = _trainer(tiny, tmp_path, peft_config=peft_config, loss_type=loss_type,
                       precompute_ref_log_probs=precompute)
    policy = {"grad": 0, "no_grad": 0}
    reference = {"no_grad": 0}

    def counted(model, counts, disabled_means_reference: bool = False):
        forward = model.forward

        def wrapped(*a, **kw):
            target = counts
            if disabled_means_reference and getattr(model, "_planner_disabled", False):
                target = reference
            target["grad" if torch.is_grad_enabled() else "no_grad"] = target.get(
                "grad" if torch.is_grad_enabled() else "no_grad", 0) + 1
            return forward(*a, **kw)
        model.forward = wrapped

    counted(trainer.model, policy, disabled_means_reference=adapter)
    if trainer.ref_model is not None:
        counted(trainer.ref_model, reference)
    if adapter:  # the adapter-disabled policy is the reference: mark the forwards it runs disabled
        from trl.trainer import kto_trainer

        original = kto_trainer.use_adapter

        def marking(model, *a, **kw):
            class Marked:
                def __enter__(self):
                    trainer.model._planner_disabled = True
                    self.inner = original(model, *a, **kw)
                    return self.inner.__enter__()

                def __exit__(self, *exc):
                    trainer.model._planner_disabled = False
                    return self.inner.__exit__(*exc)
            return Marked()
        kto_trainer.use_adapter = marking
    try:
        trainer.train()
    finally:
        if adapter:
            kto_trainer.use_adapter = original
    ctx = _context(tmp_path, micro_batch_size=2, adapter="lora" if adapter else "none",
                   kto_loss="kto" if loss_type == "kto" else "apo-zero-unpaired",
                   dpo_reference="precomputed" if precompute else "model")
    assert (policy["no_grad"], reference.get("no_grad", 0)) == no_grad_forwards(ctx)
    assert policy["grad"] == 1
    assert (trainer.ref_model is not None) == reference_kept(ctx) == preference.reference_kept(adapter, precompute)


def test_a_one_row_micro_batch_is_refused_with_the_kl_estimate_as_trl_refuses_it(tiny, tmp_path):
    from planner.engine.estimate import check_config

    with pytest.raises(ValueError, match="batch size must be > 1"):
        _trainer(tiny, tmp_path, 1)
    _trainer(tiny, tmp_path, 1, loss_type="apo_zero_unpaired")  # (no KL estimate: one row is fine)
    assert "kto kl with one row" in check_config(_context(tmp_path, micro_batch_size=1)).codes
    assert not check_config(_context(tmp_path, micro_batch_size=1, kto_loss="apo-zero-unpaired")).codes
    assert not check_config(_context(tmp_path, micro_batch_size=2)).codes


def test_check_reads_a_kto_recipe_and_the_emitted_one_back(tmp_path):
    """A KTOConfig recipe (desirable_weight: a key only KTOConfig has) is planned as KTO with its
    loss and reference; its launch files are a KTOConfig TRL parses, and check reads them back."""
    import json

    from transformers import HfArgumentParser

    from planner.check import CheckRequest, check
    from planner.emit import build_files, single_plan_result

    recipe = tmp_path / "kto.yaml"
    recipe.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nper_device_train_batch_size: 4\nmax_length: 1024\n"
                      "desirable_weight: 1.33\nloss_type: apo_zero_unpaired\nprecompute_ref_log_probs: true\n")
    result = check(CheckRequest(gpus="1xA100-80", training_args=recipe, alternatives=0))
    c = result.estimate.config
    assert (str(c.method), str(c.kto_loss), str(c.dpo_reference), c.seq_len, str(c.batching)) == (
        "kto", "apo-zero-unpaired", "precomputed", 1024, "padded")
    assert result.sources["method"] == "kto.yaml: desirable_weight (a KTOConfig key)"
    assert not any(r.label.startswith("the reference model") for r in result.estimate.ledger)
    values = json.loads(build_files(single_plan_result(result.estimate))["training_args.json"])
    values |= {"bf16": False, "use_cpu": True, "output_dir": str(tmp_path)}  # (this machine has no bf16 GPU)
    (args,) = HfArgumentParser(trl.KTOConfig).parse_dict(values)
    assert (args.loss_type, args.precompute_ref_log_probs, args.max_length) == ("apo_zero_unpaired", True, 1024)
    assert args.train_sampling_strategy == "sequential"


def test_suggest_refuses_what_trl_refuses_for_every_candidate_as_bad_input():
    """A KTO request without a reference, or whose batch leaves only one-row micro-batches to the KL
    estimate, is bad input (the message names the flag), not a search where nothing fits."""
    from planner.core.errors import PlannerInputError
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    base = dict(model="Qwen/Qwen2.5-0.5B", gpus="1xA100-80", method=["kto"])
    with pytest.raises(PlannerInputError, match="no reference-free loss"):
        suggest(SuggestRequest(**base, dpo_reference="none"))
    with pytest.raises(PlannerInputError, match="micro-batches of at least 2"):
        suggest(SuggestRequest(**base, micro_batch_size=[1]))
    plan = suggest(SuggestRequest(**base, micro_batch_size=[1], kto_loss="apo-zero-unpaired")).plans[0]
    assert plan.config.micro_batch_size == 1
