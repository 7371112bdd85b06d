"""FSDP1 (``fsdp_version`` 1) where it differs from FSDP2: bitsandbytes' 8-bit and paged optimizers
step its flat parameter shards (FSDP2's DTensors they cannot), every rank holds an even 1/N of the
model states, and the emitted files select FSDP1 with the mode's ShardingStrategy, as accelerate and
the Trainer read them. accelerate refuses FSDP1 without an accelerator, so no launch runs here; the
live reader (planner/launch/live.py) is held to FSDP1 modules built by torch over a fake process group."""

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from planner.core.ledger import Location
from planner.emit import build_files, single_plan_result, write_files

from helpers import run

ROOT = Path(__file__).resolve().parent.parent
QWEN32 = "Qwen/Qwen2.5-32B"


@pytest.mark.parametrize("optimizer", ["paged-adamw-8bit", "paged-adamw", "lion-8bit"])
def test_bitsandbytes_optimizers_are_refused_under_fsdp2_only(optimizer):
    """open-r1's OlympicCoder-32B recipe trains paged AdamW 8-bit under FSDP1; under FSDP2 the
    Trainer's bitsandbytes optimizer fails on DTensor parameters."""
    fsdp2 = run(QWEN32, "8xH100-80", sharding="fsdp", optimizer=optimizer, checkpointing="full")
    fsdp1 = run(QWEN32, "8xH100-80", sharding="fsdp", fsdp_version=1, optimizer=optimizer, checkpointing="full")
    assert not fsdp2.feasible and any("FSDP2" in r for r in fsdp2.reasons), fsdp2.reasons
    assert fsdp1.feasible, fsdp1.reasons


def test_fsdp1_shards_every_model_state_evenly():
    """FSDP1 flattens a unit's parameters into one tensor padded to a multiple of the world size:
    rank 0 holds ceil(P / N) elements of the model (P: parameters); FSDP2 gives it ceil(dim0 / N)
    rows of each tensor, more where dim 0 does not divide (Qwen2.5-32B's 5 KV heads x 128 = 640
    rows of k_proj and v_proj over 48 ranks: 14 rows each, 672 in all)."""
    world = 48
    states = {}
    for version in (1, 2):
        plan = run(QWEN32, "6x8xH100-80", sharding="fsdp", fsdp_version=version, checkpointing="full")
        rows = [r for r in plan.ledger if r.term == "weights" and r.location == Location.GPU]
        states[version] = sum(r.bytes for r in rows)
    total = plan.model.num_parameters
    assert states[1] == pytest.approx(4 * total / world, abs=4 * world)
    assert states[2] > states[1]


@pytest.mark.parametrize("sharding, strategy", [("fsdp", "FULL_SHARD"), ("fsdp-grad-op", "SHARD_GRAD_OP"),
                                                ("fsdp-hybrid", "HYBRID_SHARD")])
