"""The traced fidelity against the analytic model (issue 6).

- The fake trace is faithful: its phase peaks equal a real-tensor run measured by the CPU
  allocator (torch profiler), including where autograd accumulates gradients in place.
- Over a covering subset of the matrix (probes/matrix.py: every family x four precisions x
  checkpointing x attention x shape up to 8 x 1024 and 1 x 8192 x loss x sharding none / DDP /
  FSDP2 / fsdp-grad-op at 2 and 8 ranks; every pair of factor values in the full suite; in CI every
  pair of the factors that decide a layer's activations, every value of the others; 2 and 4
  layers): model states
  to the byte, one layer within 2 %, the step peak never more than 1 % under the trace, median
  errors within 2 % (issue 17). benchmarks/traced_matrix.py runs the whole matrix.
- ZeRO plans: states computed from the partition rules, activations traced.
"""

import functools
import itertools
import os
import statistics

import pytest

from planner.catalog.models import catalog
from planner.core.errors import ProbeFailedError
from planner.strategies import TrainingConfig

from helpers import FULL, FULL_SUITE

pytest.importorskip("torch")
pytest.importorskip("transformers")
from planner.probes import matrix as M  # noqa: E402
from planner.probes.compare import (  # noqa: E402
    STATES,  # noqa: E402
    compare_result,
    per_layer_comparison,
)
from planner.probes.matrix import ARCHS, FACTORS, covering_subset, full_matrix  # noqa: E402
from planner.probes.traced import TraceRequest, trace, trace_many  # noqa: E402

QWEN = "Qwen/Qwen2.5-0.5B"  # biases, GQA, tied embeddings
SMOL = "HuggingFaceTB/SmolLM2-135M"  # Llama's layer, tied embeddings: a fifth of Qwen's embedding
LAYERS = 2


def request(model, layers=LAYERS, world=1, **cfg) -> TraceRequest:
    return TraceRequest(config_json=catalog()[model].config, config=TrainingConfig(**cfg), layers=layers,
                        world_size=world)


@pytest.mark.parametrize("precision", [pytest.param("bf16-pure", marks=FULL), "bf16-mixed", pytest.param("fp32", marks=FULL)])
def test_model_states_match_to_the_byte(precision):
    req = request(QWEN, precision=precision, optimizer="adamw", micro_batch_size=1, seq_len=64)
    c = compare_result(QWEN, req.config, 1, LAYERS, trace(req, timeout=900))
    for term in ("parameters", "gradients", "optimizer_states"):
        t = next(t for t in c.terms if t.term == term)
        assert t.analytic == t.traced, term
    assert any("CPU" in note for note in c.notes)


#: The full suite's (CI's traced tests all run the warm-up step: the real-allocator test below checks a
#: plain one against real tensors, the matrix subset FSDP2's and the adapters' against the ledger)
WARM_UPS = {
    "fsdp4-lora": (SMOL, dict(world=4, sharding="fsdp", adapter="lora")),
    "adamw": (QWEN, dict()),
    "ulysses2": ("meta-llama/Llama-3.2-1B", dict(sequence_parallel="ulysses", sp_size=2)),
    "adafactor-full": (SMOL, dict(optimizer="adafactor", checkpointing="full")),
    "sgd-chunked": (SMOL, dict(optimizer="sgd", loss="chunked")),
}


