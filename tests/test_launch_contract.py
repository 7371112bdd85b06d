"""The launch contract's round trip: ``planner check`` on the launch files of a ranked plan alone
(accelerate YAML, DeepSpeed JSON, Trainer arguments, runtime.json; not plan.json) reads back the same
configuration, every field from the files, and the same peak within 0.5 %.

Over 250 plans that ``planner suggest`` ranks: the top 25 (``--numerics any``, so approximations are
in the sample; each a distinct family: planner/engine/ranking.py) of ten searches across models, GPU
types and counts (1 to 16 GPUs, two nodes), some narrowed to one sharding engine so that DeepSpeed,
FSDP2 and DDP plans are all in the sample (CI: five of the searches, ``CI_SEARCHES``; the full
suite all ten). tests/test_strategies_contract.py covers every value of every strategy one by one.
"""

import pytest

from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies.loss import LIGER_LAYER_KERNELS_OFF

from helpers import FULL, round_trip, round_trip_errors

SEARCHES = [
    ("Qwen/Qwen2.5-0.5B", "1xH100-80", {}),
    ("Qwen/Qwen2.5-0.5B", "1xRTX4090-24", {}),
    ("meta-llama/Llama-3.1-8B", "8xA100-80", {}),
    ("meta-llama/Llama-3.1-8B", "8xA100-80", {"sharding": ["zero1", "zero2", "zero3"]}),
    ("meta-llama/Llama-3.2-1B", "2xL40S", {"sharding": ["ddp"]}),
    ("google/gemma-2-2b", "4xL40S", {}),
    ("openai-community/gpt2", "1xA100-40", {"optimizer": ["adafactor", "lion", "lion-8bit", "sgd"]}),
    ("mistralai/Mixtral-8x7B-v0.1", "8xH100-80", {"sharding": ["fsdp", "fsdp-grad-op"]}),
    ("meta-llama/Llama-3.1-70B", "2x8xH100-80", {}),
    ("microsoft/Phi-3-mini-4k-instruct", "2x8xA100-80", {"sharding": ["fsdp-hybrid", "zero3"], "offload": ["optimizer", "optimizer+params"]}),
]
TOP = 25


#: CI's searches: a consumer GPU, each engine narrowed (DeepSpeed, DDP, FSDP2, two nodes with offload)
CI_SEARCHES = (1, 3, 4, 7, 9)


@pytest.mark.parametrize("model, gpus, narrowed", [
    pytest.param(*s, id=f"{s[0].split('/')[1]}-{s[1]}", marks=() if i in CI_SEARCHES else FULL)
    for i, s in enumerate(SEARCHES)])
def test_ranked_plans_round_trip(tmp_path, model, gpus, narrowed):
    result = suggest(SuggestRequest(model=model, gpus=gpus, top=TOP, numerics="any", **narrowed))
    assert len(result.plans) == TOP, f"{model} on {gpus}: only {len(result.plans)} plans fit"
    failures = {}
    for i, plan in enumerate(result.plans):
        errors = round_trip_errors(plan, round_trip(plan, tmp_path / str(i)))
        if errors:
            failures[i] = errors
    assert not failures, failures


