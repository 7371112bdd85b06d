"""Ulysses live on the CPU: two gloo ranks of a tiny Llama through DeepSpeed's own
UlyssesSPAttentionHF (registered as accelerate registers it) against one rank without it
(tests/tools/ulysses_ranks.py): the same loss and gradients, and each rank saves what the planner
says: about half of one rank's activations, exactly those of a sequence half as long plus the
rows Ulysses adds (planner/cost/activations.py ``_attention_core``)."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FULL

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "data" / "tiny-llama"
SCRIPT = ROOT / "tests" / "tools" / "ulysses_ranks.py"
SEQ = 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(seq: int, world: int) -> list[dict]:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(TINY), str(seq), str(rank), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for rank in range(world)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][1][-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@FULL  # (CI: the zero3-ulysses launch runs the same two ranks live, tests/test_launch_live.py)
def test_two_ulysses_ranks_train_as_one_and_save_half():
    from planner.catalog.models import resolve_model
    from planner.cost import activations

    one, = _run(SEQ, 1)
    half, = _run(SEQ // 2, 1)
    ranks = _run(SEQ, 2)
    for r in ranks:
        assert r["loss"] == pytest.approx(one["loss"], rel=1e-6)
        assert r["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert ranks[0]["saved_bytes"] == ranks[1]["saved_bytes"]
    assert 0.5 <= ranks[0]["saved_bytes"] / one["saved_bytes"] < 0.55
    m = resolve_model(str(TINY))
    dt = activations.DTypes(4, 4)  # fp32
    per_token = (activations.total(activations.layer_saved(m, dt, True, SEQ, sp=2, heads=2))
                 - activations.total(activations.layer_saved(m, dt, True, SEQ // 2)))
    added = per_token * m.num_layers * SEQ // 2
    assert added > 0
    # (and the gathered position ids, 8 bytes a position: not a row of the ledger)
    assert ranks[0]["saved_bytes"] - half["saved_bytes"] == pytest.approx(added, rel=0.05)
