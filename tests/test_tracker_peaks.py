"""The active-module peaks (probes/active_peaks.py) against torch's own walk over every module.

The traced probe updates module peaks only for the modules an op runs inside; torch's MemTracker
walks every module it has seen. On small models (2 layers, 64 tokens) across checkpointing, LoRA
and FSDP2, each plan is traced twice in one child process (tests/tools/peak_walks.py): the two
traces must report the same bytes (every phase's peak and categories), the same tracker peak, and
every module's same local peaks and peak snapshots; and after every op of the indexed trace,
torch's walk on the same state must find no module left to raise.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.catalog.models import catalog
from planner.strategies import TrainingConfig

from helpers import FULL

pytest.importorskip("torch")
pytest.importorskip("transformers")
from planner.probes.traced import TraceRequest  # noqa: E402

TOOL = Path(__file__).parent / "tools" / "peak_walks.py"
ROOT = Path(__file__).resolve().parent.parent
QWEN = "Qwen/Qwen2.5-0.5B"  # biases, GQA, tied embeddings
SMOL = "HuggingFaceTB/SmolLM2-135M"  # Llama's layer


def _request(model: str, world: int = 1, **cfg) -> TraceRequest:
    return TraceRequest(config_json=catalog()[model].config, layers=2, world_size=world,
                        config=TrainingConfig(**({"micro_batch_size": 2, "seq_len": 64} | cfg)))


PLANS = {  # one child each; CI: FSDP2 at two ranks with checkpointing, the full suite adds one rank's
    "1-smol": [_request(SMOL, adapter="lora", checkpointing="full"), _request(SMOL, checkpointing="selective", loss="chunked")],
    "1-qwen": [_request(QWEN), _request(QWEN, checkpointing="full")],
    "2-qwen": [_request(QWEN, world=2, sharding="fsdp", checkpointing="full")],
}


@pytest.mark.parametrize("plans", [pytest.param(k, marks=FULL if k.startswith("1-") else ()) for k in PLANS])
def test_active_module_peaks_equal_torchs_walk_over_every_module(plans):
    payload = json.dumps([r.model_dump(mode="json") for r in PLANS[plans]])
    proc = subprocess.run([sys.executable, str(TOOL)], input=payload, capture_output=True, text=True, timeout=900,
                          cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for req, pair in zip(PLANS[plans], json.loads(proc.stdout.splitlines()[-1]), strict=True):
        torch_walk, indexed = pair["torch"], pair["indexed"]
        plan = f"{req.config_json['model_type']} {req.config.checkpointing} {req.config.adapter} {req.config.sharding}"
        assert indexed["checked_ops"] > 1000, plan
        assert indexed["missed"] == 0, plan
        assert indexed["result"] == torch_walk["result"], plan
        assert indexed["peak"] == torch_walk["peak"], plan
        assert indexed["modules"] == torch_walk["modules"], plan
        # every module has its stats; FSDPMemTracker's only the fully_shard units (each layer and the root)
        assert len(indexed["modules"]) >= (2 + 1 if req.world_size > 1 else 20), plan
