"""Phase C of the GPU validation: what a user launches, run as a user runs it.

A model folder is built on the box (the catalog's Llama-3.2-1B config.json, random bf16 weights,
a tokenizer trained on the shipped sample text; ``--cpu``: the tiny model), plans are written
through the CLI (``planner suggest --out``: the winner on this GPU, its ``--adapter qlora`` twin,
a DPO, a KTO and a GRPO plan: ``LAUNCHES``), and each ``launch.sh`` trains 3 steps on the sample text
while nvidia-smi is polled every 100 ms. Recorded per launch: exit code, wall seconds, the Trainer's steps per second, the polled
peak beside the plan's, and the live report's differences from the plan.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from planner.probes.forked import run_forked

ROOT = Path(__file__).resolve().parents[2]
TINY_CONFIG = ROOT / "tests" / "data" / "tiny-llama" / "config.json"
GPU_MODEL = "meta-llama/Llama-3.2-1B"
STEPS = 3
#: The Trainer's closing metrics line: {'train_runtime': ..., 'train_steps_per_second': ...}.
_STEPS_PER_SECOND = re.compile(r"'train_steps_per_second': '?([0-9.]+)")


def build_folder(work: Path, device: str) -> tuple[Path, str, float]:
    """The model folder, the --model reference its plans are made for, and the seconds it took."""
    from planner.catalog.models import model_config

    folder = work / "model"
    if device == "cuda":
        config, ref, dtype = model_config(GPU_MODEL), GPU_MODEL, "bfloat16"
    else:
        config, ref, dtype = json.loads(TINY_CONFIG.read_text()), str(TINY_CONFIG.parent), None

    def build(_: str) -> str:
        from planner.launch.model_folder import make_model_folder

        make_model_folder(config, folder, dtype=dtype, device=device)
        return str(folder)

    outcome = run_forked(build, "", 180)
    if outcome.status != "ok":
        raise RuntimeError(f"building the model folder failed: {outcome.describe()[-800:]}")
    return folder, ref, outcome.seconds


def planner_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The planner CLI in a child process, with this process's environment (its PYTHONPATH names
    the planner it runs; the driver made it offline)."""
    return subprocess.run([sys.executable, "-P", "-c", "from planner.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


#: The launches, in order: name -> the suggest flags beyond the model and GPU (on the GPU, on the
#: CPU's tiny model). The suggested plan, its QLoRA twin, and a DPO, a KTO and a GRPO plan through
#: TRL's trainers (GRPO with transformers' generation: vLLM is not in the carried bundle), each
#: small enough for a few steps: the methods' memory rows (the reference forward, the rollout's KV
#: cache) and their time against a real GPU.
LAUNCHES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "suggested": ((), ()),
    "suggested-qlora": (("--adapter", "qlora"), ("--adapter", "qlora")),
    "suggested-dpo": (("--method", "dpo", "--seq-len", "1024"), ("--method", "dpo")),
    "suggested-kto": (("--method", "kto", "--seq-len", "1024"), ("--method", "kto")),
    "suggested-grpo": (("--method", "grpo", "--generation", "transformers", "--seq-len", "640", "--completion-len",
                        "128", "--global-batch-size", "64"),
                       ("--method", "grpo", "--generation", "transformers", "--completion-len", "16",
                        "--num-generations", "2")),
}


def write_plan(ref: str, gpus: str, out: Path, device: str, name: str) -> dict:
    args = ["suggest", "--model", ref, "--gpus", gpus, "--out", str(out)]
    gpu_flags, cpu_flags = LAUNCHES[name]
    if device != "cuda":  # the tiny model's shape; Liger's chunked loss needs CUDA
        args += ["--seq-len", "64", "--global-batch-size", "4", "--loss", "standard", *cpu_flags]
    else:
        args += list(gpu_flags)
    r = planner_cli(*args)
    return {"command": "planner " + " ".join(args), "rc": r.returncode, "verdict": (r.stdout.splitlines() or [""])[0],
            "stderr": r.stderr[-600:]}


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the launch's process group, SIGKILL after 10 s, then wait (up to 30 s) for the
    group's processes to leave, so that the GPU memory they held is free for the next case."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace
        while time.monotonic() < end:
            proc.poll()  # the leader reaped, so that only live processes keep the group
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def run_launch(job: Path, folder: Path, device: str, timeout: float) -> dict:
    """``launch.sh --max-steps 3 --no-save`` on the folder with the sample text; nvidia-smi polled."""
    from planner.emit import load_plan_file

    plan = load_plan_file(job / "plan.json").plans[0]
    env = os.environ | {"MODEL": str(folder), "DATA": "sample", "MAIN_PORT": "29611",
                    "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    if device != "cuda":
        env |= {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    poll = Poller() if device == "cuda" else None
    start = time.monotonic()
    # its own session: on timeout the whole group goes (accelerate's workers hold the GPU, and a
    # worker left behind makes the next case run out of memory)
    proc = subprocess.Popen([str(job / "launch.sh"), "--max-steps", str(STEPS), "--no-save"], cwd=job, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        log, _ = proc.communicate()
        rc = "timeout"
    wall = time.monotonic() - start
    peak = poll.stop() if poll else None
    reports = sorted((job / "outputs").glob("planner-live-rank*.json"))
    differences = json.loads(reports[0].read_text())["differences"] if reports else None
    steps = _STEPS_PER_SECOND.findall(log)
    return {"rc": rc, "wall_seconds": round(wall, 1), "steps_per_second": float(steps[-1]) if steps else None,
            "predicted_step_seconds": plan.time.step_seconds, "predicted_peak_gib": plan.memory["peak"] / 2**30,
            "polled_peak_gib": peak / 2**30 if peak is not None else None,
            "polled_baseline_gib": poll.baseline / 2**30 if poll and poll.baseline is not None else None,
            "config": plan.config.model_dump(mode="json"), "differences": differences,
            "live_verdict": next((ln for ln in log.splitlines() if "planner.launch: rank" in ln), ""),
            "log_tail": log[-3000:]}


class Poller:
    """nvidia-smi's device-wide used memory every 100 ms in a background thread: the maximum, and
    the first reading (before the launch allocated anything) as the baseline."""

    def __init__(self) -> None:
        self.peak: int | None = None
        self.baseline: int | None = None
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0", "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip().isdigit():
                used = int(line.strip()) << 20
                self.baseline = used if self.baseline is None else self.baseline
                self.peak = max(self.peak or 0, used)

    def stop(self) -> int | None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.thread.join(timeout=5)
        return self.peak