def test_launcher_trainer_ranks_only_what_the_standard_files_say():
    """--launcher trainer (the user's own Trainer script reads the standard files only): no ranked
    plan needs runtime.json, the output names what was left out, and asking for such a choice is
    bad input."""
    from planner.core.errors import PlannerInputError
    from planner.strategies import REGISTRY

    result = suggest(SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", top=50, launcher="trainer"))
    assert result.plans
    for plan in result.plans:
        assert not [s.field for s in REGISTRY if getattr(plan.config, s.field) in s.runtime_only], plan.config
    assert any("--launcher trainer: not ranked" in r and "adam-mini" in r for r in result.reasons)
    default = suggest(SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", top=50))
    assert any(getattr(p.config, s.field) in s.runtime_only for p in default.plans for s in REGISTRY)
    with pytest.raises(PlannerInputError, match="--launcher trainer"):
        suggest(SuggestRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", optimizer=["adam-mini"], launcher="trainer"))


def test_the_live_check_sees_liger_applied_as_the_trainer_applies_it():
    """``use_liger_kernel`` makes the Trainer call Liger's ``_apply_liger_kernel_to_instance``,
    which binds its forward to the model instance (``model.forward = MethodType(lce_forward,
    model)``; the class keeps transformers' own): the live check reads that as the chunked loss.
    Under bf16 mixed precision accelerate wraps that forward again; the check follows the wrappers.
    Liger's own call where it is installed
    (it needs Triton), else the same binding of a function from Liger's module."""
    import json
    import types
    from pathlib import Path

    import accelerate
    import transformers

    from planner.launch.live import _loss

    config = json.loads((Path(__file__).parent / "data" / "tiny-llama" / "config.json").read_text())
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert _loss(model) == "standard"
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError:
        def lce_forward(self, *args, **kwargs):
            raise AssertionError("not called")

        lce_forward.__module__ = "liger_kernel.transformers.model.llama"
        model.forward = types.MethodType(lce_forward, model)
    else:
        _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, **LIGER_LAYER_KERNELS_OFF)
    assert _loss(model) == "chunked"
    # bf16 mixed precision: accelerate wraps that forward in autocast and an fp32 output cast (a
    # trainer an earlier test built in this process set accelerate's process-wide state: reset it)
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    prepared = accelerator.prepare_model(model)
    assert prepared.forward.__func__.__module__.startswith("accelerate"), prepared.forward
    assert _loss(accelerator.unwrap_model(prepared)) == "chunked"


def test_the_trainer_applies_liger_s_fused_loss_alone(monkeypatch):
    """The emitted ``liger_kernel_config`` reaches Liger through transformers' own call
    (``integrations.liger.apply_liger_kernel``, what ``use_liger_kernel`` runs): every layer kernel
    off, the fused linear cross-entropy left to Liger's default (on), so the model keeps
    transformers' modules whose activations planner counts. Liger stood in by a recorder with the
    keyword parameters of its Llama patch function (it needs Triton)."""
    import json
    import sys
    import types

    import transformers.integrations.liger as hf_liger

    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.emit.files import build_files, single_plan_result
    from planner.engine.estimate import estimate_config
    from planner.strategies import TrainingConfig

    plan = estimate_config(resolve_model("meta-llama/Llama-3.1-8B"), parse_gpus("1xH100-80"),
                           TrainingConfig(loss="chunked", checkpointing="full"))
    args = json.loads(build_files(single_plan_result(plan))["training_args.json"])
    assert args["use_liger_kernel"] is True
    applied = {}

    def apply_liger_kernel_to_llama(rope=True, cross_entropy=False, fused_linear_cross_entropy=True, rms_norm=True,
                                    swiglu=True, model=None):
        applied.update(rope=rope, cross_entropy=cross_entropy, fused_linear_cross_entropy=fused_linear_cross_entropy,
                       rms_norm=rms_norm, swiglu=swiglu)

    def apply_to_instance(model, **kwargs):  # Liger's: keep the keys the family's function takes
        import inspect

        taken = inspect.signature(apply_liger_kernel_to_llama).parameters
        apply_liger_kernel_to_llama(model=model, **{k: v for k, v in kwargs.items() if k in taken})

    fake = types.ModuleType("liger_kernel.transformers")
    fake._apply_liger_kernel_to_instance = apply_to_instance
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    monkeypatch.setattr(hf_liger, "is_liger_kernel_available", lambda: True)
    model = types.SimpleNamespace(config=types.SimpleNamespace(model_type="llama"))
    monkeypatch.setattr(hf_liger, "PreTrainedModel", types.SimpleNamespace)
    hf_liger.apply_liger_kernel(model, args["liger_kernel_config"])
    assert applied == {"rope": False, "cross_entropy": False, "fused_linear_cross_entropy": True, "rms_norm": False,
                       "swiglu": False}
    assert set(LIGER_LAYER_KERNELS_OFF) >= {"rope", "rms_norm", "swiglu", "geglu", "layer_norm"}
