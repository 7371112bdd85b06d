"""The traced-probe cross-validation matrix: analytic vs traced, per term, and the error.

    python benchmarks/traced_matrix.py                 # the whole matrix (1,584 traces, one child per core)
    python benchmarks/traced_matrix.py --quick         # one shape, one loss, sharding none
    python benchmarks/traced_matrix.py --csv out.csv   # also write every row

Each plan is traced at depths 1 and 3 on fake tensors (probes/traced.py) and set beside the
planner's ledger for the same plan (probes/compare.py): parameters, gradients and optimizer states
(exact), activations (the forward phase less parameters and optimizer states), each phase's peak,
the step peak, and one layer's activations (the difference of the two depths). Error =
(analytic - traced) / traced. Rows print as they finish; the summary counts cells within 5 %.
"""

import argparse
import csv
import itertools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.catalog.models import catalog  # noqa: E402
from strategies import TrainingConfig  # noqa: E402
from probes.compare import compare_result, per_layer_comparison  # noqa: E402
from probes.traced import TraceRequest, trace_many  # noqa: E402

ARCHS = ("meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "mistralai/Mistral-7B-v0.3", "google/gemma-2-2b",
         "microsoft/Phi-3-mini-4k-instruct", "openai-community/gpt2")
SHAPES = ((1, 512), (4, 128))  # micro-batch x sequence
DEPTHS = (1, 3)


def plans(quick: bool):
    shardings = (("none", 1),) if quick else (("none", 1), ("fsdp", 2), ("fsdp", 8))
    losses = ("standard",) if quick else ("standard", "chunked")
    shapes = SHAPES[:1] if quick else SHAPES
    for arch, ck, attn, (b, s), prec, loss, (sharding, world) in itertools.product(
            ARCHS, ("none", "selective", "full"), ("sdpa", "eager"), shapes, ("bf16-mixed", "bf16-pure"), losses,
            shardings):
        if attn == "sdpa" and arch.startswith("google/gemma-2"):
            continue  # transformers' Gemma2 refuses sdpa (the planner rejects the plan too)
        yield arch, world, TrainingConfig(precision=prec, checkpointing=ck, attention=attn, loss=loss,
                                          micro_batch_size=b, seq_len=s, sharding=sharding)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--arch", action="append", help="only these catalog ids (repeatable)")
    args = ap.parse_args()
    todo = [p for p in plans(args.quick) if not args.arch or p[0] in args.arch]
    requests = [TraceRequest(config_json=catalog()[arch].config, config=cfg, layers=depth, world_size=world)
                for arch, world, cfg in todo for depth in DEPTHS]
    start = time.perf_counter()
    results = trace_many(requests, timeout=7200, workers=max(1, os.cpu_count() or 1))
    rows, agree, total = [], 0, 0
    header = f"{'model':16} {'prec':10} {'ckpt':9} {'attn':5} {'loss':8} {'shape':7} {'shard':6} " + \
             " ".join(f"{t:>9}" for t in ("act", "fwd", "bwd", "bwd_end", "step", "peak", "layer")) + "  states"
    print(header)
    for k, (arch, world, cfg) in enumerate(todo):
        lo, hi = results[2 * k], results[2 * k + 1]
        label = (f"{arch.split('/')[1][:16]:16} {cfg.precision:10} {cfg.checkpointing:9} {cfg.attention:5} "
                 f"{cfg.loss:8} {cfg.micro_batch_size}x{cfg.seq_len:<5} {cfg.sharding}{world if world > 1 else '':<2}")
        if isinstance(lo, str) or isinstance(hi, str):
            print(label, "FAILED:", (lo if isinstance(lo, str) else hi)[:200])
            continue
        deep, shallow = (compare_result(arch, cfg, world, d, r) for d, r in ((DEPTHS[1], hi), (DEPTHS[0], lo)))
        terms = {t.term: t for t in deep.terms}
        terms["layer_activations"] = per_layer_comparison(deep, shallow)
        shown = ("activations", "forward_phase", "backward_phase", "backward_end_phase", "step_phase")
        cells = [terms[t] for t in shown] + [deep.terms[-1], terms["layer_activations"]]
        states = all(terms[t].agrees for t in ("parameters", "gradients", "optimizer_states"))
        print(label, " ".join(f"{c.error:+9.1%}{'' if c.agrees else '*'}" for c in cells), "  exact" if states else "  DIFFER")
        agree += sum(c.agrees for c in cells[:-1]) + states  # one layer's activations: shown, not counted
        total += len(cells)
        for c in list(deep.terms) + [terms["layer_activations"]]:
            rows.append({"model": arch, "precision": cfg.precision, "checkpointing": cfg.checkpointing,
                         "attention": cfg.attention, "loss": cfg.loss, "micro_batch_size": cfg.micro_batch_size,
                         "seq_len": cfg.seq_len, "sharding": cfg.sharding, "world_size": world, "layers": DEPTHS[1],
                         "term": c.term, "analytic_bytes": c.analytic, "traced_bytes": c.traced,
                         "error": round(c.error, 5), "agrees": c.agrees})
    print(f"\n{agree}/{total} cells agree (states exact, the rest within 5 %; * marks a miss; one layer's "
          f"activations are shown, not counted); "
          f"{len(requests)} traces in {time.perf_counter() - start:.0f} s")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
