"""A package the plan needs is missing at the launch: ``python -m planner.launch`` exits 2 (bad input) with one
paragraph that names the module and the pip install line of planner's extra that provides it
(pyproject.toml's optional-dependencies), before it loads the model, and without a traceback. Each
case is a way the libraries would otherwise fail without naming the module: transformers' own check
for Liger (the chunked loss) and for bitsandbytes (QLoRA's 4-bit load), a DeepSpeed plan, which
transformers' arguments refuse with a TypeError, and a tiled MLP without ZeRO (DeepSpeed's TiledMLP,
which the launch would import only when it patches the model).

The child runs with the module absent: None in ``sys.modules`` is what ``import`` and
``importlib.util.find_spec`` (transformers' availability checks) both see for a package that is not
installed. ``--model`` names no folder: the launch must stop at the package before it gets there.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.emit import build_files, single_plan_result, write_files

from helpers import FULL, run

TINY = str(Path(__file__).resolve().parent / "data" / "tiny-llama")
SHAPE = dict(micro_batch_size=2, grad_accum=2, seq_len=64, precision="bf16-mixed")
#: python -c ABSENT MODULE ARGS...: python -m planner.launch ARGS with MODULE not installed.
ABSENT = ("import runpy, sys; sys.modules[sys.argv.pop(1)] = None; "
          "runpy.run_module('planner.launch', run_name='__main__', alter_sys=True)")
CASES = [
    # name, plan, absent module, planner extra that installs it
    ("chunked-loss", dict(loss="chunked"), "liger_kernel", "liger"),
    ("qlora", dict(adapter="qlora"), "bitsandbytes", "bitsandbytes"),
    ("zero3", dict(sharding="zero3"), "deepspeed", "deepspeed"),
    ("tiled-mlp", dict(tiled_mlp="tiled", precision="bf16-pure"), "deepspeed", "deepspeed"),  # DeepSpeed's TiledMLP, one GPU, no ZeRO
]


@pytest.mark.parametrize("config, module, extra", [pytest.param(*c[1:], id=c[0], marks=() if c[0] == "qlora" else FULL)
                                                   for c in CASES])
def test_a_missing_package_exits_2_naming_it_and_its_extra(tmp_path, config, module, extra):
    plan = run(TINY, "1xA100-80", **(SHAPE | config))
    assert plan.feasible, plan.reasons
    write_files(build_files(single_plan_result(plan)), tmp_path / "plan", force=False)
    done = subprocess.run([sys.executable, "-P", "-c", ABSENT, module, "--job-dir", str(tmp_path / "plan"),
                           "--model", str(tmp_path / "no-model"), "--data", "sample", "--max-steps", "1", "--no-save"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    assert (f"planner.launch: the plan needs the Python package {module}, which is not installed. Install it with "
            f"pip install 'llm-train-planner[{extra}]'") in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
