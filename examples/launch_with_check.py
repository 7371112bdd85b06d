"""A Python launcher that asks `planner check` before it spends GPU hours.

    python examples/launch_with_check.py --model meta-llama/Llama-3.1-8B --gpus 8xH100-80 \\
        --job-dir plan/ --margin 0.05 -- plan/launch.sh --plan plan/plan.json

Exits 1 (and launches nothing) when the job will not fit, printing the changes that would make
it fit; exits 2 on bad job files; otherwise replaces itself with the command after `--`.
"""

import argparse
import os
import sys
from pathlib import Path

from planner.check import CheckRequest, check
from planner.core.errors import PlannerInputError


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--gpus", required=True)
    p.add_argument("--job-dir", type=Path)
    p.add_argument("--accelerate-config", type=Path)
    p.add_argument("--deepspeed-config", type=Path)
    p.add_argument("--training-args", type=Path)
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch command")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the launch command after --")
    try:
        result = check(CheckRequest(
            model=args.model, gpus=args.gpus, job_dir=args.job_dir, accelerate_config=args.accelerate_config,
            deepspeed_config=args.deepspeed_config, training_args=args.training_args, margin=args.margin,
        ))
    except PlannerInputError as e:
        print(f"preflight: bad job files: {e.message}", file=sys.stderr)
        return 2
    peak, usable = result.estimate.memory["peak"] / 2**30, result.estimate.usable_bytes / 2**30
    if not result.fits:
        print(f"preflight: will not fit ({peak:.1f} of {usable:.1f} GiB per GPU); not launching", file=sys.stderr)
        for change in result.changes:
            print(f"  try: {change.change} -> {change.peak_bytes / 2**30:.1f} GiB", file=sys.stderr)
        return 1
    print(f"preflight: fits ({peak:.1f} of {usable:.1f} GiB per GPU); launching: {' '.join(command)}", flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
