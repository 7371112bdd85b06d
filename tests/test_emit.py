"""Emitted files, proven by the real consumers: accelerate's config loader and launch
validation, DeepSpeed's DeepSpeedConfig at the plan's world size, transformers' TrainingArguments.
Plus writing rules (atomic, never overwrite without --force) and golden files."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.catalog.models import resolve_model
from planner.cli import app
from planner.emit import FILE_NAMES, build_files, single_plan_result, write_files
from planner.emit.writer import MANIFEST
from planner.strategies.sharding import deepspeed_buckets

from helpers import run

ROOT = Path(__file__).resolve().parent.parent
LLAMA = "meta-llama/Llama-3.1-8B"
# (name, model, gpus, config): every sharding mode, every precision, offloads, optimizers
CASES = [
    ("single-bf16", LLAMA, "1xH100-80", dict(optimizer="adamw-8bit", checkpointing="full")),
    ("single-pure-paged", LLAMA, "1xA100-40", dict(optimizer="paged-adamw-8bit", precision="bf16-pure", checkpointing="full", seq_len=512)),
    ("ddp-fp16", "Qwen/Qwen2.5-0.5B", "8xA100-80", dict(sharding="ddp", precision="fp16-mixed", loss="chunked")),
    ("zero1-fp32", "openai-community/gpt2", "4xA100-80", dict(sharding="zero1", precision="fp32", seq_len=1024, micro_batch_size=2, grad_accum=4)),
    ("zero2", LLAMA, "8xH100-80", dict(sharding="zero2", checkpointing="full", micro_batch_size=2, grad_accum=4)),
    ("zero2-offload-lion", LLAMA, "2x8xH100-80", dict(sharding="zero2", offload="optimizer", optimizer="lion")),
    ("zero3-offload", "meta-llama/Llama-3.1-70B", "8xH100-80", dict(sharding="zero3", offload="optimizer", checkpointing="full")),
    ("zero3-8bit", LLAMA, "8xH100-80", dict(sharding="zero3", optimizer="adamw-8bit")),
    ("fsdp-fp8", LLAMA, "8xH100-80", dict(sharding="fsdp", precision="fp8-mixed", checkpointing="full")),
    ("fsdp-grad-op-offload", "mistralai/Mixtral-8x7B-v0.1", "8xH100-80", dict(sharding="fsdp-grad-op", offload="optimizer+params")),
    ("fsdp-hybrid-pure", "google/gemma-2-9b", "2x8xH100-80", dict(sharding="fsdp-hybrid", precision="bf16-pure", attention="eager")),
    ("fsdp-adam-mini-selective", "microsoft/Phi-3-mini-4k-instruct", "4xL40S", dict(sharding="fsdp", optimizer="adam-mini", checkpointing="selective")),
]
NAMES = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    out = {}
    for name, model, gpus, cfg in CASES:
        plan = run(model, gpus, **cfg)
        assert plan.feasible, (name, plan.reasons)
        d = tmp_path_factory.mktemp(name)
        write_files(build_files(single_plan_result(plan)), d, force=False)
        out[name] = (plan, d)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_accelerate_loads_validates_and_prepares(emitted, name, monkeypatch):
    """accelerate's own loader, `accelerate launch` argument validation and environment
    preparation, stopping short of starting processes."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    plan, d = emitted[name]
    monkeypatch.chdir(d)
    config = load_config_from_file(str(d / "accelerate_config.yaml"))
    assert config.num_processes == plan.hardware.num_gpus and config.num_machines == plan.hardware.nodes
    argv = ["--config_file", str(d / "accelerate_config.yaml")]
    if plan.hardware.nodes > 1:  # what launch.sh passes on every machine
        argv += ["--machine_rank", "0", "--main_process_ip", "127.0.0.1", "--main_process_port", "29500"]
    args, defaults, mp_from_config = _validate_launch_command(launch_command_parser().parse_args(argv + ["train.py"]))
    if args.use_deepspeed:  # the step `accelerate launch` takes right before its DeepSpeed launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    elif args.use_fsdp or args.multi_gpu:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    c = plan.config
    expected_mp = {"fp32": "no", "bf16-pure": "no", "fp16-mixed": "fp16", "bf16-mixed": "bf16", "fp8-mixed": "fp8"}
    if c.sharding.startswith("zero"):  # the DeepSpeed JSON's bf16 / fp16 sections decide; accelerate refuses both
        assert "mixed_precision" not in yaml.safe_load((d / "accelerate_config.yaml").read_text())
    else:
        assert env["ACCELERATE_MIXED_PRECISION"] == expected_mp[c.precision]
    if c.sharding.startswith("fsdp"):
        assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
        assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == resolve_model(plan.model.id).decoder_layer_class
        assert env["FSDP_RESHARD_AFTER_FORWARD"] == str(c.sharding != "fsdp-grad-op").lower()
        assert env["FSDP_OFFLOAD_PARAMS"] == str(c.offload != "none").lower()
        assert env["FSDP_ACTIVATION_CHECKPOINTING"] == str(c.checkpointing == "full").lower()
    if c.sharding.startswith("zero"):
        assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
        assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == "deepspeed_config.json"
        assert Path(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]).is_file()
    if c.sharding == "fsdp-hybrid":
        assert env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == str(plan.hardware.nodes)
        assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == str(plan.hardware.gpus_per_node)
    if c.precision == "fp8-mixed":
        assert env["ACCELERATE_FP8_BACKEND"] == "AO"


