"""Every optimizer value is whole: one record (strategies/optimizer.py ``CHOICES``) that every layer
reads, checked here against the libraries that run it.

For each value: its rung is on the ladder; its Trainer ``optim`` name is one transformers knows and
builds the class the record names, which the live check recognises (the instance the Trainer
builds, with the Trainer's own keyword arguments); the runtime builds it and the live check
recognises that too; ``planner check`` reads its name back; the probes have a state rule for it;
the engines it refuses are named with a reason. And 4-bit AdamW's state rule is torchao's own
allocation, to the byte.
"""

import pytest

from planner.core.numerics import EXACT
from planner.cost.optimizer_states import torchao_4bit_states
from planner.strategies import LADDER
from planner.strategies.optimizer import CHOICES, TRAINER_READS, Optimizer, deepspeed_optimizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ENGINES = {"torch", "deepspeed", "fsdp1", "fsdp2"}


def _model():
    """One layer; a 2048 x 64 embedding: a tensor bitsandbytes pages (at least 100,000 elements)."""
    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config)


def _importable(impl) -> bool:
    try:
        __import__(impl.module)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("value", list(CHOICES), ids=str)
def test_every_optimizer_value_is_whole(value, tmp_path):
    from planner.launch.live import optimizer_name
    from planner.probes.model_setup import computed_state_bytes
    from planner.runtime.optimizer import CALLS, build

    choice = CHOICES[value]
    assert choice.rung == EXACT or choice.rung in LADDER, value
    assert {engine for engine, _ in choice.refused_on} <= ENGINES and all(why for _, why in choice.refused_on)
    assert choice.runtime_only == (choice.impl.trainer_optim is None), value  # no Trainer name: runtime.json
    model = _model()
    impls = [i for i in (choice.impl, choice.fsdp2) if i is not None]
    assert all(i.call in CALLS for i in impls), value  # the runtime knows how to call each class
    for impl in impls:
        if impl.trainer_optim is None:  # the runtime builds it from runtime.json
            continue
        assert TRAINER_READS[impl.trainer_optim] == value  # planner check reads the name it writes
        if not _importable(impl):
            continue
        args = transformers.TrainingArguments(output_dir=str(tmp_path), optim=impl.trainer_optim, report_to=[])
        cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)
        params = [p for p in model.parameters() if p.requires_grad]
        built_by_trainer = cls(params, **kwargs)
        assert optimizer_name(built_by_trainer) == value, (impl.trainer_optim, cls)
    for fsdp2, impl in ((False, choice.impl), (True, choice.impl_for(True))):
        if not _importable(impl):
            continue
        built = build(str(value), model, model.config, fsdp2=fsdp2)
        assert optimizer_name(built) == value, (value, type(built))
    if choice.deepspeed:  # planner check reads the block planner writes (torch's AdamW: foreach unless fused)
        params = {"torch_adam": True} | ({} if choice.foreach else {"fused": True})
        assert deepspeed_optimizer({"type": choice.deepspeed, "params": params}) == value
    config = type("C", (), {"optimizer": value})()
    dense, paged = computed_state_bytes(model, config)
    assert (dense + paged > 0) == (value != Optimizer.SGD)  # SGD with momentum 0 keeps none
    assert (paged > 0) == choice.paged


def _torchao_state_bytes(optimizer, p) -> int:
    """Bytes torchao allocates for one parameter's two AdamW states (its own ``_new_buffer``)."""
    total = 0
    for signed in (True, False):  # exp_avg, exp_avg_sq
        state = optimizer._new_buffer(p, signed)
        parts = [getattr(state, a) for a in getattr(state, "tensor_attrs", [])] or [state]
        total += sum(t.numel() * t.element_size() for t in parts)
    return total


@pytest.mark.parametrize("shape,dtype", [((64, 64), torch.float32), ((256, 96), torch.float32),
                                         ((100, 80), torch.float32), ((1000,), torch.float32),
                                         ((128, 64), torch.bfloat16), ((4097,), torch.bfloat16)])
def test_4bit_states_are_torchaos_own(shape, dtype, tmp_path):
    """adamw-4bit as the Trainer builds it (``adamw_torch_4bit``: torchao AdamW4bit, block 256):
    quantized tensors (at least 4096 elements, whole blocks) and the full-precision fallback, in the
    parameter's dtype."""
    pytest.importorskip("torchao")
    p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), optim="adamw_torch_4bit", report_to=[])
    cls, kwargs = transformers.Trainer.get_optimizer_cls_and_kwargs(args, None)
    optimizer = cls([p], **kwargs)
    numel = p.numel()
    assert torchao_4bit_states(numel, 2, p.element_size()) == _torchao_state_bytes(optimizer, p)


def test_the_ladder_takes_4bit_states_only_when_8bit_does_not_fit():
    """4-bit states sit between 8-bit states and fp8 on the ladder: with room for 8-bit states the
    answer keeps them; at a context where only 4-bit states fit, the answer is 4-bit and says so."""
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    assert [r.name for r in LADDER[:3]] == ["8-bit-states", "4-bit-states", "fp8"]
    # (checkpoint offload, searched from 16,384 tokens, would fit 8-bit states at the long context)
    ask = dict(model="meta-llama/Llama-3.2-1B", gpus="1xA10G-24", sharding=["none"], offload=["none"],
               optimizer=["adamw", "adamw-8bit", "adamw-4bit"], precision=["bf16-mixed"], checkpoint_offload=["none"])
    assert suggest(SuggestRequest(**ask, seq_len=8192)).plans[0].config.optimizer == "adamw-8bit"
    long = suggest(SuggestRequest(**ask, seq_len=26624))
    assert long.plans[0].config.optimizer == "adamw-4bit"
    assert not any(p.config.optimizer == "adamw-8bit" for p in long.plans)
    from planner.strategies import approximation_words

    assert approximation_words(long.plans[0].config) == ["optimizer adamw-4bit (4-bit optimizer states)"]
