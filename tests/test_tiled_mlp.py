"""The tiled MLP (strategies/tiled_mlp.py): DeepSpeed's ``TiledMLP`` around each decoder layer's
MLP, applied by the planner launch (planner/runtime/tiled_mlp.py): the same gradients, the traced
bytes, the rules, the files and a published ablation.

Published (snowflakedb/ArcticTraining projects/sequence-parallelism @b28638e6, the configurations
of the ALST paper's ablation, arXiv 2506.13996 Table 1; the longest sequence each ran):

| run | file | quote | hardware and config |
|---|---|---|---|
| Ulysses, Liger | run-h100-sp8-llama-8b-no-mlp-no-act-offload.yml | `max_length: 1_100_000` | 8 x H100 80GB, Llama-3.1-8B, Ulysses 8, ZeRO-3 with the optimizer on the CPU (cpu_adam), HF activation checkpointing, Liger kernels ("liger" model type), micro-batch 1 |
| + tiled MLP | run-h100-sp8-llama-8b-yes-mlp.yml | `tiled_mlp_compute: true`, `max_length: 1_200_000 # ok` | the same, SDPA |

Caveats: the lengths are the ones each configuration ran (the paper's table), not a bisection to
the byte; the "liger" model type swaps RMSNorm, SwiGLU and RoPE for Liger's kernels, which hold
less than the transformers modules planner counts (planner's fused loss runs alone:
strategies/loss.py ``LIGER_LAYER_KERNELS_OFF``).
"""

import json

import pytest

from helpers import FULL, round_trip, round_trip_errors
from planner.catalog.gpus import parse_gpus
from planner.catalog.models import catalog, resolve_model
from planner.cost import activations
from planner.engine.estimate import check_config, estimate_config
from planner.strategies import PlanContext, TrainingConfig

ULYSSES = {"sharding": "zero3", "offload": "optimizer", "checkpointing": "full", "loss": "chunked",
           "sequence_parallel": "ulysses", "sp_size": 8, "attention": "sdpa"}
LLAMA = "meta-llama/Llama-3.1-8B"


def _plan(model: str = LLAMA, gpus: str = "8xH100-80", **fields):
    return estimate_config(resolve_model(model), parse_gpus(gpus), TrainingConfig(**fields))


def test_tiled_mlp_trains_the_same_gradients():
    """DeepSpeed's TiledMLP as the launch applies it, on real fp32 tensors: four tiles of a tiny
    Llama's 256 positions (width 64) give the loss and every gradient of the untiled model."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("deepspeed")
    from pathlib import Path

    from planner.runtime import Site
    from planner.runtime.tiled_mlp import MARK, prepare

    config = json.loads((Path(__file__).parent / "data" / "tiny-llama" / "config.json").read_text())
    assert activations.tiled_mlp_tiles(256, config["hidden_size"]) == 4
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    plain = transformers.AutoModelForCausalLM.from_config(cfg)
    tiled = transformers.AutoModelForCausalLM.from_config(cfg)
    tiled.load_state_dict(plain.state_dict())
    note = prepare(tiled, TrainingConfig(tiled_mlp="tiled"), Site.LAUNCH)
    assert note and "TiledMLP in 2 decoder layers" in note
    assert all(hasattr(layer.mlp, MARK) for layer in tiled.model.layers)
    ids = torch.randint(0, config["vocab_size"], (2, 256))
    losses = []
    for model in (plain, tiled):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for (name, a), b in zip(plain.named_parameters(), tiled.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("model, cells", [
    pytest.param("Qwen/Qwen2.5-0.5B", [dict(precision="bf16-pure", checkpointing=c, loss=loss, seq_len=8192)
                                        for c in ("none", "full") for loss in ("chunked", "standard")], marks=FULL),
    ("meta-llama/Llama-3.2-1B", [dict(precision="bf16-pure", checkpointing=c, loss="chunked", micro_batch_size=2,
                                      seq_len=8192) for c in ("none", "full")]),
    # a Ulysses rank (DeepSpeed's UlyssesSPAttentionHF under a fake group of 2): its 8,192 positions in 10 tiles
    pytest.param("Qwen/Qwen2.5-0.5B", [dict(precision="bf16-pure", checkpointing=c, loss="chunked", seq_len=16384,
                                            sequence_parallel="ulysses", sp_size=2) for c in ("none", "full")],
                 id="ulysses", marks=FULL),
])  # (CI: Llama's cells; the full suite: Qwen's standard loss and a Ulysses rank too)
def test_the_traced_tiled_mlp_agrees_with_the_ledger(model, cells):
    """The real model with DeepSpeed's TiledMLP on fake tensors (2 layers; ceil(8192 / hidden)
    tiles; a Ulysses rank's share of 16,384 positions): model states to the byte, every phase within 1 % under and 5 % over the trace (the
    traced matrix's band). The tiled layer keeps only its MLP input; its backward holds one tile's
    intermediates and gradients, the MLP's accumulated weight gradients, and its largest moment
    can be the MLP norm's fp32 backward."""
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    from planner.probes.compare import STATES, compare_result
    from planner.probes.traced import TraceRequest, trace_many

    configs = [TrainingConfig(tiled_mlp="tiled", **c) for c in cells]
    traces = trace_many([TraceRequest(config_json=catalog()[model].config, config=c, layers=2) for c in configs],
                        timeout=900, workers=2)
    for config, traced in zip(configs, traces, strict=True):
        assert not isinstance(traced, str), traced
        assert any("TiledMLP" in n for n in traced.notes), traced.notes
        for t in compare_result(model, config, 1, 2, traced).terms:
            if t.term in STATES:
                assert t.analytic == t.traced, (config, t)
            elif t.term.endswith(("_phase", "_peak")):
                assert -0.01 <= t.error <= 0.05, (model, config, t.term, f"{t.error:+.2%}")


