"""Published torchtitan runs against `planner check --torchtitan-config` (planner/check/torchtitan.py).

Each row of benchmarks/world/torchtitan.yaml (source, quote, hardware, config, caveat) is torchtitan's
own Llama 3 8B preset with the row's edit, read by the same reader a user's TOML goes through;
printed: the published reserved peak beside planner's (``max_memory_reserved``, what torchtitan's
log line prints), and the tokens/s per GPU beside planner's (theirs mostly 500 W H100s, planner's
H100-SXM-80: printed, not judged).

    python benchmarks/torchtitan_world.py
"""

import statistics
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "tests" / "data" / "recipes" / "pytorch__torchtitan" / "torchtitan" / "models" / "llama3" / \
    "train_configs" / "llama3_8b.toml"


def rows() -> list[dict]:
    return yaml.safe_load((ROOT / "benchmarks" / "world" / "torchtitan.yaml").read_text())


def planner_figures(row: dict) -> tuple[float, float]:
    """(reserved peak GiB, tokens/s per GPU) planner reads for the row's TOML."""
    if str(ROOT / "tests") not in sys.path:  # (tests/fuzzgen.py writes the TOML)
        sys.path.insert(0, str(ROOT / "tests"))
    from fuzzgen import _toml

    from planner.check import CheckRequest, check

    d = tomllib.loads(PRESET.read_text())
    for section, keys in row["edit"].items():
        d.setdefault(section, {}).update(keys)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama3_8b.toml"
        path.write_text(_toml(d))
        r = check(CheckRequest(gpus=row["gpus"], torchtitan_config=path, alternatives=0)).estimate
    return r.reserved_peak_bytes / 2**30, r.time.tokens_per_second / r.hardware.num_gpus


def main() -> None:
    errors = []
    print(f"{'row':40s} {'published':>10s} {'planner':>8s} {'error':>7s} {'tok/s/GPU':>10s} {'planner':>8s}")
    for row in rows():
        reserved, tokens = planner_figures(row)
        error = reserved / row["memory_gib"] - 1
        errors.append(error)
        print(f"{row['id']:40s} {row['memory_gib']:8.2f} G {reserved:6.2f} G {error:+7.1%} "
              f"{row['tokens_per_s_per_gpu']:10,} {tokens:8,.0f}")
    print(f"\nreserved peak: median error {statistics.median(errors):+.1%}, median |error| "
          f"{statistics.median(abs(e) for e in errors):.1%}, range {min(errors):+.1%} .. {max(errors):+.1%}")


if __name__ == "__main__":
    main()