@FULL
def test_the_warm_up_step_gives_what_a_whole_first_iteration_does():
    """The trace's warm-up (one optimizer step over zero gradients, no forward or backward) leaves the
    measured iteration as a whole first iteration does: the same model states to the byte, every
    phase peak and the baseline within 4 KiB (a rank of a fake process group keeps a few small
    tensors of its first forward: ~1 KiB under Ulysses). Tensor-parallel plans warm up with a whole
    iteration (``warm_up_of``)."""
    from planner.probes.traced import warm_up_of

    names = list(WARM_UPS)
    reqs = [request(WARM_UPS[n][0], **{"micro_batch_size": 1, "seq_len": 128, **WARM_UPS[n][1]}) for n in names]
    both = trace_many([r.model_copy(update={"warm_up": w}) for r in reqs for w in ("iteration", "step")], timeout=900)
    for name, whole, step in zip(names, both[::2], both[1::2], strict=True):
        assert not isinstance(whole, str) and not isinstance(step, str), (name, whole, step)
        for field in ("parameters_bytes", "gradients_bytes", "optimizer_state_bytes", "inplace_adds"):
            assert getattr(step, field) == getattr(whole, field), (name, field)
        assert step.phase_peaks.keys() == whole.phase_peaks.keys(), name
        for phase, peak in whole.phase_peaks.items():
            assert abs(step.phase_peaks[phase] - peak) <= 4096, (name, phase, step.phase_peaks[phase], peak)
        assert abs(step.baseline_bytes - whole.baseline_bytes) <= 4096, name
    tp = request(QWEN, world=4, sharding="fsdp", tensor_parallel="transformers", tp_size=2)
    assert [warm_up_of(r) for r in (*reqs, tp)] == ["step"] * len(reqs) + ["iteration"]


@pytest.mark.heavy
@pytest.mark.parametrize("precision, vocab", [  # CI: the in-place accumulation at a small vocabulary
    pytest.param("bf16-mixed", 8192, id="bf16-mixed-vocab-8192"),
    pytest.param("bf16-pure", 8192, id="bf16-pure-vocab-8192", marks=FULL),
    pytest.param("bf16-mixed", None, id="bf16-mixed-vocab-151936", marks=FULL),
    pytest.param("bf16-pure", None, id="bf16-pure-vocab-151936", marks=FULL)])
def test_fake_trace_equals_the_real_allocator(precision, vocab):
    """Tied embeddings: autocast's fp32 upcast is accumulated in place (bf16-mixed), the matmul's
    view is not (bf16-pure). The fake trace with the tracker's in-place rule must reproduce the
    real CPU allocator's phase peaks (above the iteration's start) in both. CI computes Qwen2.5-0.5B's
    layers with a vocabulary of 8,192 under bf16-mixed (the real run is ~8x faster; the embedding is
    still the largest tensor and tied); the full suite both precisions, also at its own 151,936."""
    from planner.probes.real_cpu import real_phase_increments

    req = request(QWEN, precision=precision, micro_batch_size=1, seq_len=64)
    if vocab is not None:
        req = req.model_copy(update={"config_json": req.config_json | {"vocab_size": vocab}})
    fake = trace(req, timeout=300)
    real = real_phase_increments(req)
    increments = {p: v - fake.baseline_bytes for p, v in fake.phase_peaks.items()}
    # the tracker's forward phase runs into backward (up to the last layer), the profiler's spans
    # do not: compare forward + backward as one, where the tied accumulation is the peak
    fake_fb = max(increments["forward"], increments["backward"], increments.get("backward_end", 0))
    assert fake_fb == max(real["forward"], real["backward"])
    assert abs(increments["step"] - real["step"]) <= 64  # python-side scalars
    assert fake.inplace_adds > 0


def test_failures_and_timeouts_are_errors_not_crashes():
    bad = TraceRequest(config_json={"model_type": "llama", "hidden_size": 7, "num_attention_heads": 2},
                       config=TrainingConfig(seq_len=8))
    with pytest.raises(ProbeFailedError, match="traced probe failed"):
        trace(bad, timeout=120)
    with pytest.raises(ProbeFailedError, match="timed out"):
        trace(request(QWEN, seq_len=64), timeout=0.5)


