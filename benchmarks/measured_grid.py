"""The measured-probe validation grid (issue 7): analytic vs measured on this machine's GPU.

    PLANNER_CALIBRATION=$OUT/calibration.sqlite python benchmarks/measured_grid.py \
        --csv benchmarks/results/H200-141.csv [--part 1/3] [--only llama-8b] [--dry-run]

One fresh child process per configuration (probes/measured.py), the plan on this GPU
(``1x<device>``), 2 warm-up and 5 timed steps. Rows are appended to the CSV as they finish and a
configuration already in the CSV is skipped, so the grid resumes across commands (each device
command is limited to 10 minutes: run it in parts). Every run also lands in the calibration
store, from which ``planner calibrate`` fits the corrections; ``planner calibrate --dry-run``
prints the errors before and after.

The grid (45 configurations):
- Llama-3.2-1B and Qwen2.5-0.5B at full depth, Llama-3.1-8B extrapolated from 4 and 8 layers (2
  layers checks that memory is linear in depth: probes/extrapolate.py);
- per model, at micro-batch 1 x 2048 tokens: optimizers adamw / adamw-8bit / paged-adamw-8bit x
  precisions bf16-mixed / bf16-pure / fp8-mixed with full checkpointing (9), and adamw with no
  checkpointing in each precision (3);
- per model, adamw bf16-mixed at micro-batch 4 x 1024 and 2 x 4096 tokens, with and without
  checkpointing (4, where the analytic model predicts a fit; the rest are kept to show the OOM
  verdict).
Plus the depth check: Llama-3.1-8B adamw-8bit bf16-mixed full checkpointing at full depth (it fits
on 141 GiB; on 80 GiB it shows the OOM verdict) beside its extrapolation, and the 1B and 0.5B
extrapolated from 2, 4 and 8 layers beside their full-depth runs.
"""

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.catalog.calibration import store_path  # noqa: E402
from planner.catalog.models import model_config  # noqa: E402
from planner.engine.estimate import EstimateRequest, estimate  # noqa: E402
from probes.device import catalog_gpu  # noqa: E402
from probes.measured_command import measure_plan, require_gpu  # noqa: E402

MODELS = {"llama-1b": ("meta-llama/Llama-3.2-1B", None), "qwen-0.5b": ("Qwen/Qwen2.5-0.5B", None),
          "llama-8b": ("meta-llama/Llama-3.1-8B", [2, 4, 8])}
COLUMNS = ["key", "model", "depth", "optimizer", "precision", "checkpointing", "micro_batch_size", "seq_len", "status",
           "predicted_fits", "predicted_peak_gib", "measured_peak_gib", "measured_reserved_gib", "predicted_allocated_gib",
           "measured_allocated_gib", "memory_error", "predicted_step_s", "measured_step_s", "time_error",
           "tokens_per_s", "mfu", "alloc_retries", "driver_method", "device", "torch", "cuda", "where", "message"]


def grid() -> list[dict]:
    rows = []
    for name, (model, depths) in MODELS.items():
        base = {"name": name, "model": model, "extrapolate_from": depths}
        for opt in ("adamw", "adamw-8bit", "paged-adamw-8bit"):
            for prec in ("bf16-mixed", "bf16-pure", "fp8-mixed"):
                rows.append(base | {"optimizer": opt, "precision": prec, "checkpointing": "full", "mbs": 1, "seq": 2048})
        for prec in ("bf16-mixed", "bf16-pure", "fp8-mixed"):
            rows.append(base | {"optimizer": "adamw", "precision": prec, "checkpointing": "none", "mbs": 1, "seq": 2048})
        for mbs, seq in ((4, 1024), (2, 4096)):
            for ckpt in ("none", "full"):
                rows.append(base | {"optimizer": "adamw", "precision": "bf16-mixed", "checkpointing": ckpt,
                                    "mbs": mbs, "seq": seq})
    depth_check = {"optimizer": "adamw-8bit", "precision": "bf16-mixed", "checkpointing": "full", "mbs": 1, "seq": 2048}
    rows.append({"name": "llama-8b", "model": "meta-llama/Llama-3.1-8B", "extrapolate_from": None} | depth_check)
    for name in ("llama-1b", "qwen-0.5b"):
        rows.append({"name": name, "model": MODELS[name][0], "extrapolate_from": [2, 4, 8]} | depth_check)
    return rows


