"""The persistent trace child of ``planner tune --fidelity traced`` (probes/trace_worker.py).

- A reused child answers what a fresh child answers, byte for byte, whatever ran before it
  (another model, checkpointing, LoRA, a failed request).
- A request that fails, a child that dies mid-trace and a trace that overruns its timeout are each a
  ProbeFailedError, as ``trace``'s are; the next request gets an answer (a new child where the old
  one is gone).
"""

import os
import signal
import threading
import time

import pytest

from planner.catalog.models import catalog
from planner.core.errors import ProbeFailedError
from planner.strategies import TrainingConfig

from helpers import FULL

pytest.importorskip("torch")
pytest.importorskip("transformers")
from planner.probes.trace_worker import TraceWorker  # noqa: E402
from planner.probes.traced import TraceRequest, trace_many  # noqa: E402

QWEN = "Qwen/Qwen2.5-0.5B"
SMOL = "HuggingFaceTB/SmolLM2-135M"


def _request(model: str, layers: int | None = 2, **cfg) -> TraceRequest:
    """Qwen2.5-0.5B's layers with a vocabulary of 8,192 (its 151,936 would make the embedding most of
    the trace's time; the child's reuse is what is tested)."""
    config = catalog()[model].config | ({"vocab_size": 8192} if model == QWEN else {})
    return TraceRequest(config_json=config, layers=layers,
                        config=TrainingConfig(**({"micro_batch_size": 1, "seq_len": 64} | cfg)))


BAD = TraceRequest(config_json={"model_type": "llama", "hidden_size": 7, "num_attention_heads": 2},
                   config=TrainingConfig(seq_len=8))


def _bytes(result) -> dict:
    return result.model_dump(exclude={"seconds"})


def test_one_child_survives_a_failed_request_and_undoes_each_trace():
    """CI's share (the full suite compares with fresh children, below): after a request the child
    answers with an error, one child traces a LoRA plan with full checkpointing between two traces
    of a plain plan, and the plain plan's two answers are the same bytes (the adapter's patches undone)."""
    plain, lora = _request(QWEN), _request(SMOL, checkpointing="full", adapter="lora")
    with TraceWorker() as worker:
        with pytest.raises(ProbeFailedError, match="traced probe failed"):
            worker.trace(BAD, timeout=300)
        first, _, again = (worker.trace(p, timeout=600) for p in (plain, lora, plain))
        assert worker.started == 1
    assert _bytes(first) == _bytes(again)


@pytest.mark.heavy
@FULL  # (CI: one child's answers before and after another plan, above)
def test_a_reused_child_answers_as_fresh_children_do():
    plans = [_request(QWEN), _request(SMOL, checkpointing="full", adapter="lora")]
    fresh = [trace_many([p], timeout=600)[0] for p in plans]  # one child each
    with TraceWorker() as worker:
        with pytest.raises(ProbeFailedError, match="traced probe failed"):
            worker.trace(BAD, timeout=300)
        reused = [worker.trace(p, timeout=600) for p in [*plans, plans[0]]]
        assert worker.started == 1
    for plan, got in zip([*plans, plans[0]], reused, strict=True):
        assert _bytes(got) == _bytes(fresh[plans.index(plan)])


@FULL  # CI: a failed request (above); the probes' own timeouts (tests/test_measured.py)
def test_a_dead_or_late_child_is_a_clean_failure_and_replaced():
    plan = _request(QWEN)
    slow = _request(SMOL, layers=None, seq_len=2048)  # 30 layers: seconds of tracing
    with TraceWorker() as worker:
        first = worker.trace(plan, timeout=600)
        pid = worker._proc.pid
        threading.Timer(0.5, lambda: os.killpg(pid, signal.SIGKILL)).start()
        with pytest.raises(ProbeFailedError, match="probe process died"):
            worker.trace(slow, timeout=600)
        assert _bytes(worker.trace(plan, timeout=600)) == _bytes(first)
        assert worker.started == 2
        start = time.perf_counter()
        with pytest.raises(ProbeFailedError, match="timed out"):
            worker.trace(slow, timeout=0.5)
        assert time.perf_counter() - start < 30  # the child's group killed, not waited for
        assert _bytes(worker.trace(plan, timeout=600)) == _bytes(first)
        assert worker.started == 3