@functools.cache
def matrix_traces():
    """The covering subset of the cross-validation matrix (probes/matrix.py: every value of every
    factor, every pair of values of any two factors; in CI, ``quick_subset``: every pair of values
    of the factors that decide a layer's activations, every model and sharding), each row traced at CI_DEPTH and at
    LAYER_DEPTHS[-1] layers in parallel children, one per core. benchmarks/traced_matrix.py runs
    the whole matrix (docs/traced-matrix.md)."""
    rows = covering_subset() if FULL_SUITE else M.quick_subset()
    depths = (M.CI_DEPTH, M.LAYER_DEPTHS[-1])
    # (one child per world: xdist's other worker has the other core, and each child spends seconds starting)
    results = trace_many([M.trace_request(r, d) for r in rows for d in depths], timeout=3600,
                         workers=max(1, (os.cpu_count() or 1) // 2))
    return [(r, dict(zip(depths, results[2 * i: 2 * i + 2], strict=True))) for i, r in enumerate(rows)]


def test_the_subset_covers_every_pair_of_the_matrix():
    """Every value of every factor, and every pair of values of two factors, is in the full suite's
    subset; in CI's, every pair of two factors that decide a layer's activations."""
    rows = covering_subset()
    full = full_matrix()
    for a, b in itertools.combinations(FACTORS, 2):
        assert {(r[a], r[b]) for r in full} == {(r[a], r[b]) for r in rows}, (a, b)
    assert {r["model"] for r in rows} == set(ARCHS) and len(rows) < len(full) // 20
    quick = M.quick_subset()
    for a, b in itertools.combinations(M.QUICK_PAIRS, 2):
        assert {(r[a], r[b]) for r in full} == {(r[a], r[b]) for r in quick}, (a, b)
    assert all({r[f] for r in quick} == {r[f] for r in full} for f in FACTORS) and len(quick) < len(rows)


@pytest.mark.heavy
def test_matrix_subset_meets_the_safety_target():
    """For every plan of the subset (one test, so its traces are made once, on one xdist worker):
    parameters, gradients and optimizer states to the byte; one layer's activations (the difference
    of two depths) within 2 %; the step peak never more than 1 % under the trace; the median |error| of the
    activations, one layer, every phase and the step peak at most 2 %."""
    from planner.probes.compare import per_layer_comparison, same_moment

    missed, errors = [], {}
    rows = matrix_traces()
    for row, traced in rows:
        bad = [t for t in traced.values() if isinstance(t, str)]
        assert not bad, f"{row}: {bad[0]}"
        cfg = TrainingConfig(**M.plan_fields(row))
        shallow, deep = (compare_result(row["model"], cfg, M.world(row), d, t) for d, t in traced.items())
        terms = {t.term: t for t in deep.terms}
        if same_moment(row["model"], cfg, M.world(row), tuple(traced)):
            terms["layer"] = per_layer_comparison(deep, shallow)
        for name, t in terms.items():
            errors.setdefault(name, []).append(abs(t.error))
        checks = [(t, t.analytic == t.traced) for t in terms.values() if t.exact]
        checks.append((terms["step_peak"], terms["step_peak"].error >= M.PEAK_FLOOR))
        if "layer" in terms:
            checks.append((terms["layer"], abs(terms["layer"].error) <= M.LAYER_BAND))
        missed += [f"{row} {t.term}: analytic {t.analytic:,} traced {t.traced:,} ({t.error:+.2%})" for t, ok in checks
                   if not ok]
    assert not missed, "\n".join(missed)
    assert len(errors["layer"]) >= len(rows) * 3 // 4  # one layer is compared in most cells
    medians = {name: statistics.median(v) for name, v in errors.items() if name not in STATES}
    assert all(v <= M.MEDIAN_BAND for v in medians.values()), medians


@pytest.mark.parametrize("sharding", [pytest.param("zero2", marks=FULL), "zero3"])  # (CI: ZeRO-3)
def test_zero_plan_states_computed_and_activations_traced(sharding):
    """ZeRO plans: the rank's model states from the ZeRO partition rules on the traced parameter
    count agree with the ledger; the activations of the 16-bit module traced with sharding none agree
    within 5 %; the result says which is which."""
    from planner.probes.compare import compare_zero_result

    plan = dict(precision="bf16-mixed", sharding=sharding, micro_batch_size=2, seq_len=256)
    traced = trace(request(QWEN, **(plan | {"sharding": "none", "precision": "bf16-pure"})), timeout=900)
    c = compare_zero_result(QWEN, TrainingConfig(**plan), 8, LAYERS, traced)
    assert [t.source for t in c.terms] == ["computed"] * 3 + ["traced"]
    bad = [f"{t.term}: {t.analytic:,} vs {t.traced:,}" for t in c.terms if not t.agrees]
    assert not bad, bad
    assert any("computed from the ZeRO partition rules" in n for n in c.notes)


def probe_cli(*args):
    import json

    from typer.testing import CliRunner

    from planner.cli import app

    r = CliRunner().invoke(app, ["probe", "--model", QWEN, "--layers", "2", "--seq-len", "128", *args])
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r.exit_code, (json.loads(r.stdout) if "--json" in args and r.exit_code in (0, 1) else r.output)


@pytest.mark.heavy
def test_probe_cli_exit_codes():
    """0: analytic and traced agree (JSON with every term and the traced phases); 2: bad input with a
    hint; 3: the probe's child process failed (here: its timeout)."""
    code, out = probe_cli("--gpus", "2xH100-80", "--sharding", "fsdp", "--json")
    assert code == 0, out
    terms = {t["term"]: t for t in out["comparison"]["terms"]}
    assert {"parameters", "gradients", "optimizer_states", "activations", "step_peak"} <= set(terms)
    assert terms["parameters"]["analytic"] == terms["parameters"]["traced"]
    assert set(out["phase_peaks"]) == {"forward", "backward", "backward_end", "step"}
    code, out = probe_cli("--gpus", "2x8xH100-80", "--sharding", "fsdp-hybrid")
    assert code == 2 and "not traced" in out
    code, out = probe_cli("--gpus", "1xH100-80", "--fidelity", "measured")
    assert code == 2 and "traced" in out
    code, out = probe_cli("--gpus", "1xH100-80", "--timeout", "0.5")
    assert code == 3 and "timed out" in out


@FULL
def test_the_two_cells_issue_17_found_under_predicted_at_full_depth():
    """Issue 17's two measured under-predictions, traced at full depth: GPT-2 with eager attention
    (was -5.8 %: the fp32 softmax under autocast) and Llama-3.2-1B fp8-mixed under FSDP at mbs 16
    (was -5.6 %, a tuned plan: fp8's casts). Now the step peak is within 1 % under, or over."""
    cells = [("openai-community/gpt2", dict(attention="eager", checkpointing="none", precision="bf16-mixed",
                                            micro_batch_size=4, seq_len=512)),
             ("meta-llama/Llama-3.2-1B", dict(precision="fp8-mixed", sharding="fsdp", checkpointing="none",
                                              micro_batch_size=16, seq_len=2048))]
    reqs = [request(model, layers=None, **cfg) for model, cfg in cells]
    for (model, cfg), traced in zip(cells, trace_many(reqs, timeout=1800, workers=2), strict=True):
        assert not isinstance(traced, str), traced
        c = compare_result(model, TrainingConfig(**cfg), 1, None, traced)
        peak = next(t for t in c.terms if t.term == "step_peak")
        assert peak.error >= M.PEAK_FLOOR, (model, peak.analytic, peak.traced, f"{peak.error:+.2%}")


@FULL
def test_the_cells_issue_17_left_open_now_agree_in_every_phase():
    """The cells the matrix left open, traced at 2 and 4 layers, each phase within 1 % under and
    5 % over, and one layer within 2 %. Mixtral-8x7B under FSDP2 at 8 ranks (the second layer's
    backward with the top layer's reduce-scatter input in flight: was -12.5 % at 4 layers), under
    fsdp-grad-op (the all-gather outputs held beside the kept layers: was -13.4 % in backward),
    and eager attention's softmax under checkpointing at 8192 tokens (was +52 % in forward; Qwen3:
    one layer +94 %, the cached autocast casts)."""
    cells = [("mistralai/Mixtral-8x7B-v0.1", 8, dict(precision="fp16-mixed", checkpointing="none", sharding="fsdp",
                                                     micro_batch_size=8, seq_len=1024)),
             ("mistralai/Mixtral-8x7B-v0.1", 8, dict(precision="fp16-mixed", checkpointing="full",
                                                     sharding="fsdp-grad-op", micro_batch_size=1, seq_len=8192)),
             ("meta-llama/Llama-3.2-1B", 1, dict(precision="bf16-pure", checkpointing="full", attention="eager",
                                                 micro_batch_size=1, seq_len=8192)),
             ("Qwen/Qwen3-0.6B", 1, dict(precision="bf16-mixed", checkpointing="full", attention="eager",
                                         micro_batch_size=1, seq_len=8192))]
    reqs = [request(model, layers=d, world=world, **cfg) for model, world, cfg in cells for d in (2, 4)]
    traces = trace_many(reqs, timeout=1800, workers=2)
    missed = []
    for k, (model, world, cfg) in enumerate(cells):
        shallow, deep = traces[2 * k:2 * k + 2]
        assert not isinstance(shallow, str) and not isinstance(deep, str), (shallow, deep)
        config = TrainingConfig(**cfg)
        two, four = compare_result(model, config, world, 2, shallow), compare_result(model, config, world, 4, deep)
        terms = [t for t in four.terms if t.term in ("forward_phase", "backward_phase")]
        terms.append(per_layer_comparison(four, two))
        missed += [f"{model} {cfg} {t.term}: {t.error:+.2%}" for t in terms
                   if not (abs(t.error) <= M.LAYER_BAND if t.term == "layer_activations"
                           else M.PEAK_FLOOR <= t.error <= 0.05)]
    assert not missed, "\n".join(missed)


@FULL  # CI traces the layers these reuse (Gemma-2, Llama) in the matrix
def test_the_families_added_for_the_recipe_corpus_agree_with_their_trace():
    """Gemma (v1) and SmolLM3 (issue 19: the handbook's zephyr-7b-gemma and SmolLM3 recipes) reuse
    Gemma-2's norm and Llama's layer: traced at 2 and 4 layers with and without checkpointing,
    model states to the byte and every phase within 1 % under and 5 % over the trace. (SmolLM3's
    per-layer lists follow the depth: planner.catalog.families.with_depth.)"""
    cells = [(m, dict(precision=p, checkpointing=c, micro_batch_size=2, seq_len=1024))
             for m in ("google/gemma-7b", "HuggingFaceTB/SmolLM3-3B")
             for p, c in (("bf16-mixed", "none"), ("bf16-pure", "full"))]
    runs = [(model, cfg, d) for model, cfg in cells for d in (2, 4)]
    traces = trace_many([request(model, layers=d, **cfg) for model, cfg, d in runs], timeout=900, workers=2)
    for (model, cfg, depth), traced in zip(runs, traces, strict=True):
        assert not isinstance(traced, str), traced
        c = compare_result(model, TrainingConfig(**cfg), 1, depth, traced)
        for t in c.terms:
            if t.term in STATES:
                assert t.analytic == t.traced, (model, cfg, t)
            elif t.term.endswith(("_phase", "_peak")):
                assert -0.01 <= t.error <= 0.05, (model, cfg, t.term, f"{t.error:+.2%}")


@FULL
def test_starcoder2_with_its_dropouts_agrees_with_its_trace():
    """StarCoder2-15B (the handbook's starchat2-15b recipe): Llama's attention (GQA, biases) with
    LayerNorm, a plain MLP and dropout on the attention probabilities, both blocks' outputs and the
    embeddings, all 0.1 and active in training (masks: planner.cost.activations). Traced at 2 and 4
    layers (SDPA: flash with dropout over grouped k/v, as CUDA runs it, probes/model_setup.py; eager:
    the dropped probabilities saved, not their compute-dtype copy), with and without checkpointing:
    model states to the byte, every phase within 1 % under and 5 % over the trace, one layer within
    2 %."""
    model = "bigcode/starcoder2-15b"
    cells = [dict(precision="bf16-mixed", checkpointing="none", micro_batch_size=2, seq_len=1024),
             dict(precision="bf16-pure", checkpointing="full", micro_batch_size=2, seq_len=1024),
             dict(precision="bf16-mixed", checkpointing="none", attention="eager", micro_batch_size=1, seq_len=1024)]
    traces = trace_many([request(model, layers=d, **cfg) for cfg in cells for d in (2, 4)], timeout=900, workers=2)
    for k, cfg in enumerate(cells):
        shallow, deep = traces[2 * k:2 * k + 2]
        assert not isinstance(shallow, str) and not isinstance(deep, str), (shallow, deep)
        compared = [compare_result(model, TrainingConfig(**cfg), 1, d, t) for d, t in ((2, shallow), (4, deep))]
        for c in compared:
            for t in c.terms:
                if t.term in STATES:
                    assert t.analytic == t.traced, (cfg, t)
                elif t.term.endswith(("_phase", "_peak")):
                    assert M.PEAK_FLOOR <= t.error <= 0.05, (cfg, c.layers, t.term, f"{t.error:+.2%}")
        layer = per_layer_comparison(compared[1], compared[0])
        assert abs(layer.error) <= M.LAYER_BAND, (cfg, layer.analytic, layer.traced, f"{layer.error:+.2%}")


@FULL
def test_starcoder2s_embedding_dropout_mask_is_the_traced_one():
    """The embedding dropout's mask, a ledger row outside the layers (kept until the backward
    reaches the embeddings): switching the dropout off lowers the forward and backward phases of
    the ledger by what it lowers the trace's, to the byte."""
    from planner.catalog.families import spec_from_config

    model, cfg = "bigcode/starcoder2-15b", TrainingConfig(precision="bf16-pure", checkpointing="full",
                                                          micro_batch_size=2, seq_len=1024)
    configs = [catalog()[model].config, catalog()[model].config | {"embedding_dropout": 0.0}]
    traces = trace_many([TraceRequest(config_json=c, config=cfg, layers=LAYERS) for c in configs], timeout=900, workers=2)
    phases = []
    for config_json, traced in zip(configs, traces, strict=True):
        assert not isinstance(traced, str), traced
        c = compare_result(model, cfg, 1, LAYERS, traced, spec=spec_from_config(config_json, model, "test"))
        phases.append({t.term: t for t in c.terms})
    for term in ("forward_phase", "backward_phase"):
        with_mask, without = phases[0][term], phases[1][term]
        assert with_mask.traced - without.traced == with_mask.analytic - without.analytic > 0, term


#: CI's optimizers, one of each way its states are held: torch's own, traced (AdamW, Adafactor's
#: factored rows, SGD); computed from the library's state rule (bitsandbytes 8-bit, torchao 4-bit,
#: Adam-mini); paged, out of the GPU's peak. The full suite traces every value.
CI_OPTIMIZERS = ("adamw", "adafactor", "sgd", "adamw-8bit", "adamw-4bit", "adam-mini", "paged-adamw-8bit")


@pytest.mark.heavy
def test_every_optimizer_kind_agrees_with_its_trace():
    """Every optimizer value (CI: one of each kind of state), traced: states the optimizer cannot hold on fake tensors
    (bitsandbytes, torchao, Adam-mini) are computed from its own state rule and held through
    every phase, as a real run holds them; paged state stays out of the GPU's peak. Each plan's
    model states agree to the byte and every phase within the traced tolerance."""
    from planner.strategies.optimizer import CHOICES

    assert set(CI_OPTIMIZERS) <= {str(o) for o in CHOICES}
    names = [str(o) for o in CHOICES if FULL_SUITE or str(o) in CI_OPTIMIZERS]
    requests = [request(SMOL, optimizer=name, micro_batch_size=1, seq_len=64) for name in names]
    for name, req, traced in zip(names, requests, trace_many(requests, timeout=900), strict=True):
        assert not isinstance(traced, str), f"{name}: {traced}"
        c = compare_result(SMOL, req.config, 1, LAYERS, traced)
        states = next(t for t in c.terms if t.term == "optimizer_states")
        assert states.analytic == states.traced, name
        assert c.agrees, (name, [(t.term, t.analytic, t.traced) for t in c.terms if not t.agrees])


def test_a_kbit_prepared_plan_is_not_traced():
    """The trace's 16-bit stand-ins for bitsandbytes' 4-bit layers return 16-bit outputs, where
    ``Linear4bit`` returns its fp32 input's dtype: a prepared base is refused with the way to
    probe it (exit 2), before any trace starts."""
    code, out = probe_cli("--gpus", "1xH100-80", "--adapter", "qlora", "--kbit-prep", "fp32-norms")
    assert code == 2 and "--kbit-prep fp32-norms is not traced" in out and "--fidelity measured" in out


LLAMA1 = "meta-llama/Llama-3.2-1B"  # 32 heads, 8 key/value heads


@pytest.mark.parametrize("seq_len, p", [(4096, 2), pytest.param(32768, 16, marks=FULL)])  # 16: k, v repeated
def test_ulysses_rank_traced_agrees_with_the_analytic_rows(seq_len, p):
    """A Ulysses rank traced under a fake process group of p ranks (DeepSpeed's own
    UlyssesSPAttentionHF, its exchange's registered fake) agrees with the ledger in every term and
    phase; and what it holds beyond a plan of seq/p tokens without Ulysses, in the traced forward
    (the output's all-to-all copy, one q-sized tensor a layer; with fewer key/value heads than p
    their repeated copies too), is the analytic difference to 2 %."""
    cfg = dict(sharding="none", precision="bf16-pure", loss="chunked", micro_batch_size=1)
    ulysses = request(LLAMA1, **cfg, seq_len=seq_len, sequence_parallel="ulysses", sp_size=p)
    plain = request(LLAMA1, **cfg, seq_len=seq_len // p)
    traced = dict(zip(("ulysses", "plain"), trace_many([ulysses, plain], timeout=900), strict=True))
    compared = {k: compare_result(LLAMA1, r.config, 1, LAYERS, traced[k]) for k, r in
                (("ulysses", ulysses), ("plain", plain))}
    bad = [f"{t.term}: {t.analytic:,} vs {t.traced:,}" for t in compared["ulysses"].terms if not t.agrees]
    assert not bad, bad
    assert any("UlyssesSPAttentionHF" in n for n in compared["ulysses"].notes)

    def forward(side):
        return {k: getattr(next(t for t in c.terms if t.term == "forward_phase"), side)
                for k, c in compared.items()}

    analytic, real = forward("analytic"), forward("traced")
    assert real["ulysses"] > real["plain"]
    assert analytic["ulysses"] - analytic["plain"] == pytest.approx(real["ulysses"] - real["plain"], rel=0.02)


@FULL  # (CI: the Ulysses rank's trace, test_ulysses_rank_traced_agrees_with_the_analytic_rows)
def test_probe_cli_traces_a_zero3_ulysses_plan():
    """`planner probe` of a ZeRO-3 Ulysses plan: model states from the partition rules, a rank's
    activations traced with Ulysses, and they agree."""
    code, out = probe_cli("--gpus", "8xH100-80", "--sharding", "zero3", "--sequence-parallel", "ulysses",
                          "--sp-size", "2", "--loss", "chunked", "--json")
    assert code == 0, out
    terms = {t["term"]: t for t in out["comparison"]["terms"]}
    assert terms["activations"]["source"] == "traced" and abs(terms["activations"]["analytic"]
                                                              / terms["activations"]["traced"] - 1) < 0.05
    assert any("UlyssesSPAttentionHF" in n for n in out["comparison"]["notes"])
