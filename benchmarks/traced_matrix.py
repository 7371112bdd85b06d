"""The traced-probe cross-validation matrix: the analytic memory model against traces, cell by cell.

    python benchmarks/traced_matrix.py                      # both parts, one child per core (~37 min on 2 cores)
    python benchmarks/traced_matrix.py --part layers        # one layer's activations: 300 cells at 2 and 4 layers
    python benchmarks/traced_matrix.py --part steps         # the whole step: 229 cells at full depth
    python benchmarks/traced_matrix.py --quick              # CI's covering subset (tests/test_traced.py)
    python benchmarks/traced_matrix.py --table docs/traced-matrix.md --csv out.csv

The matrix is probes/matrix.py's. Each cell is traced on fake tensors (probes/traced.py) and set
beside the planner's ledger for the same plan (probes/compare.py). Error = (analytic - traced) /
traced, positive when the model over-estimates (the safe side). Terms: activations (the forward
phase less parameters and optimizer states), each phase's peak, the step peak, and, in the layer
part, one layer's activations ((depth 4 - depth 2) / 2, so embeddings and loss cancel).

The safety target (issue 17): no cell's step peak more than 1 % under the trace; one layer within
2 % in every cell; median |error| at most 2 % for activations, one layer and every phase. The exit
code is 1 when a target is missed or a cell fails to trace, else 0.
"""

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.catalog.models import resolve_model  # noqa: E402
from planner.cost.params import total_parameters  # noqa: E402
from planner.probes import matrix as M  # noqa: E402
from planner.probes.compare import compare_result, per_layer_comparison, same_moment  # noqa: E402
from planner.probes.extrapolate import extrapolate_trace  # noqa: E402
from planner.probes.traced import TraceRequest, trace_many  # noqa: E402
from planner.strategies import TrainingConfig  # noqa: E402

TERMS = ("activations", "forward_phase", "backward_phase", "backward_end_phase", "step_phase", "step_peak")
SHORT = {"activations": "act", "forward_phase": "fwd", "backward_phase": "bwd", "backward_end_phase": "bwd_end",
         "step_phase": "step", "step_peak": "peak", "layer_activations": "layer"}


def cells(part: str, quick: bool) -> list[tuple[str, dict, tuple]]:
    """(part, row, depths) of every cell to trace."""
    if quick:
        return [("ci", r, (M.CI_DEPTH, M.LAYER_DEPTHS[-1])) for r in M.covering_subset()]
    out = []
    if part in ("layers", "all"):
        out += [("layers", r, M.LAYER_DEPTHS) for r in M.layer_matrix()]
    if part in ("steps", "all"):
        for r in M.step_matrix():
            spec = resolve_model(r["model"])
            out.append(("steps", r, M.depths(r["model"], total_parameters(spec), spec.num_layers)))
    return out


def evaluate(part: str, row: dict, depths: tuple, traced: list) -> dict:
    """One cell's result: its terms' errors (at full depth for a step cell, at the deeper depth
    otherwise), one layer's error where two depths were traced, and notes."""
    cfg = TrainingConfig(**M.plan_fields(row))
    notes, layer = [], None
    if part == "steps" and depths != (None,):
        full, bent = extrapolate_trace(list(zip(depths, traced, strict=True)), resolve_model(row["model"]).num_layers)
        deep = compare_result(row["model"], cfg, M.world(row), None, full)
        notes.append(f"linearity: {', '.join(bent)} off the line" if bent else "linear in depth")
    else:
        comparisons = [compare_result(row["model"], cfg, M.world(row), d, t) for d, t in zip(depths, traced, strict=True)]
        deep = comparisons[-1]
        if len(comparisons) > 1:
            if same_moment(row["model"], cfg, M.world(row), depths):
                layer = per_layer_comparison(comparisons[-1], comparisons[0])
            else:
                notes.append("one layer not compared: the ledger's forward peak moves to another moment between "
                             f"{depths[0]} and {depths[1]} layers")
    terms = {t.term: t for t in deep.terms if t.term in TERMS}
    if layer is not None:
        terms["layer_activations"] = layer
    states = all(t.agrees for t in deep.terms if t.term in ("parameters", "gradients", "optimizer_states"))
    return {"part": part, "row": row, "depth": "full" if depths in ((None,), M.EXTRAPOLATION_DEPTHS) else depths[-1],
            "errors": {k: t.error for k, t in terms.items()}, "states_exact": states, "notes": notes,
            "analytic_peak": terms["step_peak"].analytic, "traced_peak": terms["step_peak"].traced}


