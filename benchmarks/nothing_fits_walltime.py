"""Wall time of `planner suggest` when nothing fits, beside a case that fits.

Target: a nothing-fits answer (with its fixes: more host RAM, more GPUs, a larger GPU) in under
two seconds end to end. Prints the median of several fresh-process runs of each case, its exit
code (0 a plan fits, 1 nothing fits) and the first line of its reasons.

    .venv/bin/python benchmarks/nothing_fits_walltime.py [--runs 5]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = (
    ("405B on 1xRTX4090-24", ["--model", "meta-llama/Llama-3.1-405B", "--gpus", "1xRTX4090-24"]),
    ("70B on 1xT4-16", ["--model", "meta-llama/Llama-3.1-70B", "--gpus", "1xT4-16"]),
    ("8B on 1xT4-16, no sharding/offload",
     ["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xT4-16", "--sharding", "none", "--offload", "none"]),
    ("8B on 1xA100-40 (fits)", ["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40"]),
)


def run(args: list[str]) -> tuple[float, int, str]:
    cmd = [sys.executable, "-c", "from planner.cli import main; main()", "suggest", *args, "--json"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    try:
        first = (json.loads(done.stdout).get("reasons") or [""])[0]
    except json.JSONDecodeError:
        first = (done.stderr.strip().splitlines() or [""])[-1]
    return seconds, done.returncode, first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    print(f"runs per figure: {runs} (median, fresh process each)")
    print(f"{'case':38s} {'median':>8s} {'exit':>5s}  first reason")
    for name, args in CASES:
        results = [run(args) for _ in range(runs)]
        median = statistics.median(s for s, _, _ in results)
        _, code, first = results[0]
        print(f"{name:38s} {median:7.2f}s {code:5d}  {first[:110]}")


if __name__ == "__main__":
    main()
