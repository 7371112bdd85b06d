"""Wall time of the traced probe as a user meets it: ``planner probe`` of Qwen2.5-0.5B at
full depth, and a 4-trial ``planner tune --fidelity traced`` of SmolLM2-135M, on this machine's CPU.

    python benchmarks/probe_speed.py [--runs 3] [--skip-probe] [--skip-tune]

Each run is a fresh ``python -P -m planner`` process of this tree (PYTHONPATH set to it), timed
whole: imports, the plan's resolution, the traced child (imports, model build on fake tensors, the
warm-up and the measured step), the comparison. Prints each run and the median of each.

- probe: ``planner probe --model Qwen/Qwen2.5-0.5B --gpus 1xH100-80 --json``: the default plan
  (bf16-mixed, AdamW, no checkpointing, micro-batch 1 x 2048 tokens, sharding none), 24 layers;
- tune: ``planner tune --model HuggingFaceTB/SmolLM2-135M --gpus 1xH100-80 --fidelity traced
  --trials 4 --band 10`` on a fresh SQLite study (``--band 10`` so no early stop: 4 probes).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ["probe", "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xH100-80", "--json"]
TUNE = ["tune", "--model", "HuggingFaceTB/SmolLM2-135M", "--gpus", "1xH100-80", "--fidelity", "traced",
        "--trials", "4", "--band", "10", "--json"]


def timed(args: list[str]) -> tuple[float, dict]:
    """Seconds of one ``planner ARGS`` process of this tree, and its JSON answer."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PLANNER_CALIBRATION": "off"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-P", "-m", "planner", *args], capture_output=True, text=True, env=env,
                          check=False)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # 1: the probe differs from the model / nothing fits, still an answer
        raise SystemExit(f"planner {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--skip-probe", action="store_true")
    ap.add_argument("--skip-tune", action="store_true")
    args = ap.parse_args()
    if not args.skip_probe:
        walls = []
        for i in range(args.runs):
            seconds, out = timed(PROBE)
            walls.append(seconds)
            print(f"probe run {i + 1}: {seconds:.1f} s  (step peak {max(out['phase_peaks'].values()):,} B)", flush=True)
        print(f"probe median of {args.runs}: {statistics.median(walls):.1f} s  ({' '.join(PROBE[:5])})", flush=True)
    if not args.skip_tune:
        walls = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                seconds, out = timed([*TUNE, "--storage", f"sqlite:///{tmp}/study.db"])
            walls.append(seconds)
            print(f"tune run {i + 1}: {seconds:.1f} s  ({out['probes']} probes, stopped: {out['stopped']})", flush=True)
        print(f"tune median of {args.runs}: {statistics.median(walls):.1f} s  ({' '.join(TUNE[:4])}, 4 traced trials)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