def test_emitted_fsdp1_files_build_the_planned_plugin(tmp_path, monkeypatch, sharding, strategy):
    """accelerate's loader and launcher environment, then its FullyShardedDataParallelPlugin built
    from that environment (what a launched process constructs): FSDP1 with the mode's strategy, the
    family's decoder layer wrapped, original parameters, rank-0 loading; and the Trainer's own
    arguments read back as FSDP1 with the same strategy."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from transformers import TrainingArguments

    gpus = "2x8xH100-80" if sharding == "fsdp-hybrid" else "8xH100-80"
    plan = run("meta-llama/Llama-3.1-8B", gpus, sharding=sharding, fsdp_version=1, optimizer="paged-adamw-8bit")
    assert plan.feasible, plan.reasons
    write_files(build_files(single_plan_result(plan)), tmp_path, force=False)
    monkeypatch.chdir(tmp_path)
    config = load_config_from_file(str(tmp_path / "accelerate_config.yaml"))
    assert config.fsdp_config["fsdp_version"] == 1
    argv = ["--config_file", "accelerate_config.yaml"]
    if plan.hardware.nodes > 1:
        argv += ["--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", "29500"]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv + ["train.py"]))
    env = prepare_multi_gpu_env(args)
    assert env["FSDP_VERSION"] == "1" and env["FSDP_SHARDING_STRATEGY"] == strategy
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # sync_module_states asks for the current CUDA device (the CPU has none): that lookup alone is faked
    import accelerate.utils.dataclasses as acc_dataclasses
    import torch

    monkeypatch.setattr(acc_dataclasses, "is_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 1 and plugin.sharding_strategy.name == strategy
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]
    assert plugin.use_orig_params and plugin.sync_module_states and not plugin.cpu_offload.offload_params
    kwargs = json.loads((tmp_path / "training_args.json").read_text())
    trainer_args = TrainingArguments(**kwargs | {"use_cpu": True})
    fsdp = trainer_args.fsdp_plugin_args  # what the Trainer hands accelerate's plugin
    assert (fsdp["fsdp_version"], fsdp["reshard_after_forward"]) == (1, strategy.lower())
    assert fsdp["use_orig_params"] and fsdp["sync_module_states"] and fsdp["backward_prefetch"] == "BACKWARD_PRE"
    assert kwargs["optim"] == "paged_adamw_8bit"  # bitsandbytes' own, not torchao's FSDP2 stand-in


def test_check_reads_an_fsdp1_file_as_fsdp1(tmp_path):
    """TRL's fsdp1.yaml (accelerate FSDP1, FULL_SHARD) with open-r1's paged AdamW 8-bit: read as
    fsdp, FSDP1, and not refused; the same file without fsdp_version is FSDP1 too (accelerate's
    default); with fsdp_version 2 the optimizer is refused."""
    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError  # noqa: F401  (the refusal is a verdict, not bad input)

    src = ROOT / "tests/data/recipes/huggingface__trl/examples/accelerate_configs/fsdp1.yaml"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"optim": "paged_adamw_8bit", "bf16": True, "gradient_checkpointing": True}))
    result = check(CheckRequest(model=QWEN32, gpus="8xH100-80", accelerate_config=src, training_args=args,
                                alternatives=0))
    c = result.estimate.config
    assert (c.sharding, c.fsdp_version, c.optimizer) == ("fsdp", 1, "paged-adamw-8bit")
    assert result.sources["fsdp_version"].endswith("fsdp_version"), result.sources
    d = yaml.safe_load(src.read_text())
    del d["fsdp_config"]["fsdp_version"]
    (tmp_path / "noversion.yaml").write_text(yaml.safe_dump(d))
    result = check(CheckRequest(model=QWEN32, gpus="8xH100-80", accelerate_config=tmp_path / "noversion.yaml",
                                training_args=args, alternatives=0))
    assert result.estimate.config.fsdp_version == 1 and "default" in result.sources["fsdp_version"]
    d["fsdp_config"]["fsdp_version"] = 2
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(d))
    result = check(CheckRequest(model=QWEN32, gpus="8xH100-80", accelerate_config=tmp_path / "v2.yaml",
                                training_args=args, alternatives=0))
    assert not result.fits and any("FSDP2" in r for r in result.reasons), result.reasons


LIVE = r"""
import os, sys, json, torch, torch.distributed as dist
from functools import partial
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from planner.launch.live import _fsdp1
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1]))
root = FSDP(model, auto_wrap_policy=partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer}),
            device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP, use_orig_params=True)
apply_activation_checkpointing(root, check_fn=lambda m: isinstance(m, LlamaDecoderLayer))  # (accelerate's order)
print(json.dumps(_fsdp1(root, model)))
dist.destroy_process_group()
"""


def test_live_reader_sees_fsdp1_modules(tmp_path):
    """Rank 0 of two (a fake process group: FSDP1 shards as over two real ranks and would fall back
    to NO_SHARD over one) wraps the tiny Llama as accelerate does for FSDP1 (each decoder layer a
    unit, checkpoint wrappers inside): the live reader says fsdp-grad-op, FSDP1, every layer a unit.
    The child imports planner where it is installed."""
    import subprocess

    script = tmp_path / "live.py"
    script.write_text(LIVE)
    proc = subprocess.run([sys.executable, str(script), str(ROOT / "tests/data/tiny-llama")], capture_output=True,
                          text=True, env=os.environ | {"OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sharding, offload, detail = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (sharding, offload) == ("fsdp-grad-op", "none")
    assert detail == {"fsdp_version": 1, "fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_decoder_layer_units": 2}
