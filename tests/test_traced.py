"""The traced fidelity against the analytic model (issue 6).

- The fake trace is faithful: its phase peaks equal a real-tensor run measured by the CPU
  allocator (torch profiler), including where autograd accumulates gradients in place.
- Model states agree to the byte over the matrix of six
  architectures x checkpointing x attention x two shapes x bf16-mixed/pure x standard/chunked loss
  (reduced depth); activations and the step peak within 5 % is still open there (a strict
  xfail: it fails the day it passes); FSDP2 at 2 and 8 ranks: model states exact. benchmarks/traced_matrix.py prints
  the whole matrix with every term, one layer's activations and FSDP's errors.
"""

import functools
import itertools

import pytest

from planner.catalog.models import catalog
from planner.vocabulary import TrainingConfig

pytest.importorskip("torch")
pytest.importorskip("transformers")
from probes.compare import compare_result  # noqa: E402
from probes.traced import TraceRequest, trace, trace_many  # noqa: E402

QWEN = "Qwen/Qwen2.5-0.5B"  # biases, GQA, tied embeddings
ARCHS = ("meta-llama/Llama-3.2-1B", QWEN, "mistralai/Mistral-7B-v0.3", "google/gemma-2-2b",
         "microsoft/Phi-3-mini-4k-instruct", "openai-community/gpt2")
LAYERS = 2


def request(model, layers=LAYERS, world=1, **cfg) -> TraceRequest:
    return TraceRequest(config_json=catalog()[model].config, config=TrainingConfig(**cfg), layers=layers,
                        world_size=world)


@pytest.mark.parametrize("precision", ["bf16-pure", "bf16-mixed", "fp32"])
def test_model_states_match_to_the_byte(precision):
    req = request(QWEN, precision=precision, optimizer="adamw", micro_batch_size=1, seq_len=64)
    c = compare_result(QWEN, req.config, 1, LAYERS, trace(req, timeout=900))
    for term in ("parameters", "gradients", "optimizer_states"):
        t = next(t for t in c.terms if t.term == term)
        assert t.analytic == t.traced, term
    assert any("CPU" in note for note in c.notes)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-pure"])
def test_fake_trace_equals_the_real_allocator(precision):
    """Tied embeddings: autocast's fp32 upcast is accumulated in place (bf16-mixed), the matmul's
    view is not (bf16-pure). The fake trace with the tracker's in-place rule must reproduce the
    real CPU allocator's phase peaks (above the iteration's start) in both."""
    from probes.real_cpu import real_phase_increments

    req = request(QWEN, precision=precision, micro_batch_size=1, seq_len=64)
    fake = trace(req, timeout=300)
    real = real_phase_increments(req)
    increments = {p: v - fake.baseline_bytes for p, v in fake.phase_peaks.items()}
    # the tracker's forward phase runs into backward (up to the last layer), the profiler's spans
    # do not: compare forward + backward as one, where the tied accumulation is the peak
    assert max(increments["forward"], increments["backward"]) == max(real["forward"], real["backward"])
    assert abs(increments["step"] - real["step"]) <= 64  # python-side scalars
    assert fake.inplace_adds > 0


def test_failures_and_timeouts_are_errors_not_crashes():
    bad = TraceRequest(config_json={"model_type": "llama", "hidden_size": 7, "num_attention_heads": 2},
                       config=TrainingConfig(seq_len=8))
    with pytest.raises(RuntimeError, match="traced probe failed"):
        trace(bad, timeout=120)
    with pytest.raises(RuntimeError, match="timed out"):
        trace(request(QWEN, seq_len=64), timeout=0.5)


def matrix(model):
    for ck, attn, (b, s), prec, loss in itertools.product(
            ("none", "selective", "full"), ("sdpa", "eager"), ((1, 512), (4, 128)), ("bf16-mixed", "bf16-pure"),
            ("standard", "chunked")):
        if attn == "sdpa" and model.startswith("google/gemma-2"):
            continue  # transformers' Gemma2 refuses sdpa; the planner rejects the plan
        yield dict(checkpointing=ck, attention=attn, micro_batch_size=b, seq_len=s, precision=prec, loss=loss)


@functools.cache
def matrix_comparisons(model):
    plans = list(matrix(model))
    results = trace_many([request(model, **p) for p in plans], timeout=1800)
    out = []
    for plan, traced in zip(plans, results, strict=True):
        assert not isinstance(traced, str), f"{plan}: {traced}"
        out.append((plan, compare_result(model, TrainingConfig(**plan), 1, LAYERS, traced)))
    return out


def misses(model, terms):
    return [f"{plan} {t.term}: analytic {t.analytic:,} traced {t.traced:,} ({t.error:+.2%})"
            for plan, c in matrix_comparisons(model) for t in c.terms if t.term in terms and not t.agrees]


@pytest.mark.parametrize("model", ARCHS)
def test_matrix_model_states_exact(model):
    assert not misses(model, ("parameters", "gradients", "optimizer_states"))


@pytest.mark.xfail(strict=True, reason="open (issue 6): the backward phase over-counts one layer's activations next to "
                   "the finished gradients; with the chunked loss and with eager attention the step peak is 5-13 % high")
@pytest.mark.parametrize("model", ARCHS)
def test_matrix_activations_and_step_peak_within_5_percent(model):
    missed = misses(model, ("activations", "step_peak"))
    assert not missed, "\n".join(missed)


@pytest.mark.parametrize("world", [2, 8])
def test_fsdp_rank_states_exact(world):
    """One rank of an FSDP2 run under a fake process group: the sharded parameters, gradients and
    optimizer states are exactly the ledger's (padded) shards."""
    plans = [dict(sharding="fsdp", precision=p, checkpointing=ck, micro_batch_size=2, seq_len=128)
             for p in ("bf16-mixed", "bf16-pure") for ck in ("none", "full")]
    for model in ("meta-llama/Llama-3.2-1B", QWEN):
        results = trace_many([request(model, world=world, **p) for p in plans], timeout=900)
        for plan, traced in zip(plans, results, strict=True):
            assert not isinstance(traced, str), f"{plan}: {traced}"
            c = compare_result(model, TrainingConfig(**plan), world, LAYERS, traced)
            for t in c.terms[:3]:
                assert t.agrees, f"{model} {plan} {t.term}: {t.analytic:,} vs {t.traced:,}"