def label(row: dict) -> str:
    s, w = row["sharding"]
    b, q = row["shape"]
    t = row.get("tensor", 1)
    return (f"{row['model'].split('/')[1][:15]:15} {row['precision']:10} {row['checkpointing']:9} {row['attention']:5} "
            f"{row['loss']:8} {b}x{q:<5} {s}{'' if s == 'none' else w}{f' tp{t}' if t > 1 else ''}")


def summary(results: list[dict], failed: list[str]) -> tuple[list[str], bool]:
    """The verdict lines and whether every target holds."""
    terms = [t for t in (*TERMS, "layer_activations") if any(t in r["errors"] for r in results)]
    medians = {t: statistics.median(abs(r["errors"][t]) for r in results if t in r["errors"]) for t in terms}
    under = [r for r in results if r["errors"]["step_peak"] < M.PEAK_FLOOR]
    layer_miss = [r for r in results if abs(r["errors"].get("layer_activations", 0)) > M.LAYER_BAND]
    states = [r for r in results if not r["states_exact"]]
    ok = not (under or layer_miss or failed or states) and all(v <= M.MEDIAN_BAND for v in medians.values())
    lines = [f"{'PASS' if ok else 'FAIL'}: {len(results)} cells compared, {len(failed)} failed to trace; "
             f"{len(under)} with the step peak more than 1 % under the trace; "
             f"{len(layer_miss)} with one layer off by more than 2 %; {len(states)} with model states not exact."]
    if results:
        w = min(results, key=lambda r: r["errors"]["step_peak"])
        lines.append(f"Worst step peak: {w['errors']['step_peak']:+.2%} ({label(w['row']).strip()}).")
        w = max(results, key=lambda r: r["errors"]["step_peak"])
        lines.append(f"Most over-predicted step peak: {w['errors']['step_peak']:+.2%} ({label(w['row']).strip()}).")
    lines.append("Median |error|: " + ", ".join(f"{SHORT[t]} {v:.2%}" for t, v in medians.items()) + ".")
    return lines, ok


def write_table(path: Path, results: list[dict], failed: list[str], verdict: list[str], command: str) -> None:
    cols = [t for t in (*TERMS, "layer_activations") if any(t in r["errors"] for r in results)]
    worst = sorted(results, key=lambda r: r["errors"]["step_peak"])[:15]
    out = ["# Traced cross-validation matrix", "",
           f"Produced by `{command}` (benchmarks/traced_matrix.py; the matrix is probes/matrix.py's).",
           "Error = (analytic - traced) / traced: negative means the planner under-predicts (the unsafe side).",
           "Contexts, allocator reserve and DDP/NCCL buffers are not traced and not compared (probes/compare.py).", "",
           *verdict, "", "## Lowest step peaks", "", "| cell | depth | peak | analytic GiB | traced GiB |",
           "|---|---|---|---|---|"]
    out += [f"| `{label(r['row'])}` | {r['depth']} | {r['errors']['step_peak']:+.2%} | "
            f"{r['analytic_peak'] / 2**30:.2f} | {r['traced_peak'] / 2**30:.2f} |" for r in worst]
    if failed:
        out += ["", "## Failed to trace", "", *[f"- {f}" for f in failed]]
    for part in ("layers", "steps", "ci"):
        rows = [r for r in results if r["part"] == part]
        if not rows:
            continue
        out += ["", f"## {'One layer and the step at 4 layers' if part == 'layers' else 'The step at full depth' if part == 'steps' else 'CI subset'}",
                "", "| cell | depth | " + " | ".join(SHORT[c] for c in cols) + " | notes |",
                "|---|---|" + "---|" * (len(cols) + 1)]
        out += [f"| `{label(r['row'])}` | {r['depth']} | "
                + " | ".join(f"{r['errors'][c]:+.2%}" if c in r["errors"] else "" for c in cols)
                + f" | {'; '.join(r['notes'])} |" for r in rows]
    path.write_text("\n".join(out) + "\n")


