"""The winner `planner suggest` ranks first in common situations (models x GPUs), one row each.

Run: python benchmarks/winners.py [--csv PATH]. Prints, per situation, the winning configuration
(compact), its modelled tokens/s, peak and limit, and the wall time of the suggest call. Used for
the before/after tables of ranking changes (numerics policy, ties, margin).
"""

import argparse
import csv
import sys
import time

from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies import summary

SITUATIONS = [
    ("meta-llama/Llama-3.1-8B", "1xA100-40"),
    ("meta-llama/Llama-3.1-8B", "1xA100-80"),
    ("meta-llama/Llama-3.1-8B", "8xH100-80"),
    ("meta-llama/Llama-3.1-8B", "1xRTX4090-24"),
    ("meta-llama/Llama-3.1-70B", "8xH100-80"),
    ("meta-llama/Llama-3.1-70B", "2x8xH100-80"),
    ("meta-llama/Llama-3.2-1B", "1xH100-80"),
    ("meta-llama/Llama-3.2-1B", "1xT4-16"),
    ("Qwen/Qwen2.5-0.5B", "1xT4-16"),
    ("Qwen/Qwen2.5-7B", "2xA100-80"),
    ("mistralai/Mistral-7B-v0.1", "4xA100-40"),
    ("google/gemma-2-9b", "8xA100-80"),
    ("meta-llama/Llama-3.1-405B", "1xRTX4090-24"),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv")
    args = ap.parse_args()
    rows = []
    for model, gpus in SITUATIONS:
        t0 = time.perf_counter()
        r = suggest(SuggestRequest(model=model, gpus=gpus))
        wall = time.perf_counter() - t0
        if r.plans:
            p = r.plans[0]
            c = p.config
            row = dict(model=model, gpus=gpus, winner=summary(c, "compact") + f", mbs {c.micro_batch_size}x{c.grad_accum}",
                       tokens_per_s=round(p.time.tokens_per_second), peak_gib=round(p.memory["peak"] / 2**30, 2),
                       limit_gib=round(p.memory.get("limit", 0) / 2**30, 2), wall_s=round(wall, 2))
        else:
            row = dict(model=model, gpus=gpus, winner="nothing fits", tokens_per_s=0, peak_gib=0, limit_gib=0,
                       wall_s=round(wall, 2))
        rows.append(row)
        print(f"{model.split('/')[-1]:>14} {gpus:>13} {row['tokens_per_s']:>8} tok/s {row['peak_gib']:>7} GiB "
              f"{row['wall_s']:>5}s  {row['winner']}", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
