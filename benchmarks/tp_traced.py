"""A tensor-parallel rank traced against planner's ledger, beside the same plan without tensor
parallelism: the groundwork of the traced probe's TP cells (issue 39).

A tiny Llama is built on fake tensors over a fake process group of T x D ranks, split by
transformers' own plan (``_resolve_parallel_plans`` of ``DistributedConfig(tp_size=T,
fsdp_size=D)``, ``apply_tensor_parallelism`` on the tp mesh), then sharded by planner's FSDP2 units
over the fsdp mesh (planner/runtime/sharding.py ``apply_fsdp``: each decoder layer and the root, as
accelerate wraps; transformers' own plan makes the embeddings a unit of their own), and two steps
run under planner's FSDP step tracker (probes/tracker.py) with the plan's optimizer as the traced
probe builds it. FSDP2's sharding spec of a TP parameter concatenates the two meshes, which reads
a real tensor: that one call runs outside fake mode. Prints each phase's traced peak and planner's
(its GPU rows but the context and the allocator's reserve), with and without T.

    python benchmarks/tp_traced.py [--tp 2] [--fsdp 2] [--tokens 128] [--micro-batch 2]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096, "tie_word_embeddings": False,
        "torch_dtype": "float32"}

CHILD = r"""
import json, sys, torch
from planner.probes.model_setup import fake_process_group
T, D, S, B = (int(x) for x in sys.argv[1:5])
fake_process_group(T * D)
import transformers
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from transformers.distributed import DistributedConfig
from transformers.distributed.tensor_parallel import apply_tensor_parallelism
from transformers.initialization import no_tie_weights
from planner.probes.tracker import fsdp_step_tracker
from planner.runtime.optimizer import build as build_optimizer
from planner.runtime.sharding import apply_fsdp
from planner.strategies import TrainingConfig

concatenate = DeviceMesh._concatenate

def real_concatenate(*args, **kwargs):
    with unset_fake_temporarily():
        return concatenate(*args, **kwargs)

DeviceMesh._concatenate = staticmethod(real_concatenate)
cfg = transformers.AutoConfig.for_model(**json.loads(sys.argv[5]))
cfg._attn_implementation = "sdpa"
tp = {"tensor_parallel": "transformers", "tp_size": T} if T > 1 else {}
c = TrainingConfig(sharding="fsdp", precision="bf16-mixed", micro_batch_size=B, seq_len=S, **tp)
mesh = init_device_mesh("cpu", (D, T), mesh_dim_names=("fsdp", "tp"))
with FakeTensorMode(allow_non_fake_inputs=True):
    with no_tie_weights():
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if T > 1:
        plan, _, _ = model._resolve_parallel_plans(DistributedConfig(tp_size=T, fsdp_size=D))
        apply_tensor_parallelism(model, mesh["tp"], plan)
    model.tie_weights()
    apply_fsdp(model, c, mesh["fsdp"])
    optimizer = build_optimizer("adamw", model, cfg, fused=True, fake=True)
    tracker = fsdp_step_tracker(model, optimizer)
    ids = torch.randint(0, cfg.vocab_size, (B, S))
    with tracker:
        for i in range(2):
            tracker.measuring = i == 1
            tracker.phase = "forward"
            loss = model(input_ids=ids, labels=ids).loss
            tracker.start_backward()
            loss.backward()
            del loss
            tracker.phase = "step"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i == 0:
                tracker.reset_mod_stats()
print(json.dumps({k: int(v) for k, v in tracker.phase_peaks.items()}))
"""


def traced(t: int, d: int, tokens: int, micro_batch: int, config: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(t), str(d), str(tokens), str(micro_batch), json.dumps(config)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out.splitlines()[-1])


def analytic(path: str, t: int, d: int, tokens: int, micro_batch: int) -> dict:
    from planner.core.ledger import Location, Phase, phase_sum
    from planner.probes.compare import UNTRACED, analytic_result
    from planner.strategies import TrainingConfig

    tp = {"tensor_parallel": "transformers", "tp_size": t} if t > 1 else {}
    c = TrainingConfig(sharding="fsdp", precision="bf16-mixed", micro_batch_size=micro_batch, seq_len=tokens, **tp)
    rows = [r for r in analytic_result(path, c, t * d, None).ledger
            if r.location == Location.GPU and r.term not in UNTRACED]
    return {p.value: phase_sum(rows, p, Location.GPU) for p in Phase}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--fsdp", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2)
    args = ap.parse_args()
    config = TINY | {"max_position_embeddings": args.tokens}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config))
        print(f"tiny Llama (h 256, 4 layers, V 4096), bf16-mixed, {args.micro_batch} x {args.tokens} tokens; "
              "bytes per rank, planner vs traced")
        print(f"{'layout':18s} {'phase':13s} {'planner':>12s} {'traced':>12s} {'error':>8s}")
        for t, d in ((args.tp, args.fsdp), (1, args.tp * args.fsdp)):
            found = traced(t, d, args.tokens, args.micro_batch, config)
            ours = analytic(str(path), t, d, args.tokens, args.micro_batch)
            for phase, value in found.items():
                words = f"TP {t} x FSDP {d}" if t > 1 else f"FSDP {d}"
                print(f"{words:18s} {phase:13s} {ours[phase]:12,d} {value:12,d} {(ours[phase] - value) / value:+8.1%}")


if __name__ == "__main__":
    main()