def _traces(requests: list[TraceRequest], workers: int, cache: Path | None) -> tuple[list, int]:
    """The traces of ``requests``: from ``cache`` where it holds them, the rest traced (and added);
    and how many came from the cache."""
    import json

    from planner.probes.traced import TraceResult

    stored = json.loads(cache.read_text()) if cache and cache.exists() else {}
    keys = [r.model_dump_json() for r in requests]
    todo = [r for r, k in zip(requests, keys, strict=True) if k not in stored]
    for r, t in zip(todo, trace_many(todo, timeout=7200, workers=workers) if todo else [], strict=True):
        stored[r.model_dump_json()] = t if isinstance(t, str) else t.model_dump()
    if cache:
        cache.write_text(json.dumps(stored))
    return [v if isinstance(v := stored[k], str) else TraceResult.model_validate(v) for k in keys], len(keys) - len(todo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("layers", "steps", "all"), default="all")
    ap.add_argument("--quick", action="store_true", help="the covering subset CI runs")
    ap.add_argument("--arch", action="append", help="only these catalog ids (repeatable)")
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--csv", type=Path)
    ap.add_argument("--table", type=Path, help="write the result as a Markdown table")
    ap.add_argument("--cache", type=Path, help="keep traces in this JSON file and reuse them (the analytic side is "
                                                 "always recomputed; delete the file after changing the probes)")
    args = ap.parse_args()
    todo = [c for c in cells(args.part, args.quick) if not args.arch or c[1]["model"] in args.arch]
    requests, index = [], {}
    for _, row, depths in todo:
        for d in depths:
            req = M.trace_request(row, d)
            key = req.model_dump_json()
            if key not in index:
                index[key] = len(requests)
                requests.append(req)
    start = time.perf_counter()
    traced, reused = _traces(requests, args.workers, args.cache)
    results, failed = [], []
    print(f"{'cell':68} {'depth':>5} " + " ".join(f"{SHORT[t]:>8}" for t in (*TERMS, "layer_activations")))
    for part, row, depths in todo:
        got = [traced[index[M.trace_request(row, d).model_dump_json()]] for d in depths]
        bad = next((g for g in got if isinstance(g, str)), None)
        if bad is not None:
            failed.append(f"`{label(row)}`: {bad[:200]}")
            print(f"{label(row):68} FAILED: {bad[:100]}")
            continue
        r = evaluate(part, row, depths, got)
        results.append(r)
        print(f"{label(row):68} {r['depth']!s:>5} "
              + " ".join(f"{r['errors'][t]:+8.2%}" if t in r["errors"] else " " * 8 for t in (*TERMS, "layer_activations")),
              "; ".join(r["notes"]))
    verdict, ok = summary(results, failed)
    verdict.append(f"{len(requests)} traces ({reused} read from the cache) in {time.perf_counter() - start:.0f} s "
                   f"with {args.workers} workers.")
    print("\n" + "\n".join(verdict))
    if args.csv and results:
        with args.csv.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["part", "model", "precision", "checkpointing", "attention", "loss", "micro_batch_size", "seq_len",
                        "sharding", "world_size", "tensor", "depth", *(SHORT[t] for t in (*TERMS, "layer_activations"))])
            for r in results:
                row = r["row"]
                w.writerow([r["part"], row["model"], row["precision"], row["checkpointing"], row["attention"], row["loss"],
                            *row["shape"], *row["sharding"], row.get("tensor", 1), r["depth"],
                            *(round(r["errors"][t], 5) if t in r["errors"] else "" for t in (*TERMS, "layer_activations"))])
    if args.table:
        write_table(args.table, results, failed, verdict, "python " + " ".join(sys.argv))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
