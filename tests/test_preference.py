"""DPO's memory terms (planner/cost/preference.py) against TRL's DPOTrainer itself, on real CPU
tensors: the paired batch, the reference model and the fused log-probability kernel's buffers."""

import inspect
import warnings
from importlib.metadata import version

import pytest

from planner.cost import preference

from helpers import TINY_TRL as TINY

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")

MAX_LENGTH = 64


def _trainer(path, tmp_path, pairs: int = 2, dtype: str = "float32", peft_config=None, **kwargs):
    """TRL's DPOTrainer over the tiny model and eight pairs longer than ``MAX_LENGTH`` tokens."""
    import datasets
    import transformers

    text = "the quick brown fox jumps over the lazy dog and runs far away " * 40
    rows = [{"prompt": text[:30 + i], "chosen": text[:900], "rejected": text[:800 - i]} for i in range(8)]
    args = trl.DPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=pairs, max_length=MAX_LENGTH,
                         max_steps=1, report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False,
                         save_strategy="no", dataloader_num_workers=0, model_init_kwargs={"dtype": dtype}, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        return trl.DPOTrainer(model=str(path), args=args, train_dataset=datasets.Dataset.from_list(rows),
                              processing_class=tokenizer, peft_config=peft_config)


def test_a_micro_batch_of_pairs_runs_two_rows_each_cut_at_max_length(tiny, tmp_path):
    for pairs in (1, 3):
        batch = next(iter(_trainer(tiny, tmp_path, pairs).get_train_dataloader()))
        assert tuple(batch["input_ids"].shape) == (preference.rows(pairs), MAX_LENGTH)


@pytest.mark.parametrize("dtype, element_bytes", [("float32", 4), ("bfloat16", 2)])
def test_the_reference_is_a_whole_copy_in_the_policys_dtype(tiny, tmp_path, dtype, element_bytes):
    trainer = _trainer(tiny, tmp_path, dtype=dtype)
    assert preference.reference_kept(adapter=False, precompute=False)
    ref, policy = trainer.ref_model, trainer.model
    assert ref is not None and ref is not policy
    parameters = sum(p.numel() for p in policy.parameters())
    held = sum(p.numel() * p.element_size() for p in ref.parameters())
    assert held == preference.reference_weight_bytes(parameters, element_bytes, preference.reference_divisor(False, 8))


def test_no_reference_with_an_adapter_or_precomputed_log_probs(tiny, tmp_path):
    from peft import LoraConfig

    adapter = _trainer(tiny, tmp_path, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    precomputed = _trainer(tiny, tmp_path, precompute_ref_log_probs=True)
    assert adapter.ref_model is None and not preference.reference_kept(adapter=True, precompute=False)
    assert precomputed.ref_model is None and not preference.reference_kept(adapter=False, precompute=True)
    assert "ref_chosen_logps" in next(iter(precomputed.get_train_dataloader()))


def test_the_installed_trl_takes_the_log_probability_path_the_gate_says():
    """From TRL 1.15 the loss runs the fused LM head; up to 1.14 it calls selective_log_softmax on
    the full logits."""
    installed = tuple(int(x) for x in version("trl").split(".")[:2])
    source = inspect.getsource(trl.DPOTrainer._compute_loss)
    assert ("fused_lm_head=True" in source) == preference.fused_logprobs(installed)
    assert ("selective_log_softmax" in source) != preference.fused_logprobs(installed)


def _allocations(fn) -> tuple[list[int], dict[str, tuple[int, int]]]:
    """The sizes of every CPU allocation ``fn`` makes (the profiler's allocator events), and the
    spans of its ``record_function`` marks."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in ("forward", "backward")}
    return [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.nbytes() > 0], spans


def test_the_fused_kernel_allocates_the_buffers_the_formulas_count(tiny):
    """The fused LM head's forward allocates no logits: its largest tensor is the projection buffer;
    its backward allocates the buffer again and the fp32 accumulators of the hidden states' and
    the head's gradients (the head trains)."""
    import transformers
    from torch.profiler import record_function

    if not preference.fused_logprobs(tuple(int(x) for x in version("trl").split(".")[:2])):
        pytest.skip("the installed TRL computes log-probabilities from full logits")
    from trl.trainer.utils import add_fused_lm_head

    from planner.catalog.models import resolve_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    add_fused_lm_head(model)
    rows = preference.rows(2)
    ids = torch.randint(0, TINY["vocab_size"], (rows, MAX_LENGTH))
    scored = rows * (MAX_LENGTH - 1)  # every position but each row's last (CPU: no Triton, no compaction)

    def step():
        with record_function("forward"):
            out = model(input_ids=ids, labels=ids, fused_lm_head=True)
        with record_function("backward"):
            out.log_probs.sum().backward()

    step()  # warm the kernels
    model.zero_grad(set_to_none=True)
    allocations, spans = _allocations(step)
    during = {name: [n for t, n in allocations if a <= t <= b] for name, (a, b) in spans.items()}
    buffer = preference.projection_buffer_bytes(scored, 4)
    logits = rows * MAX_LENGTH * TINY["vocab_size"] * 4
    assert max(during["forward"]) == buffer > logits  # the buffer is wider than this vocabulary's logits
    assert not [n for n in during["forward"] if logits <= n < buffer]  # and nothing logits-sized
    spec = resolve_model(str(tiny))
    backward = set(during["backward"])
    assert {buffer, scored * spec.hidden_size * 4, spec.vocab_size * spec.hidden_size * 4} <= backward
    assert preference.fused_backward_bytes(spec, scored, 4, head_trained=True) == (
        buffer + scored * spec.hidden_size * 4 + spec.vocab_size * spec.hidden_size * 4)
