"""End to end on the CPU: the example trainer runs a few steps under `accelerate launch`, started
by the emitted launch.sh with the emitted accelerate / DeepSpeed files, for one process, DDP,
FSDP2 and DeepSpeed ZeRO-2 / ZeRO-3 with two processes each.

A tiny Llama (tests/data/tiny-llama) with random weights and synthetic tokens; bf16 autocast,
the plan's checkpointing (full, selective) and torch AdamW, as the CPU supports them. On a
machine without CUDA, DDP and FSDP run over gloo with ACCELERATE_USE_CPU=1 (the example then
hands accelerate its FSDP plugin); DeepSpeed brings up gloo itself (examples/train_causal_lm.py
explains both)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from planner.emit import build_files, single_plan_result, write_files

from helpers import run

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "data" / "tiny-llama")
SHAPE = dict(micro_batch_size=2, grad_accum=2, seq_len=64)
CASES = [
    # name, gpus, config, processes, wrapped model class, needs ACCELERATE_USE_CPU on a CPU machine
    ("single", "1xA100-80", dict(sharding="none", checkpointing="full"), 1, "LlamaForCausalLM", False),
    ("ddp", "2xA100-80", dict(sharding="ddp", checkpointing="selective"), 2, "DistributedDataParallel", True),
    ("fsdp2", "2xA100-80", dict(sharding="fsdp", checkpointing="full"), 2, "FSDPLlamaForCausalLM", True),
    ("zero2", "2xA100-80", dict(sharding="zero2"), 2, "DeepSpeedEngine", False),
    ("zero3", "2xA100-80", dict(sharding="zero3", checkpointing="full"), 2, "DeepSpeedEngine", False),
]


@pytest.mark.parametrize("name, gpus, config, processes, wrapped, use_cpu", CASES, ids=[c[0] for c in CASES])
def test_emitted_files_train_under_accelerate_launch(tmp_path, name, gpus, config, processes, wrapped, use_cpu):
    import torch

    plan = run(TINY, gpus, precision="bf16-mixed", **SHAPE, **config)
    assert plan.fits, plan.reasons
    out = tmp_path / name
    write_files(build_files(single_plan_result(plan)), out, force=False)
    env = os.environ | {
        "TRAIN_SCRIPT": str(ROOT / "examples" / "train_causal_lm.py"),
        "MAIN_PORT": str(29600 + CASES.index(next(c for c in CASES if c[0] == name)) * 7),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    if use_cpu and not torch.cuda.is_available():
        env["ACCELERATE_USE_CPU"] = "1"
    proc = subprocess.run([str(out / "launch.sh"), "--plan", str(out / "plan.json"), "--steps", "2"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    # ranks share stdout, so a summary can start mid-line: match them anywhere
    done = re.findall(r"planner-example: rank (\d+)/(\d+) \S+ (\S+) adamw bf16-mixed ckpt=(\S+): (\d+) steps", log)
    assert sorted(int(d[0]) for d in done) == list(range(processes)), log[-4000:]
    for _, world, model_class, ckpt, steps in done:
        assert (int(world), model_class, ckpt, steps) == (processes, wrapped, config.get("checkpointing", "none"), "2")
