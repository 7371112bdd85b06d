"""Wall time of a full-size traced probe: Llama-3.1-8B, seq 2048, micro-batch 1, on this machine's CPU.

    python benchmarks/traced_walltime.py [--runs 3] [--checkpointing full]

Each run is a fresh child process (imports, model build on fake tensors, the warm-up and the
measured step: probes/traced.py ``warm_up_of``);
prints each run, the median, and the comparison with the ledger of the last run.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.catalog.models import catalog  # noqa: E402
from planner.probes.compare import compare_result  # noqa: E402
from planner.probes.traced import TraceRequest, trace  # noqa: E402
from planner.strategies import TrainingConfig  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--checkpointing", default="full")
    ap.add_argument("--precision", default="bf16-mixed")
    args = ap.parse_args()
    cfg = TrainingConfig(precision=args.precision, checkpointing=args.checkpointing, micro_batch_size=1, seq_len=2048)
    walls = []
    for i in range(args.runs):
        start = time.perf_counter()
        result = trace(TraceRequest(config_json=catalog()[MODEL].config, config=cfg), timeout=3600)
        walls.append(time.perf_counter() - start)
        print(f"run {i + 1}: {walls[-1]:.1f} s wall ({result.seconds:.1f} s inside the child)", flush=True)
    print(f"median of {args.runs}: {statistics.median(walls):.1f} s  ({MODEL}, seq 2048, mbs 1, "
          f"{args.precision}, checkpointing {args.checkpointing})")
    for t in compare_result(MODEL, cfg, 1, None, result).terms:
        print(f"  {t.term:16} analytic {t.analytic / 2**30:8.3f} GiB  traced {t.traced / 2**30:8.3f} GiB  {t.error:+.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
