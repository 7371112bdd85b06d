"""The thorough profile of planner's mutation fuzzer (tests/fuzzgen.py): every file planner reads,
mutated, through the command that reads it. Prints the cases run, the failures grouped by class
(kind and place), one example command each, and the seconds taken; exits 1 when any case failed.

    .venv/bin/python benchmarks/fuzz.py [--count 20000] [--seed 0]

CI runs the first few thousand cases of seed 0 (tests/test_fuzz.py).
"""

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["COLUMNS"] = "100"  # screens as wide wherever it runs (a terminal's width, pytest's)

import fuzzgen  # noqa: E402


def _record(failures: Counter, examples: dict, i: int, case, problem: str | None) -> None:
    """Count a failing case under its class: the target, the kind of failure and, for an
    exception, the planner file it was raised in (a message's own problem text otherwise)."""
    if problem is None:
        return
    if problem.startswith(("hang", "message", "screen", "empty", "an esc")):
        key = f"{case.target}: {problem[:90]}"
    else:
        where = f" {problem.split(' at ')[1].split(':')[0]}" if " at " in problem else ""
        key = f"{case.target}: {problem.split(':')[0]}{where}"
    failures[key] += 1
    examples.setdefault(key, (i, case.mutation, problem))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-gb", type=float, default=4.0,
                        help="address space this process may map: a case that would take more raises MemoryError "
                             "(a failure it reports) instead of meeting the machine's OOM killer")
    parser.add_argument("--verbose", action="store_true", help="print each case before it runs")
    parser.add_argument("--only", nargs="+", choices=fuzzgen.TARGETS, default=fuzzgen.TARGETS,
                        help="the targets to fuzz (all by default)")
    parser.add_argument("--launch", type=int, default=0,
                        help="cases of python -m planner.launch (a mutated plan folder, one step of the tiny "
                             "Llama; torch, transformers and tests/tools/tiny_model.py needed)")
    args = parser.parse_args()
    import resource

    limit = int((max(args.memory_gb, 16.0) if args.launch else args.memory_gb) * 2**30)  # (torch maps more)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    start = time.perf_counter()
    failures: Counter = Counter()
    examples: dict[str, tuple] = {}
    targets: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        kinds = fuzzgen.seeds(work)
        for i, case in enumerate(fuzzgen.cases(kinds, args.count, args.seed, tuple(args.only))):
            targets[case.target] += 1
            if args.verbose:
                print(i, case.target, case.mutation, flush=True)
            _record(failures, examples, i, case, fuzzgen.run(case, work / "case"))
            if (i + 1) % 1000 == 0:
                print(f"{i + 1:,} cases, {sum(failures.values())} failures, {time.perf_counter() - start:.0f} s",
                      flush=True)
        if args.launch:
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "tools"))
            from tiny_model import make_tiny_model

            kinds["single"] = fuzzgen.launch_seeds(work)
            model = make_tiny_model(work / "tiny-model")
            for i, case in enumerate(fuzzgen.launch_cases(kinds, args.launch, args.seed)):
                targets[case.target] += 1
                _record(failures, examples, i, case, fuzzgen.run_launch(case, work / "case", model))
    print(f"\n{args.count + args.launch:,} cases (seed {args.seed}) in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{t} {n}" for t, n in sorted(targets.items())))
    print(f"{sum(failures.values())} failures in {len(failures)} classes")
    for key, n in failures.most_common():
        i, mutation, problem = examples[key]
        print(f"{n:6d}  {key}\n        case {i} ({mutation}): {problem[:160]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
