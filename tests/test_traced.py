"""The traced fidelity against the analytic model: model states agree to the byte.

Activations and the step peak are compared by issue 6's cross-validation matrix; here, what
already holds exactly, on a reduced-depth Qwen2.5 (biases, GQA, tied embeddings)."""

import pytest

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import catalog, resolve_model
from planner.estimate import estimate_config
from planner.ledger import Location
from planner.vocabulary import TrainingConfig

pytest.importorskip("torch")
pytest.importorskip("transformers")
from probes.traced import TraceRequest, trace  # noqa: E402

MODEL = "Qwen/Qwen2.5-0.5B"


def analytic(config: TrainingConfig, layers: int):
    spec = resolve_model(MODEL).model_copy(update={"num_layers": layers})
    return estimate_config(spec, parse_gpus("1xH100-80"), config)


def gpu(result, *terms) -> int:
    return sum(r.bytes for r in result.ledger if r.term in terms and r.location == Location.GPU)


@pytest.mark.parametrize("precision", ["bf16-pure", "bf16-mixed", "fp32"])
def test_model_states_match_to_the_byte(precision):
    config = TrainingConfig(precision=precision, optimizer="adamw", micro_batch_size=1, seq_len=64)
    traced = trace(TraceRequest(config_json=catalog()[MODEL].config, config=config, layers=2), timeout=300)
    a = analytic(config, 2)
    assert traced.parameters_bytes == gpu(a, "weights", "master_weights")
    assert traced.gradients_bytes == gpu(a, "gradients")
    assert traced.optimizer_state_bytes == gpu(a, "optimizer_states")
    assert traced.peak_bytes > traced.parameters_bytes + traced.optimizer_state_bytes
    assert any("CPU" in note for note in traced.notes)


def test_failures_and_timeouts_are_errors_not_crashes():
    bad = TraceRequest(config_json={"model_type": "llama", "hidden_size": 7, "num_attention_heads": 2},
                       config=TrainingConfig(seq_len=8))
    with pytest.raises(RuntimeError, match="traced probe failed"):
        trace(bad, timeout=120)
    slow = TraceRequest(config_json=catalog()[MODEL].config, config=TrainingConfig(seq_len=64), layers=2)
    with pytest.raises(RuntimeError, match="timed out"):
        trace(slow, timeout=0.5)


def test_forward_activations_and_logits_within_5_percent_bf16_pure():
    """One point of issue 6's matrix, already held: bf16 weights, SDPA, no checkpointing. The
    trace's activations and temporaries at the peak (which comes at the start of backward) against
    the analytic forward-phase activations and logits."""
    config = TrainingConfig(precision="bf16-pure", optimizer="adamw", micro_batch_size=2, seq_len=256)
    traced = trace(TraceRequest(config_json=catalog()[MODEL].config, config=config, layers=2), timeout=300)
    a = analytic(config, 2)
    forward = sum(r.bytes for r in a.ledger if r.term in ("activations", "logits") and "forward" in r.phases)
    assert traced.activations_peak_bytes == pytest.approx(forward, rel=0.05)
