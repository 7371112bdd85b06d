"""Wall time of `planner suggest` for Llama-3.1-8B on 1, 8 and 512 GPUs, and candidates per second.

Target: under one second of work beyond interpreter start on the 2-core development machine.
Prints medians of several runs of each:
- `python -c pass` (the interpreter alone),
- `planner suggest --model meta-llama/Llama-3.1-8B --gpus G --json` end to end (fresh process),
- the search alone, in process (candidates evaluated per second).

    .venv/bin/python benchmarks/suggest_walltime.py [--runs 5]
"""

import argparse
import statistics
import subprocess
import sys
import time

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.engine.estimate import evaluate
from planner.engine.search import search
from planner.engine.space import build_space

MODEL = "meta-llama/Llama-3.1-8B"
GPUS = ("1xA100-40", "8xH100-80", "64x8xH100-80")


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def in_process(gpus: str) -> tuple[float, int, int]:
    model, hw = resolve_model(MODEL), parse_gpus(gpus)
    space = build_space(hw.num_gpus, 2048)
    start = time.perf_counter()
    out = search(space, lambda c: evaluate(model, hw, c, skip_infeasible=True))
    return time.perf_counter() - start, out.evaluated, space.size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    bare = statistics.median(timed([sys.executable, "-c", "pass"]) for _ in range(runs))
    print(f"runs per figure: {runs} (medians); python -c pass: {bare * 1000:.0f} ms")
    print(f"{'GPUs':14s} {'suggest (process)':>18s} {'beyond start':>13s} {'search':>9s} {'evaluated':>10s} "
          f"{'space':>7s} {'candidates/s':>13s} {'evaluations/s':>14s}")
    for gpus in GPUS:
        cmd = [sys.executable, "-c", "from planner.cli import main; main()", "suggest", "--model", MODEL,
               "--gpus", gpus, "--json"]
        wall = statistics.median(timed(cmd) for _ in range(runs))
        searches = [in_process(gpus) for _ in range(runs)]
        seconds = statistics.median(s for s, _, _ in searches)
        evaluated, size = searches[0][1], searches[0][2]
        print(f"{gpus:14s} {wall * 1000:15.0f} ms {(wall - bare) * 1000:10.0f} ms {seconds * 1000:6.0f} ms "
              f"{evaluated:10,d} {size:7,d} {size / seconds:13,.0f} {evaluated / seconds:14,.0f}")
    print("candidates/s counts the whole space: the pruned (monotone) micro-batch sizes and infeasible")
    print("combinations are decided without a full evaluation; 'evaluated' is how many ran the model.")


if __name__ == "__main__":
    main()
