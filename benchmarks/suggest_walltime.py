"""Whole-process time of planner's commands, against one DeepSpeed estimator call.

The budget (docs/architecture.md): every planning command <= 0.5 s wall on the 2-core
development machine and <= 0.25x one DeepSpeed estimator call measured in the same run. Prints,
per case, the median over ``--runs`` of
- wall seconds of the whole process (`python -m planner ...` with HF_HUB_OFFLINE=1),
- CPU seconds of it and every process it started (user + system, from getrusage of children),
- the ratio of the wall median to the DeepSpeed call's wall median,
and the search alone, in process, for the first cases (candidates evaluated per second).

The DeepSpeed call is `estimate_zero2_model_states_mem_needs_all_cold` for Llama-3.1-8B on one
node of 8 GPUs in a fresh process: the single published estimator call a user would otherwise make.

    .venv/bin/python benchmarks/suggest_walltime.py [--runs 5] [--only NAME]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLANNER = [sys.executable, "-m", "planner"]
MODEL = "meta-llama/Llama-3.1-8B"
DEEPSPEED = [sys.executable, "-c",
             "from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold as f; "
             "f(total_params=8_030_261_248, num_gpus_per_node=8, num_nodes=1)"]


def cases(job_dir: Path) -> dict[str, list[str]]:
    return {
        "suggest 8B 1xA100-40": PLANNER + ["suggest", "--model", MODEL, "--gpus", "1xA100-40"],
        "suggest 8B 8xH100-80": PLANNER + ["suggest", "--model", MODEL, "--gpus", "8xH100-80"],
        "suggest 70B 8xH100-80": PLANNER + ["suggest", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "8xH100-80"],
        "suggest 405B 1xRTX4090 (none fits)": PLANNER + ["suggest", "--model", "meta-llama/Llama-3.1-405B",
                                                         "--gpus", "1xRTX4090-24"],
        "suggest 8B 1xRTX4090 --adapter any": PLANNER + ["suggest", "--model", MODEL, "--gpus", "1xRTX4090-24",
                                                         "--adapter", "any"],
        "suggest 8B 512x8xH100-80": PLANNER + ["suggest", "--model", MODEL, "--gpus", "512x8xH100-80"],
        "suggest 8B 8xH100-80 --seq-len 32768 (sequence-parallel layouts)": PLANNER + ["suggest", "--model", MODEL, "--gpus",
                                                                            "8xH100-80", "--seq-len", "32768"],
        "suggest 8B 8xH100-80 --seq-len 131072 (sequence-parallel layouts)": PLANNER + ["suggest", "--model", MODEL, "--gpus",
                                                                             "8xH100-80", "--seq-len", "131072"],
        "suggest 70B 2x8xH100-80 (tensor-parallel layouts)": PLANNER + ["suggest", "--model", "meta-llama/Llama-3.1-70B",
                                                                       "--gpus", "2x8xH100-80"],
        "suggest 70B 2x8xH100-80 --tensor-parallel none": PLANNER + ["suggest", "--model", "meta-llama/Llama-3.1-70B",
                                                                    "--gpus", "2x8xH100-80", "--tensor-parallel", "none"],
        "suggest 7B 8xH100-80 --method grpo": PLANNER + ["suggest", "--model", "Qwen/Qwen2.5-7B", "--gpus", "8xH100-80",
                                                         "--method", "grpo", "--seq-len", "1536",
                                                         "--completion-len", "1024"],
        "check --job-dir": PLANNER + ["check", "--job-dir", str(job_dir), "--model", MODEL, "--gpus", "1xA100-40"],
        "estimate 8B 1xA100-40": PLANNER + ["estimate", "--model", MODEL, "--gpus", "1xA100-40"],
        "planner --version": PLANNER + ["--version"],
        "imports of the suggest path": [sys.executable, "-c", "import planner.cli.commands, planner.cli.flows, "
                                        "planner.engine.suggest, planner.render.report"],
    }


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children)."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(cmd: list[str], runs: int) -> tuple[float, float]:
    samples = [timed(cmd) for _ in range(runs)]
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def compile_planner() -> str:
    """Byte-compile planner's packages where they are installed, as pip does when it installs the
    wheel (an editable checkout under PYTHONDONTWRITEBYTECODE=1 would otherwise compile every
    module it imports in every timed process: ~0.04 s here)."""
    import compileall

    import planner

    root = Path(planner.__file__).resolve().parent.parent
    dirs = [root / name for name in ("planner", "strategies", "probes") if (root / name).is_dir()]
    ok = all(compileall.compile_dir(d, quiet=1) for d in dirs)
    return "bytecode compiled" if ok else "bytecode NOT compiled (timings include compiling)"


def in_process(gpus: str) -> tuple[float, int, int]:
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.engine.search import search_plans
    from planner.engine.space import build_space

    model, hw = resolve_model(MODEL), parse_gpus(gpus)
    space = build_space(hw.num_gpus, 2048)
    start = time.perf_counter()
    out = search_plans(space, model, hw)
    return time.perf_counter() - start, out.evaluated, space.size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    args = parser.parse_args()
    compiled = compile_planner()
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job"
        subprocess.run(PLANNER + ["suggest", "--model", MODEL, "--gpus", "1xA100-40", "--out", str(job)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       env=os.environ | {"HF_HUB_OFFLINE": "1"})
        bare, _ = medians([sys.executable, "-c", "pass"], args.runs)
        ds_wall, ds_cpu = medians(DEEPSPEED, args.runs)
        print(f"runs per figure: {args.runs} (medians); python -c pass: {bare:.3f} s; "
              f"one DeepSpeed estimator call: {ds_wall:.2f} s wall, {ds_cpu:.2f} s CPU; {compiled}")
        print(f"{'case':38s} {'wall s':>7s} {'CPU s':>7s} {'x DeepSpeed':>12s}")
        for name, cmd in cases(job).items():
            if args.only not in name:
                continue
            wall, cpu = medians(cmd, args.runs)
            print(f"{name:38s} {wall:7.2f} {cpu:7.2f} {wall / ds_wall:12.2f}")
    if args.only:
        return
    print(f"\n{'search alone':16s} {'seconds':>8s} {'evaluated':>10s} {'space':>8s} {'candidates/s':>13s}")
    for gpus in ("1xA100-40", "8xH100-80"):
        runs = [in_process(gpus) for _ in range(args.runs)]
        seconds = statistics.median(s for s, _, _ in runs)
        print(f"{gpus:16s} {seconds:8.3f} {runs[0][1]:10,d} {runs[0][2]:8,d} {runs[0][2] / seconds:13,.0f}")
    print("candidates/s counts the whole space: refused combinations, those a simpler twin decides, and")
    print("the micro-batch sizes above the first that does not fit are decided without a full evaluation.")


if __name__ == "__main__":
    main()