def test_tiling_frees_the_layers_mlp_intermediates():
    """Without checkpointing every layer keeps its MLP's intermediates (gate, act(gate), up and
    their product: 4 x intermediate width) and input; tiled, only the input (the residual's
    dtype): the forward peak falls by that, per layer and token (Llama-3.1-8B, ZeRO-3, one
    sequence of 4,096 tokens)."""
    base = dict(sharding="zero3", precision="bf16-mixed", seq_len=4096)
    plain, tiled = _plan(**base), _plan(tiled_mlp="tiled", **base)
    m = resolve_model(LLAMA)
    per_token = 4 * 2 * m.intermediate_size  # DeepSpeed bf16: 16-bit activations, the input kept in both
    saved = lambda p: next(r.bytes for r in p.ledger if r.label.startswith("saved activations"))  # noqa: E731
    assert saved(plain) - saved(tiled) == m.num_layers * 4096 * per_token
    assert tiled.memory["peak"] < plain.memory["peak"]


def test_the_tiles_recompute_costs_an_mlp_forward():
    """The step's extra time is at most one more forward of each MLP a micro-batch (its matmuls, 2
    FLOPs per weight per token, at 30-100 % of the bf16 dense peak, and its elementwise ops; what
    the step overlaps with it hides part of it), and some of it shows."""
    plain, tiled = _plan(**ULYSSES, seq_len=131072), _plan(**ULYSSES, seq_len=131072, tiled_mlp="tiled")
    row = next(r for r in tiled.time.rows if r.label.startswith("tiled MLP"))
    assert 0 < tiled.time.step_seconds - plain.time.step_seconds <= row.seconds * (1 + 1e-9)
    m, gpu = resolve_model(LLAMA), parse_gpus("8xH100-80").gpu
    flops = 2 * 3 * m.hidden_size * m.intermediate_size * m.num_layers * 131072 / 8 * tiled.config.grad_accum
    peak = gpu.dense_flops_per_s["bf16"]
    assert flops / peak < row.seconds < flops / (0.3 * peak) + 0.05, (row.seconds, flops / peak)


@pytest.mark.parametrize("fields, code", [
    ({"sharding": "fsdp"}, "tiled MLP without DeepSpeed"),
    ({"sharding": "ddp"}, "tiled MLP without DeepSpeed"),
    ({"sharding": "zero3", "adapter": "lora"}, "tiled MLP with an adapter"),
    ({"sharding": "zero3", "checkpointing": "selective"}, "tiled MLP with selective checkpointing"),
    ({"sharding": "zero3", "precision": "fp8-mixed"}, "tiled MLP with fp8"),
    ({"sharding": "zero3", "method": "dpo"}, "tiled MLP beyond sft"),
    ({"sharding": "zero1"}, None), ({"sharding": "zero2"}, None), ({"sharding": "zero3"}, None)])
