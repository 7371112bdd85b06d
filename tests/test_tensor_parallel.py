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
def sharded(request, tmp_path_factory):
    from filelock import FileLock

    t = request.param
    # (xdist's workers share their base folders' parent, this session's: the child runs once for all)
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / f"tensor-parallel-{t}.json"
    with FileLock(f"{cache}.lock"):
        if not cache.exists():
            configs = {f: COMMON | kw for f, kw in CONFIGS.items()}
            env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            run = subprocess.run([sys.executable, "-P", "-m", "planner.probes.tensor_parallel", str(t), str(SEQ),
                                  json.dumps(configs), "sp"], capture_output=True, text=True, timeout=600, env=env)
            assert run.returncode == 0, run.stderr[-3000:]
            cache.write_text(run.stdout.splitlines()[-1])
    return t, json.loads(cache.read_text())


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


def test_a_sequence_parallel_layer_keeps_only_its_gathered_inputs_whole(sharded):
    """torchtitan's tensor and sequence parallel split of a Llama block (planner/probes/
    tensor_parallel.py ``sp``): a rank saves 1/t of everything the unsplit layer saves but the
    all-gathered inputs of the column-wise projections, whole (``sequence_parallel_layer_bytes`` of
    planner's unsplit rows, to the byte per token); its collectives are all-gathers and
    reduce-scatters, no all-reduce."""
    t, measured = sharded
    found = {"llama 1": measured["llama 1"], f"llama {t}": measured[f"llama {t} sp"]}
    m = _spec("llama")
    whole = activations.total(activations.layer_saved(m, activations.DTypes(2, 2), True, SEQ))  # planner's rows
    assert found["llama 1"]["saved_per_token"] == whole
    assert found[f"llama {t}"]["saved_per_token"] == tensor.sequence_parallel_layer_bytes(whole, m, t, 2)
    collectives = found[f"llama {t}"]["collectives"]
    assert tuple(collectives["all_gather"]) == tensor.SP_LAYER_ALL_GATHERS
    assert tuple(collectives["reduce_scatter"]) == tensor.SP_LAYER_REDUCE_SCATTERS
    assert collectives["all_reduce"] == [0, 0]


def test_refusals():
    m = _spec("llama")
    assert tensor.tp_refusal(m, 4) is None
    assert "split evenly" in tensor.tp_refusal(m, 8)  # (4 key/value heads)
    assert "split evenly" in tensor.tp_refusal(m, 3)
    phi3 = spec_from_config({"model_type": "phi3", **COMMON}, "tiny-phi3", "test")  # (its own defaults unread)
    assert "not modelled" in tensor.tp_refusal(phi3, 2)


def test_the_measured_probe_refuses_a_tensor_parallel_plan_with_the_reason():
    from planner.core.errors import PlannerInputError
    from planner.probes.unprobed import refuse_tensor_parallel
    from planner.strategies import TrainingConfig

    refuse_tensor_parallel(TrainingConfig())  # (none: nothing to refuse)
    with pytest.raises(PlannerInputError, match="not measured"):
        refuse_tensor_parallel(TrainingConfig(sharding="fsdp", tensor_parallel="transformers", tp_size=2))


TINY = dict(model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, vocab_size=4096, max_position_embeddings=256, torch_dtype="float32")


def test_a_traced_rank_agrees_with_the_ledger_phase_by_phase(tmp_path):
    """A tiny Llama (its vocabulary a large share of it, as at 1B parameters) under TP 2 x FSDP2 2,
    untied and tied, traced as transformers loads it (its plan, its own FSDP2 units: the
    embeddings resharded, the final norm and head kept; tied, the embeddings in the kept unit)
    against the ledger: model states to the byte, each phase within 1 % (strategies/fsdp_units.py)."""
    from planner.probes.compare import compare_result
    from planner.probes.traced import TraceRequest, trace_many
    from planner.strategies import TrainingConfig

    c = TrainingConfig(sharding="fsdp", precision="bf16-mixed", micro_batch_size=2, seq_len=128,
                       tensor_parallel="transformers", tp_size=2)
    configs = [TINY | {"tie_word_embeddings": tied} for tied in (False, True)]
    results = trace_many([TraceRequest(config_json=cfg, config=c, world_size=4) for cfg in configs], timeout=600)
    for config, traced in zip(configs, results, strict=True):
        assert not isinstance(traced, str), traced
        assert any("TP 2 x FSDP2 2" in n for n in traced.notes)
        folder = tmp_path / str(config["tie_word_embeddings"])
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        terms = {t.term: t for t in compare_result(str(folder), c, 4, None, traced).terms}
        assert all(t.analytic == t.traced for t in terms.values() if t.exact)
        off = {k: f"{t.error:+.2%}" for k, t in terms.items() if k.endswith("phase") and abs(t.error) > 0.01}
        assert not off, (config["tie_word_embeddings"], off)