def test_fsdp_wraps_the_family_decoder_layer():
    """The class named for every family is the block transformers builds (what FSDP wraps)."""
    from planner.catalog.models import catalog
    from planner.probes.meta_model import build_on_meta, decoder_layers

    seen = {}
    for model_id in catalog():
        spec = resolve_model(model_id)
        if spec.family not in seen:
            seen[spec.family] = model_id
            layer = decoder_layers(build_on_meta(catalog()[model_id].config))[0]
            assert type(layer).__name__ == spec.decoder_layer_class, model_id


def test_deepspeed_config_validates_at_the_plans_world_size(emitted):
    jobs = [(str(d / "deepspeed_config.json"), plan.hardware.num_gpus, plan.model.hidden_size)
            for plan, d in emitted.values() if (d / "deepspeed_config.json").exists()]
    assert len(jobs) >= 5
    wrong = [(jobs[0][0], jobs[0][1] * 2, jobs[0][2])]  # a control that must fail: the same file at twice the world size
    proc = subprocess.run([sys.executable, str(ROOT / "tests/tools/validate_deepspeed.py"), json.dumps(jobs + wrong)],
                          capture_output=True, text=True, timeout=600, env=os.environ | {"DS_BUILD_OPS": "0"})
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    *good, control = results
    assert not control["ok"] and "train_batch_size" in control["error"]
    by_path = {p.resolve(): (plan, d) for plan, d in emitted.values() for p in [d / "deepspeed_config.json"]}
    for r in good:
        assert r["ok"], r
        plan, _ = by_path[Path(r["path"]).resolve()]
        c = plan.config
        assert r["world_size"] == plan.hardware.num_gpus
        assert r["stage"] == int(c.sharding[-1])
        assert r["train_batch_size"] == c.micro_batch_size * c.grad_accum * plan.hardware.num_gpus
        assert r["bf16"] == (c.precision in ("bf16-mixed", "fp8-mixed")) and r["fp16"] == (c.precision == "fp16-mixed")
        assert (r["offload_optimizer"] is not None) == (c.offload != "none")
        assert (r["offload_param"] is not None) == (c.offload == "optimizer+params")
        # the buckets left to "auto" are the Trainer's, from the hidden size (the memory model's)
        assert r["reduce_bucket_size"] == deepspeed_buckets(plan.model.hidden_size, c)["reduce_bucket_size"]
        assert ("reduce_bucket_size" in r["auto_buckets"]) == (c.zero_reduce_bucket_size == 0)


@pytest.mark.parametrize("name", NAMES)
def test_training_arguments_construct(emitted, name, monkeypatch):
    """transformers.TrainingArguments accepts every emitted training_args.json. On a machine without
    a GPU it refuses bf16 unless use_cpu is set: that one argument is added here, and only then."""
    import torch
    from transformers import TrainingArguments

    plan, d = emitted[name]
    monkeypatch.chdir(d)  # the deepspeed path is relative to where the job runs
    kwargs = json.loads((d / "training_args.json").read_text())
    if kwargs.get("bf16") and not torch.cuda.is_available():
        kwargs["use_cpu"] = True
    args = TrainingArguments(**kwargs)
    c = plan.config
    assert args.per_device_train_batch_size == c.micro_batch_size
    assert args.gradient_accumulation_steps == c.grad_accum
    assert args.activation_checkpointing == (c.checkpointing == "full" and not c.sharding.startswith("fsdp"))
    assert args.use_liger_kernel == (c.loss == "chunked")
    if c.sharding.startswith("zero"):
        assert args.hf_deepspeed_config.config["zero_optimization"]["stage"] == int(c.sharding[-1])
    if c.sharding.startswith("fsdp"):
        assert args.fsdp and args.fsdp_config["version"] == 2
        assert bool(args.fsdp_config.get("activation_checkpointing")) == (c.checkpointing == "full")
    if c.optimizer != "adam-mini":
        assert str(args.optim.value if hasattr(args.optim, "value") else args.optim) == kwargs["optim"]


def test_launch_script_is_valid_bash_and_multinode_needs_addresses(emitted, tmp_path):
    for plan, d in emitted.values():
        script = d / "launch.sh"
        assert os.access(script, os.X_OK)
        subprocess.run(["bash", "-n", str(script)], check=True)
        # without MODEL and DATA (or TRAIN_SCRIPT; multi-node, without MACHINE_RANK / MAIN_ADDR) it refuses to start
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert proc.returncode != 0 and "set MODEL" in proc.stderr
        proc = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], "MODEL": "m"})
        assert proc.returncode != 0 and "set DATA" in proc.stderr
        if plan.hardware.nodes > 1:
            proc = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                                  env={"PATH": os.environ["PATH"], "TRAIN_SCRIPT": "x.py"})
            assert proc.returncode != 0 and "MACHINE_RANK" in proc.stderr