def test_where_a_tiled_mlp_runs(fields, code):
    """DeepSpeed's ZeRO stages (its ``ds_grad_is_ready`` defers the MLP's gradients to the last
    tile) or one GPU alone; DDP and FSDP's hooks would reduce every tile's gradients. Adapters,
    selective checkpointing, fp8 and the preference methods are not modelled with it; a dropout
    inside the MLP would be drawn again by the tiles' recompute (wrong gradients), and under torch
    autocast the recompute runs after it, in fp32 (another numerics, many times slower)."""
    def tiled_codes(model: str, gpus: str, config: TrainingConfig) -> list[str]:
        codes = check_config(PlanContext(resolve_model(model), parse_gpus(gpus), config)).codes
        return [c for c in codes if c.startswith("tiled MLP")]

    assert tiled_codes(LLAMA, "8xH100-80", TrainingConfig(tiled_mlp="tiled", seq_len=4096, **fields)) == (
        [code] if code else [])
    assert tiled_codes(LLAMA, "1xH100-80", TrainingConfig(tiled_mlp="tiled", precision="bf16-pure", seq_len=4096)) == []
    # torch autocast (one GPU, bf16-mixed over fp32 weights): the tiles' recompute runs after it, in fp32
    assert tiled_codes(LLAMA, "1xH100-80", TrainingConfig(tiled_mlp="tiled", seq_len=4096)) == ["tiled MLP under autocast"]
    assert tiled_codes("mistralai/Mixtral-8x7B-v0.1", "8xH100-80",
                       TrainingConfig(tiled_mlp="tiled", sharding="zero3", seq_len=4096)) == ["tiled MLP of a MoE model"]
    # a dropout inside the MLP (GPT-2's resid_pdrop, StarCoder2's residual_dropout): the recompute draws another mask
    for model in ("openai-community/gpt2", "bigcode/starcoder2-15b"):
        assert tiled_codes(model, "8xH100-80", TrainingConfig(tiled_mlp="tiled", sharding="zero3", seq_len=1024)) == [
            "tiled MLP with dropout in the MLP"]


def test_the_files_say_it_and_check_reads_it_back(tmp_path):
    """runtime.json names the tiled MLP (no library key can); check reads it back to the same plan
    and peak, and a job without runtime.json as untiled."""
    from planner.emit import build_files, single_plan_result

    plan = _plan(**ULYSSES, seq_len=262144, tiled_mlp="tiled")
    assert plan.fits
    files = build_files(single_plan_result(plan))
    assert json.loads(files["runtime.json"])["tiled_mlp"] == "tiled"
    back = round_trip(plan, tmp_path / "tiled")
    assert round_trip_errors(plan, back) == []
    one = build_files(single_plan_result(_plan(gpus="1xH100-80", checkpointing="full", seq_len=65536,
                                               precision="bf16-pure", tiled_mlp="tiled")))
    assert "deepspeed" in one["PLAN.md"].split("pip install", 1)[1].split("\n", 1)[0]  # its TiledMLP, without ZeRO
    plain = _plan(**ULYSSES, seq_len=262144)
    assert "tiled_mlp" not in json.loads(build_files(single_plan_result(plain)).get("runtime.json", "{}"))
    again = round_trip(plain, tmp_path / "plain")
    assert again.estimate.config.tiled_mlp == "none" and round_trip_errors(plain, again) == []