def test_the_traced_probe_refuses_a_split_the_rules_refuse():
    """Qwen2.5-0.5B's 14 heads over 4 ranks: refused with the rule's reason (exit 2), never traced
    as a split transformers would reject at its first forward."""
    from typer.testing import CliRunner

    from planner.cli import app

    r = CliRunner().invoke(app, ["probe", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "8xH100-80", "--sharding", "fsdp",
                                 "--tensor-parallel", "transformers", "--tp-size", "4", "--layers", "2"])
    assert r.exit_code == 2 and "do not split evenly over 4 ranks" in " ".join(r.output.split()), r.output


GLOO_RANK = r"""
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
from planner.probes.traced import TraceRequest, run_trace
req = TraceRequest.model_validate_json(sys.stdin.read())
result = run_trace(req.model_copy(update={"real": True}))
if dist.get_rank() == 0:
    print(json.dumps({"phase_peaks": result.phase_peaks, "parameters": result.parameters_bytes}))
dist.destroy_process_group()
"""


@FULL
def test_a_fake_rank_holds_what_a_real_gloo_rank_holds(tmp_path):
    """The traced rank (fake tensors, a fake process group) against rank 0 of four real gloo
    processes running the same TP 2 x FSDP2 2 plan on real CPU tensors under the same tracker:
    the same parameter bytes and the same forward, backward and step peaks to the byte. At the end
    of backward the real rank holds one more buffer the size of the embeddings' unit in the reduce
    dtype (V/T x h fp32) while that unit is reduce-scattered: gloo's CPU reduce-scatter (inferred
    from the size; the fake group, as NCCL, reduces into the output)."""
    from planner.probes.traced import TraceRequest, trace
    from planner.strategies import TrainingConfig

    c = TrainingConfig(sharding="fsdp", precision="bf16-mixed", micro_batch_size=2, seq_len=64,
                       tensor_parallel="transformers", tp_size=2)
    req = TraceRequest(config_json=TINY | {"tie_word_embeddings": False}, config=c, world_size=4)
    fake = trace(req, timeout=600)
    env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29637", "WORLD_SIZE": "4", "OMP_NUM_THREADS": "1",
                        "HF_HUB_OFFLINE": "1"}
    (tmp_path / "request.json").write_text(req.model_dump_json())
    logs = [(tmp_path / f"out{r}", tmp_path / f"err{r}") for r in range(4)]
    procs = []
    for r, (out, err) in enumerate(logs):  # (each rank reads the request from a file: all start at once)
        with (tmp_path / "request.json").open() as stdin, out.open("w") as o, err.open("w") as e:
            procs.append(subprocess.Popen([sys.executable, "-P", "-c", GLOO_RANK], stdin=stdin, stdout=o, stderr=e, text=True,
                                          env=env | {"RANK": str(r), "LOCAL_RANK": str(r)}))
    codes = [p.wait(timeout=600) for p in procs]
    assert codes == [0] * 4, [err.read_text()[-2000:] for _, err in logs]
    real = json.loads(logs[0][0].read_text().splitlines()[-1])
    assert real["parameters"] == fake.parameters_bytes
    peaks = real["phase_peaks"]
    assert {p: peaks[p] for p in ("forward", "backward", "step")} == {
        p: fake.phase_peaks[p] for p in ("forward", "backward", "step")}
    embeddings = TINY["vocab_size"] // c.tp_size * TINY["hidden_size"]  # (the rank's rows of the table)
    assert peaks["backward_end"] - fake.phase_peaks["backward_end"] == embeddings * 4
