"""Where a measured case's GPU memory goes: one gpu_validate case run with torch's allocator
history recorded, its live blocks at the allocated peak grouped by the library code that made
them, and the reserved bytes per stream (issue 36: the terms a real run holds that the plan may
not name).

    python benchmarks/validation/snapshot.py --out DIR CASE [CASE ...]

Run after gpu_validate.sh installed the carried wheels (its PYTHONPATH). Writes
``snapshot-<case>.json`` per case to DIR and prints the top groups. The history is replayed here
(torch/cuda/memory.py ``_snapshot``: ``device_traces`` of alloc / free_completed and segment
events), so only this summary travels back, not the multi-MB pickle.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

#: Frames from these paths name who allocated a block; torch's own plumbing is skipped.
OWNERS = ("deepspeed/", "transformers/", "peft/", "accelerate/", "planner/", "torch/nn/", "torch/autograd/",
          "torch/optim/", "bitsandbytes/", "liger_kernel/")


def _owner(frames: list[dict], depth: int = 4) -> str:
    named = [f"{f['filename'].split('site-packages/')[-1]}:{f['line']} {f['name']}" for f in frames
             if any(o in f["filename"] for o in OWNERS)]
    return " <- ".join(named[:depth]) or "(no library frame)"


def replay(snapshot: dict, after: float = 0.0) -> dict:
    """The allocated peak of device 0's trace among its events from the fraction ``after`` on
    (0: all; 0.5: the later half, past the model's build and the first steps): bytes live then,
    grouped by owner, and reserved bytes per stream at that instant and at the reserved peak."""
    trace = snapshot["device_traces"][0]
    first = int(len(trace) * after)
    live: dict[int, tuple[int, int]] = {}
    allocated = peak = peak_at = 0
    at_peak: list[tuple[str, int, int]] = []
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], i)
            allocated += e["size"]
            if allocated > peak and i >= first:
                peak, peak_at = allocated, i
        elif e["action"] == "free_completed" and e["addr"] in live:
            allocated -= live.pop(e["addr"])[0]
    live, reserved, reserved_at_peak, reserved_peak = {}, defaultdict(int), {}, 0
    for i, e in enumerate(trace):
        a = e["action"]
        if a == "alloc":
            live[e["addr"]] = (e["size"], i)
        elif a == "free_completed":
            live.pop(e["addr"], None)
        elif a in ("segment_alloc", "segment_map"):
            reserved[e.get("stream", 0)] += e["size"]
        elif a in ("segment_free", "segment_unmap"):
            reserved[e.get("stream", 0)] -= e["size"]
        reserved_peak = max(reserved_peak, sum(reserved.values()))
        if i == peak_at:
            reserved_at_peak = dict(reserved)
            groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            for size, j in live.values():
                g = groups[f"stream {trace[j].get('stream', 0)}: {_owner(trace[j].get('frames', []))}"]
                g[0] += size
                g[1] += 1
            at_peak = sorted(((k, v[0], v[1]) for k, v in groups.items()), key=lambda x: -x[1])
    return {"events": len(trace), "peak_allocated": peak, "peak_event": peak_at,
            "reserved_at_peak_by_stream": {str(k): v for k, v in reserved_at_peak.items()},
            "reserved_peak": reserved_peak,
            "live_at_peak": [{"owner": k, "bytes": b, "blocks": n} for k, b, n in at_peak[:40]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds; a case starts only with 90 s left")
    ap.add_argument("cases", nargs="+")
    args = ap.parse_args()
    start = time.monotonic()
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"})
    from validation.cases import CASES

    from planner.catalog.models import model_config
    from planner.engine.estimate import estimate
    from planner.probes.device import DeviceInfo, catalog_gpu, probe_device
    from planner.probes.forked import run_forked
    from planner.probes.gpu_readings import device_used_bytes
    from planner.probes.measured import ALLOC_CONF_VAR, LAUNCH_ENV, run_measure
    from planner.probes.measured_command import measure_plan
    from planner.schema.estimate import EstimateRequest

    args.out.mkdir(parents=True, exist_ok=True)
    by_key = {c.key: c for c in CASES}
    # the device is read in a child: this process must not start CUDA before it forks the cases
    info = DeviceInfo.model_validate(run_forked(lambda _: probe_device().model_dump(), "", 120).value)
    for key in args.cases:
        if args.budget - (time.monotonic() - start) < 90:
            print(f"{key}: skipped, no time left", flush=True)
            continue
        case = by_key[key]
        gpus = case.gpus_on(catalog_gpu(info.name, info.total_bytes))
        plan = estimate(EstimateRequest(model=case.model, gpus=gpus, **case.config))
        summary: dict = {}

        def runner(req, timeout, summary=summary):
            req = req.model_copy(update={"device_used_before_bytes": device_used_bytes()})

            def child(payload: str) -> dict:
                import torch

                r = type(req).model_validate_json(payload)
                os.environ.update(LAUNCH_ENV | {ALLOC_CONF_VAR: r.allocator_conf})
                torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
                result = run_measure(r).model_dump()
                history = torch.cuda.memory._snapshot()
                result["snapshot"] = replay(history) | {"later_half": replay(history, after=0.5)}
                return result

            from planner.probes.measured import _result

            outcome = run_forked(child, req.model_dump_json(), timeout)
            if outcome.status == "ok" and isinstance(outcome.value, dict):
                summary.update(outcome.value.pop("snapshot", {}))
            return _result(outcome)

        t0 = time.monotonic()
        comparison = measure_plan(plan, case.model, model_config(case.model), info, runner=runner,
                                  timeout=args.budget - (time.monotonic() - start), timed=False)
        m = comparison.measurement
        summary.update({"case": key, "config": case.config, "seconds": round(time.monotonic() - t0, 1),
                        "status": comparison.status, "message": comparison.message[-2000:],
                        "phase_peaks": m.phase_peaks if m else None,
                        "predicted_allocated_bytes": comparison.predicted_allocated_bytes,
                        "measured_allocated_bytes": comparison.measured_allocated_bytes,
                        "measured_reserved_bytes": comparison.measured_reserved_bytes})
        (args.out / f"snapshot-{key}.json").write_text(json.dumps(summary, indent=1))
        print(f"{key}: {comparison.status} in {summary['seconds']} s; allocated peak "
              f"{summary.get('peak_allocated', 0) / 2**30:.3f} GiB (replayed), reserved by stream "
              f"{summary.get('reserved_at_peak_by_stream')}", flush=True)
        for g in summary.get("live_at_peak", [])[:15]:
            print(f"  {g['bytes'] / 2**20:9.1f} MiB {g['blocks']:5d}  {g['owner'][:160]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