def key(row: dict) -> str:
    depth = "x" + "-".join(map(str, row["extrapolate_from"])) if row["extrapolate_from"] else "full"
    return (f"{row['name']}|{depth}|{row['optimizer']}|{row['precision']}|{row['checkpointing']}|"
            f"{row['mbs']}x{row['seq']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, required=True)
    ap.add_argument("--part", default="1/1", help="i/n: run every n-th configuration from the i-th")
    ap.add_argument("--only", default="", help="only configurations whose key contains this")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--dry-run", action="store_true", help="list the configurations and the analytic verdicts")
    ap.add_argument("--store", type=Path, default=store_path(),
                    help="the calibration store every run is kept in (default: $PLANNER_CALIBRATION, as planner's --calibration)")
    args = ap.parse_args()
    i, n = (int(x) for x in args.part.split("/"))
    done = set()
    if args.csv.exists():
        with args.csv.open() as f:
            done = {r["key"] for r in csv.DictReader(f)}
    todo = [r for r in grid()[i - 1::n] if args.only in key(r) and key(r) not in done]
    device = None if args.dry_run else require_gpu()
    gpu = catalog_gpu(device.name, device.total_bytes) if device else "H100-SXM-80"
    print(f"{len(grid())} configurations; {len(done)} already in {args.csv}; this part runs {len(todo)} on {gpu}",
          flush=True)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    new = not args.csv.exists()
    with args.csv.open("a", newline="") as f:
        out = csv.DictWriter(f, COLUMNS)
        if new:
            out.writeheader()
        for row in todo:
            plan = estimate(EstimateRequest(model=row["model"], gpus=f"1x{gpu}", optimizer=row["optimizer"],
                                            precision=row["precision"], checkpointing=row["checkpointing"],
                                            micro_batch_size=row["mbs"], seq_len=row["seq"]))
            if args.dry_run:
                print(f"{key(row):70s} fits={plan.fits} peak {plan.memory['peak'] / 2**30:6.2f} GiB "
                      f"step {plan.time.step_seconds:.3f} s")
                continue
            r = measure_plan(plan, row["model"], model_config(row["model"]), device,
                             extrapolate_from=row["extrapolate_from"], timeout=args.timeout, store=args.store)
            out.writerow(_csv_row(key(row), row, plan, r))
            f.flush()
            print(f"{key(row):70s} {r.status:7s} peak {_gib(r.predicted_peak_bytes)} vs {_gib(r.measured_peak_bytes)} "
                  f"({_pct(r.memory_error)}), step {r.predicted_step_seconds:.3f} vs "
                  f"{r.measured_step_seconds or 0:.3f} s ({_pct(r.time_error)}) {r.verdict}", flush=True)
    if not args.dry_run:
        summarize(args.csv)
    return 0


def _csv_row(k: str, row: dict, plan, r) -> dict:
    m = r.measurement
    return {"key": k, "model": row["model"], "depth": "extrapolated " + "/".join(map(str, r.extrapolated_from))
            if r.extrapolated_from else "full", "optimizer": row["optimizer"], "precision": row["precision"],
            "checkpointing": row["checkpointing"], "micro_batch_size": row["mbs"], "seq_len": row["seq"],
            "status": r.status, "predicted_fits": r.predicted_fits, "predicted_peak_gib": _g(r.predicted_peak_bytes),
            "measured_peak_gib": _g(r.measured_peak_bytes), "measured_reserved_gib": _g(r.measured_reserved_bytes),
            "predicted_allocated_gib": _g(r.predicted_allocated_bytes),
            "measured_allocated_gib": _g(r.measured_allocated_bytes), "memory_error": _f(r.memory_error),
            "predicted_step_s": _f(r.predicted_step_seconds), "measured_step_s": _f(r.measured_step_seconds),
            "time_error": _f(r.time_error), "tokens_per_s": _f(r.tokens_per_second), "mfu": _f(r.mfu),
            "alloc_retries": m.alloc_retries, "driver_method": m.driver_method, "device": r.device,
            "torch": m.versions.get("torch"), "cuda": m.versions.get("cuda"), "where": r.where,
            "message": r.message[:300]}


def summarize(path: Path) -> None:
    """Median and worst |error| of the rows that ran, and OOMs where a fit was predicted."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    ok = [r for r in rows if r["status"] == "ok"]
    for column, label in (("memory_error", "peak memory"), ("time_error", "step time")):
        errors = [abs(float(r[column])) for r in ok if r[column]]
        if errors:
            print(f"{label}: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%} over {len(errors)} runs")
    surprises = [r["key"] for r in rows if r["status"] == "oom" and r["predicted_fits"] == "True"]
    print(f"predicted to fit but ran out of memory: {len(surprises)} {surprises}")


def _g(x) -> str:
    return "" if x is None else f"{x / 2**30:.3f}"


def _f(x) -> str:
    return "" if x is None else f"{x:.5g}"


def _gib(x) -> str:
    return "-" if x is None else f"{x / 2**30:.2f} GiB"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


if __name__ == "__main__":
    sys.exit(main())
