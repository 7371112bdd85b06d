"""The traced-probe cross-validation matrix: analytic vs traced, per term, and the error.

    python benchmarks/traced_matrix.py                 # the whole matrix: 792 plans at 2 layers, one child per core
    python benchmarks/traced_matrix.py --quick         # the covering subset CI runs (every pair of factor values)
    python benchmarks/traced_matrix.py --depths 1,3    # two depths: also one layer's activations (their difference)
    python benchmarks/traced_matrix.py --csv out.csv   # also write every row

The matrix is probes/matrix.py's (the one tests/test_traced.py takes its covering subset from).
Each plan is traced at each depth on fake tensors (probes/traced.py) and set beside the planner's
ledger for the same plan (probes/compare.py): parameters, gradients and optimizer states (exact),
activations (the forward phase less parameters and optimizer states), each phase's peak, the step
peak, and, with two depths, one layer's activations (their difference). Error = (analytic -
traced) / traced. The summary counts cells within 5 %; the exit code is 1 when any counted cell
misses at any depth (the assertion tests/test_traced.py makes on its subset), 0 otherwise.
"""

import argparse
import csv
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.catalog.models import catalog  # noqa: E402
from probes.compare import compare_result, per_layer_comparison  # noqa: E402
from probes.matrix import covering_subset, full_matrix, plan_fields  # noqa: E402
from probes.traced import TraceRequest, trace_many  # noqa: E402
from strategies import TrainingConfig  # noqa: E402

SHOWN = ("activations", "forward_phase", "backward_phase", "backward_end_phase", "step_phase")


def plans(quick: bool):
    for row in covering_subset() if quick else full_matrix():
        yield row["model"], row["world"], TrainingConfig(**plan_fields(row))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the covering subset CI runs")
    ap.add_argument("--depths", default="2", help="decoder layers traced per plan (two: also one layer's activations)")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--arch", action="append", help="only these catalog ids (repeatable)")
    args = ap.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    todo = [p for p in plans(args.quick) if not args.arch or p[0] in args.arch]
    requests = [TraceRequest(config_json=catalog()[arch].config, config=cfg, layers=depth, world_size=world)
                for arch, world, cfg in todo for depth in depths]
    start = time.perf_counter()
    results = trace_many(requests, timeout=7200, workers=max(1, os.cpu_count() or 1))
    rows, agree, total, failed = [], 0, 0, 0
    header = f"{'model':16} {'prec':10} {'ckpt':9} {'attn':5} {'loss':8} {'shape':7} {'shard':6} " + \
             " ".join(f"{t:>9}" for t in ("act", "fwd", "bwd", "bwd_end", "step", "peak", "layer")) + "  states"
    print(header)
    for k, (arch, world, cfg) in enumerate(todo):
        traced = results[len(depths) * k: len(depths) * (k + 1)]
        label = (f"{arch.split('/')[1][:16]:16} {cfg.precision:10} {cfg.checkpointing:9} {cfg.attention:5} "
                 f"{cfg.loss:8} {cfg.micro_batch_size}x{cfg.seq_len:<5} {cfg.sharding}{world if world > 1 else '':<2}")
        bad = next((r for r in traced if isinstance(r, str)), None)
        if bad is not None:
            print(label, "FAILED:", bad[:200])
            failed += 1
            continue
        comparisons = [compare_result(arch, cfg, world, d, r) for d, r in zip(depths, traced, strict=True)]
        deep = comparisons[-1]
        terms = {t.term: t for t in deep.terms}
        layer = per_layer_comparison(deep, comparisons[0]) if len(depths) > 1 else None
        cells = [terms[t] for t in SHOWN] + [deep.terms[-1]]
        states = all(terms[t].agrees for t in ("parameters", "gradients", "optimizer_states"))
        shown = cells + ([layer] if layer else [])
        print(label, " ".join(f"{c.error:+9.1%}{'' if c.agrees else '*'}" for c in shown),
              "  exact" if states else "  DIFFER")
        # counted: every term at every depth (states exact, the rest within 5 %); one layer's
        # activations are shown, not counted
        for c in comparisons:
            agree += sum(t.agrees for t in c.terms)
            total += len(c.terms)
        for c in list(deep.terms) + ([layer] if layer else []):
            rows.append({"model": arch, "precision": cfg.precision, "checkpointing": cfg.checkpointing,
                         "attention": cfg.attention, "loss": cfg.loss, "micro_batch_size": cfg.micro_batch_size,
                         "seq_len": cfg.seq_len, "sharding": cfg.sharding, "world_size": world, "layers": depths[-1],
                         "term": c.term, "analytic_bytes": c.analytic, "traced_bytes": c.traced,
                         "error": round(c.error, 5), "agrees": c.agrees})
    print(f"\n{agree}/{total} cells agree at depths {','.join(map(str, depths))} (states exact, the rest within 5 %; "
          f"* marks a miss; one layer's activations are shown, not counted); {failed} plans failed to trace; "
          f"{len(requests)} traces in {time.perf_counter() - start:.0f} s")
    if args.csv and rows:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0 if agree == total and not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
