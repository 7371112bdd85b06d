"""Tensor parallelism's cost rows (planner/cost/tensor.py, planner/cost/activations.py ``tp``)
against transformers' own sharding, on fake tensors over a fake process group of T ranks
(planner/probes/tensor_parallel.py). For each modelled family, on rank 0:
- the elements of its parameters' local shards are those of ``rank_model``'s parameters exactly,
  the whole model's and one layer's;
- what the split takes off the tensors one decoder layer saves for backward (autograd's
  saved-tensor hooks, each storage once, parameters and the shared rotary tables left out) is what
  ``layer_saved`` of ``rank_model`` takes off, to the byte per token;
- the all-reduces one layer runs forward and backward (torch's ``CommDebugMode``) are
  ``layer_all_reduces``.
"""

import json
import os
import subprocess
import sys

import pytest

from planner.catalog.families import spec_from_config
from planner.cost import activations, params, tensor

from helpers import FULL

pytest.importorskip("torch")
pytest.importorskip("transformers")

SEQ = 64
COMMON = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=4, head_dim=32, vocab_size=1024, max_position_embeddings=SEQ, use_cache=False,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "qwen2": {},  # q, k, v biased
    "qwen3": {},  # q and k norms
    "gemma": {},  # tied head
    "gemma2": {},  # four norms a layer, tied head, eager attention (transformers has no SDPA for it)
    "smollm3": {},  # tied head
    "starcoder2": {},  # plain MLP with biases, LayerNorm
}


def _spec(family: str):
    """planner's spec of the test's model, read from the whole config transformers builds (its
    defaults written out, as a saved config.json has them)."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type=family, **COMMON, **CONFIGS[family]).to_dict()
    return spec_from_config(config, f"tiny-{family}", "test")


@pytest.fixture(scope="module", params=[pytest.param(2, marks=FULL), 4])  # (4: one key/value head a rank)
def sharded(request):
    t = request.param
    configs = {f: COMMON | kw for f, kw in CONFIGS.items()}
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "planner.probes.tensor_parallel", str(t), str(SEQ), json.dumps(configs)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return t, json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_rank_parameters_are_transformers_shards(sharded, family):
    t, found = sharded
    m = _spec(family)
    assert tensor.tp_refusal(m, t) is None
    assert found[f"{family} 1"]["params"] == params.total_parameters(m)
    assert found[f"{family} {t}"]["params"] == params.total_parameters(tensor.rank_model(m, t))
    assert found[f"{family} {t}"]["layer_params"] == params.layer_parameters(tensor.rank_model(m, t))


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_layer_saved_tensors_split_as_transformers_runs_them(sharded, family):
    """The norms and the column-parallel projections' input stay whole; the per-head tensors and the
    MLP's intermediates are a rank's slice: what tensor parallelism takes off a layer's saved
    tensors is exact, byte for byte per token (the lists themselves are the traced matrix's to
    check: on the CPU a LayerNorm saves 16-bit statistics and Gemma's norms a weight-sized sum,
    alike with and without the split)."""
    t, found = sharded
    m = _spec(family)
    fused = family != "gemma2"

    def analytic(tp: int) -> float:
        rank = tensor.rank_model(m, tp)
        return activations.total(activations.layer_saved(rank, activations.DTypes(2, 2), fused, SEQ))

    taken = found[f"{family} 1"]["saved_per_token"] - found[f"{family} {t}"]["saved_per_token"]
    assert taken > 0
    assert taken == pytest.approx(analytic(1) - analytic(t), abs=1e-9)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_layer_all_reduces(sharded, family):
    t, found = sharded
    assert tuple(found[f"{family} 1"]["all_reduces"]) == (0, 0)
    assert tuple(found[f"{family} {t}"]["all_reduces"]) == tensor.layer_all_reduces(_spec(family))


def test_refusals():
    m = _spec("llama")
    assert tensor.tp_refusal(m, 4) is None
    assert "split evenly" in tensor.tp_refusal(m, 8)  # (4 key/value heads)
    assert "split evenly" in tensor.tp_refusal(m, 3)
    phi3 = spec_from_config({"model_type": "phi3", **COMMON}, "tiny-phi3", "test")  # (its own defaults unread)
    assert "not modelled" in tensor.tp_refusal(phi3, 2)


def test_probes_refuse_a_tensor_parallel_plan_with_the_reason():
    from planner.core.errors import PlannerInputError
    from planner.probes.unprobed import refuse_tensor_parallel
    from planner.strategies import TrainingConfig

    refuse_tensor_parallel(TrainingConfig())  # (none: nothing to refuse)
    with pytest.raises(PlannerInputError, match="not probed yet"):
        refuse_tensor_parallel(TrainingConfig(sharding="fsdp", tensor_parallel="transformers", tp_size=2))
