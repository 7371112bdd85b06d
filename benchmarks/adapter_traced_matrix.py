"""Adapters' traced matrix: the analytic memory model of LoRA, QLoRA and DoRA plans against traces.

    python benchmarks/adapter_traced_matrix.py                 # 112 cells (~2 min on 2 cores)
    python benchmarks/adapter_traced_matrix.py --csv out.csv

Cells: 4 families x 4 adapters x checkpointing x precision on one GPU (64), and FSDP2 at 2 ranks:
4 families x 3 adapters (QLoRA is not planned under FSDP yet) x fsdp / fsdp-grad-op x
checkpointing, bf16-mixed (48). Each cell is the peft-wrapped model traced on fake tensors at 2
decoder layers (probes/traced.py: QLoRA over the 16-bit base with its NF4 bytes computed; FSDP2
under a fake process group, one rank traced) beside the planner's ledger of the same plan
(probes/compare.py), 2 x 1024 tokens. Error = (analytic - traced) / traced, positive when the
model over-estimates. Model states (parameters, gradients, optimizer states) must agree exactly.
Prints one row per cell and the worst errors; exit code 1 when a model state differs, a cell's step
peak is more than 1 % under the trace (issue 17's target), or a cell fails to trace.
"""

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.catalog.models import catalog  # noqa: E402
from planner.probes.compare import compare_result  # noqa: E402
from planner.probes.matrix import PEAK_FLOOR  # noqa: E402
from planner.probes.traced import TraceRequest, trace_many  # noqa: E402
from planner.strategies import TrainingConfig  # noqa: E402

MODELS = ("meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "microsoft/Phi-3-mini-4k-instruct", "openai-community/gpt2")
ADAPTERS = (("lora", {}), ("qlora", {}), ("dora", {"lora_targets": "attention"}),
            ("lora", {"lora_targets": "attention", "lora_dropout": 0.0}))
TERMS = ("parameters", "gradients", "optimizer_states", "activations", "forward_phase", "backward_phase", "step_peak")
SHORT = {"parameters": "params", "gradients": "grads", "optimizer_states": "states", "activations": "act",
         "forward_phase": "fwd", "backward_phase": "bwd", "step_peak": "peak"}


FSDP_RANKS = 2


def cells() -> list[tuple[str, TrainingConfig, int]]:
    """(model, plan, ranks) of every cell."""
    shape = dict(micro_batch_size=2, seq_len=1024)
    single = [(m, TrainingConfig(adapter=a, checkpointing=ck, precision=p, **shape, **extra), 1)
              for m in MODELS for a, extra in ADAPTERS for ck in ("none", "full") for p in ("bf16-mixed", "bf16-pure")]
    sharded = [(m, TrainingConfig(adapter=a, checkpointing=ck, sharding=s, **shape, **extra), FSDP_RANKS)
               for m in MODELS for a, extra in ADAPTERS if a != "qlora" for s in ("fsdp", "fsdp-grad-op")
               for ck in ("none", "full")]
    return single + sharded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rows = cells()
    start = time.perf_counter()
    traces = trace_many([TraceRequest(config_json=catalog()[m].config, config=c, layers=2, world_size=w)
                         for m, c, w in rows],
                        timeout=1800, workers=args.workers)
    print(f"{len(rows)} cells traced in {time.perf_counter() - start:.0f} s; error = (analytic - traced) / traced")
    print(f"{'model':14s} {'adapter':22s} {'ckpt':4s} {'precision':10s} {'sharding':12s} "
          + " ".join(f"{SHORT[t]:>7s}" for t in TERMS))
    table, failed, bad = [], 0, []
    for (m, c, w), t in zip(rows, traces):
        name = f"{c.adapter} {c.lora_targets}" + (" d0" if not c.lora_dropout else "")
        if isinstance(t, str):
            failed += 1
            print(f"{m.split('/')[1][:14]:14s} {name:22s} FAILED {t[:200]}")
            continue
        errors = {x.term: x.error for x in compare_result(m, c, w, 2, t).terms}
        sharding = str(c.sharding) + (f"x{w}" if w > 1 else "")
        table.append({"model": m, "adapter": name, "checkpointing": str(c.checkpointing),
                      "precision": str(c.precision), "sharding": sharding} | {k: errors[k] for k in TERMS})
        print(f"{m.split('/')[1][:14]:14s} {name:22s} {c.checkpointing:4s} {c.precision:10s} {sharding:12s} "
              + " ".join(f"{errors[k]:+7.1%}" for k in TERMS))
        if any(errors[k] != 0 for k in ("parameters", "gradients", "optimizer_states")) or errors["step_peak"] < PEAK_FLOOR:
            bad.append(f"{m} {name} {c.checkpointing} {c.precision} {sharding}")
    for term in TERMS[3:]:
        values = [r[term] for r in table]
        print(f"{term}: median {statistics.median(values):+.1%}, worst under {min(values):+.1%}, worst over {max(values):+.1%}")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    if bad or failed:
        print(f"missed: {len(bad)} cells ({'; '.join(bad[:5])}), {failed} failed to trace")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