def test_long_sequences_search_the_tiling_and_short_ones_do_not():
    from planner.engine.degrees import sequence_requests
    from planner.engine.suggest import _space_of
    from planner.schema.suggest import SuggestRequest

    short = SuggestRequest(model=LLAMA, gpus="8xH100-80", seq_len=4096)
    assert sequence_requests(short, _space_of) == [short]
    long = sequence_requests(SuggestRequest(model=LLAMA, gpus="8xH100-80", seq_len=32768), _space_of)
    # (ring attention's layouts run on FSDP alone, where the rule refuses tiling: not searched there)
    assert {tuple(map(str, r.tiled_mlp)) for r in long if not r.sequence_parallel or r.sequence_parallel[0] != "ring"} \
        == {("none", "tiled")}
    assert all("tiled" not in map(str, r.tiled_mlp) for r in long if r.sequence_parallel and
               r.sequence_parallel[0] == "ring")
    ring = sequence_requests(SuggestRequest(model=LLAMA, gpus="8xH100-80", seq_len=32768, sequence_parallel=["ring"],
                                            tiled_mlp=["tiled"]), _space_of)
    assert all(r.tiled_mlp == ["tiled"] for r in ring)  # named: searched, and refused with the rule's reason
    named = sequence_requests(SuggestRequest(model=LLAMA, gpus="8xH100-80", seq_len=32768, tiled_mlp=["none"]),
                              _space_of)
    assert all(r.tiled_mlp == ["none"] for r in named)


def _longest(fields: dict, step: int = 32768) -> int:
    """The longest multiple of ``step`` tokens whose plan fits the GPU (bisection)."""
    lo, hi = 0, 4_194_304 // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _plan(**fields, seq_len=mid * step).fits else (lo, mid - 1)
    return lo * step


def test_the_published_ablation():
    """ArcticTraining's Llama-3.1-8B on 8 x H100 with Ulysses 8 (table above) ran 1.1M tokens
    without the tiled MLP and 1.2M with it: lengths that fit, lower bounds of each configuration's
    limit. planner's longest plans (no margin kept free, steps of 32,768 tokens): the tiled
    configuration fits at its published length, the untiled one within 10 % of it (measured:
    -7.7 %; Liger's layer kernels, which that run had, hold less than the modules planner counts),
    and tiling lengthens the longest."""
    plain, tiled = _longest(ULYSSES), _longest(ULYSSES | {"tiled_mlp": "tiled"})
    assert plain >= 0.9 * 1_100_000, plain
    assert _plan(**ULYSSES, tiled_mlp="tiled", seq_len=1_200_000).fits
    assert tiled > plain


def test_131k_tokens_fit_without_sequence_parallelism_with_the_mlps_tiled():
    """Llama-3.1-8B, 131,072 tokens, 8xH100-80, no sequence parallelism, checkpointed inputs on the
    GPU: nothing fits with whole MLPs (tests/test_checkpoint_offload.py); tiled, a ZeRO plan does."""
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    result = suggest(SuggestRequest(model=LLAMA, gpus="8xH100-80", seq_len=131072, sequence_parallel=["none"],
                                    checkpoint_offload=["none"]))
    assert result.plans and result.plans[0].config.tiled_mlp == "tiled"
    assert result.plans[0].config.sharding.startswith("zero")


def test_a_long_job_that_does_not_fit_is_told_to_tile_or_offload():
    """The changes that lower a long-context job's peak (``memory_savers``: PLAN.md, check) include
    the tiled MLP and the checkpoint offload, each only where its rules pass: Llama-3.1-8B over
    Ulysses 8 at 1,572,864 tokens does not fit; tiled it lowers the peak, with the checkpointed
    inputs in host RAM too; under FSDP no tiling is offered."""
    from planner.engine.alternatives import memory_savers

    config = TrainingConfig(**ULYSSES, seq_len=1_572_864)
    plan = _plan(**ULYSSES, seq_len=1_572_864)
    assert not plan.fits
    savers = {a.change.split(" (")[0]: a.result for a in memory_savers(resolve_model(LLAMA), parse_gpus("8xH100-80"),
                                                                       config)}
    assert savers["tiled-mlp none -> tiled"].memory["peak"] < plan.memory["peak"]
    assert savers["checkpoint-offload none -> host"].memory["peak"] < plan.memory["peak"]
    fsdp = TrainingConfig(sharding="fsdp", checkpointing="full", seq_len=65536)
    assert not any(a.change.startswith("tiled-mlp") for a in memory_savers(resolve_model(LLAMA),
                                                                            parse_gpus("8xH100-80"), fsdp))
