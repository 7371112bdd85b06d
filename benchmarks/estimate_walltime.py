"""Wall time of `planner estimate` (target: well under a second beyond interpreter start).

Prints medians of several runs:
- `python -c pass` (the interpreter alone),
- `planner estimate ... --json` end to end (a fresh process each time),
- the estimate itself in-process (`estimate_config`, per candidate, what the search will call).

    .venv/bin/python benchmarks/estimate_walltime.py [--runs 9]
"""

import argparse
import statistics
import subprocess
import sys
import time

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.engine.estimate import estimate_config
from planner.strategies import TrainingConfig

ARGS = ["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40", "--json"]


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    runs = parser.parse_args().runs
    bare = statistics.median(timed([sys.executable, "-c", "pass"]) for _ in range(runs))
    cli = [sys.executable, "-c", "from planner.cli import main; main()", "estimate", *ARGS]
    full = statistics.median(timed(cli) for _ in range(runs))
    model, hw = resolve_model("meta-llama/Llama-3.1-8B"), parse_gpus("1xA100-40")
    configs = [TrainingConfig(micro_batch_size=b, checkpointing=c) for b in (1, 2, 4, 8) for c in ("none", "full")]
    estimate_config(model, hw, configs[0])  # warm the catalog and per-model caches
    per = []
    for _ in range(runs):
        start = time.perf_counter()
        for cfg in configs:
            estimate_config(model, hw, cfg)
        per.append((time.perf_counter() - start) / len(configs))
    print(f"runs per figure: {runs} (medians)")
    print(f"python -c pass                      {bare * 1000:8.1f} ms")
    print(f"planner estimate (fresh process)    {full * 1000:8.1f} ms")
    print(f"  beyond interpreter start          {(full - bare) * 1000:8.1f} ms")
    print(f"estimate_config, in process         {statistics.median(per) * 1e6:8.1f} us per configuration")


if __name__ == "__main__":
    main()