def test_plan_json_round_trips_and_plan_md_explains(emitted, tmp_path):
    from planner.emit import load_plan_file

    plan, d = emitted["zero2"]
    again = load_plan_file(d / "plan.json")
    assert again.plans[0].memory == plan.memory and again.plans[0].config == plan.config
    md = (d / "PLAN.md").read_text()
    for heading in ("## Why this plan", "## Memory per GPU", "## Step time", "## What was rejected",
                    "## If it runs out of memory", "## How to run"):
        assert heading in md


def test_writes_atomically_and_never_overwrites_without_force(tmp_path):
    plan = run(LLAMA, "8xH100-80", sharding="zero3")
    files = build_files(single_plan_result(plan))
    write_files(files, tmp_path, force=False)
    before = (tmp_path / "plan.json").read_text()
    with pytest.raises(Exception) as e:
        write_files(files, tmp_path, force=False)
    assert "--force" in str(e.value.hint)
    assert (tmp_path / "plan.json").read_text() == before
    fsdp = build_files(single_plan_result(run(LLAMA, "8xH100-80", sharding="fsdp")))
    write_files(fsdp, tmp_path, force=True)
    assert not (tmp_path / "deepspeed_config.json").exists()  # the old plan's file is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*fsdp, MANIFEST])  # and no temp files remain
    (tmp_path / "notes.txt").write_text("mine")
    write_files(fsdp, tmp_path, force=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"  # files that are not planner's are never touched


def test_cli_emit_and_suggest_out(tmp_path):
    runner = CliRunner()
    out = tmp_path / "plan"
    r = runner.invoke(app, ["suggest", "--model", LLAMA, "--gpus", "8xH100-80", "--sharding", "zero3", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert {"accelerate_config.yaml", "deepspeed_config.json", "training_args.json", "runtime.json", "launch.sh",
            "plan.json", "PLAN.md", MANIFEST} == {p.name for p in out.iterdir()}
    again = runner.invoke(app, ["suggest", "--model", LLAMA, "--gpus", "8xH100-80", "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    r = runner.invoke(app, ["emit", "--plan", str(out / "plan.json"), "--out", str(tmp_path / "again")])
    assert r.exit_code == 0, r.output
    for name in ("accelerate_config.yaml", "deepspeed_config.json", "training_args.json", "launch.sh"):
        assert (out / name).read_text() == (tmp_path / "again" / name).read_text()
    (tmp_path / "bad.json").write_text('{"plans": [{"nope": 1}]}')
    for args in (["--plan", str(tmp_path / "bad.json")], ["--plan", str(tmp_path / "missing.json")],
                 ["--plan", str(out / "plan.json"), "--rank", "3"]):
        r = runner.invoke(app, ["emit", *args, "--out", str(tmp_path / "x")])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output


def test_emit_rank_says_and_runs_its_way_out(tmp_path):
    """--rank N on the plan.json that --out writes (one plan) exits 2 naming what holds the whole
    ranking; that way out, suggest --json then emit --rank, writes rank N."""
    runner = CliRunner()
    out = tmp_path / "plan"
    assert runner.invoke(app, ["suggest", "--model", LLAMA, "--gpus", "8xH100-80", "--out", str(out)]).exit_code == 0
    r = runner.invoke(app, ["emit", "--plan", str(out / "plan.json"), "--rank", "2", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--json > ranked.json" in " ".join(r.output.split()), r.output
    ranked = runner.invoke(app, ["suggest", "--model", LLAMA, "--gpus", "8xH100-80", "--json"])
    assert ranked.exit_code == 0
    (tmp_path / "ranked.json").write_text(ranked.stdout)
    r = runner.invoke(app, ["emit", "--plan", str(tmp_path / "ranked.json"), "--rank", "2", "--out", str(tmp_path / "two")])
    assert r.exit_code == 0, r.output
    second = json.loads(ranked.stdout)["plans"][1]["config"]
    assert json.loads((tmp_path / "two" / "plan.json").read_text())["plans"][0]["config"] == second


GOLDEN = ROOT / "tests" / "golden"
GOLDEN_CASES = ["single-pure-paged", "zero3-offload", "fsdp-fp8", "fsdp-hybrid-pure", "ddp-fp16"]


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_files(emitted, name):
    """Every change to an emitted file is deliberate: regenerate with PLANNER_UPDATE_GOLDEN=1."""
    _, d = emitted[name]
    target = GOLDEN / name
    if os.environ.get("PLANNER_UPDATE_GOLDEN") == "1":
        target.mkdir(parents=True, exist_ok=True)
        for old in target.iterdir():
            old.unlink()
        for f in d.iterdir():
            (target / f.name).write_text(f.read_text())
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in d.iterdir())
    for f in d.iterdir():
        assert f.read_text() == (target / f.name).read_text(), f"{name}/{f.name} changed"
    assert set(p.name for p in d.iterdir()) <= {*FILE_NAMES, MANIFEST}
