"""planner estimate as a user runs it: exit codes, JSON, clear errors, never a traceback."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.cli import app
from planner.core.ledger import TERMS

from helpers import examples

runner = CliRunner()
BASE = ["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40"]


def invoke(*args):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def test_fits_exit_0_and_json_contract():
    r = invoke(*BASE, "--optimizer", "paged-adamw-8bit", "--precision", "bf16-pure", "--checkpointing", "full",
               "--seq-len", "512", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["model"]["num_parameters"] == out["model"]["num_trainable_parameters"] == 8_030_261_248
    assert out["hardware"]["gpu"] == "A100-SXM-40" and out["hardware"]["num_gpus"] == 1
    assert out["hardware"]["gpu_memory_bytes"] == 40 * 2**30
    assert set(out["config"]) == {"optimizer", "precision", "checkpointing", "sharding", "offload", "loss",
                                  "attention", "adapter", "method", "generation", "sequence_parallel", "checkpoint_offload", "tiled_mlp", "tensor_parallel", "checkpoint_impl", "fsdp_version", "gradient_sync", "zero_reduce_bucket_size",
                                  "zero_prefetch_bucket_size", "zero_persistence_threshold", "zero_max_live_parameters",
                                  "loss_path", "model_output", "lora_rank", "lora_targets",
                                  "lora_alpha", "lora_dropout", "adapter_dtype", "nf4_matmul", "kbit_prep", "dpo_reference", "dpo_logprobs", "kto_loss",
                                  "num_generations", "completion_len", "kl_beta", "generation_batch_size", "num_iterations", "vllm_share", "vllm_gpus", "vllm_tp",
                                  "sp_size", "tp_size", "micro_batch_size", "grad_accum", "seq_len", "batching", "kernel_seq_len",
                                  "attention_seq_len", "real_seq_len"}
    assert out["config"]["batching"] == "packed" and out["config"]["kernel_seq_len"] is None
    assert set(out["memory"]) == set(TERMS) | {"peak"}
    assert sum(v for k, v in out["memory"].items() if k != "peak") == out["memory"]["peak"]
    assert {"peak", "capacity"} <= set(out["host_memory"])
    assert out["fits"] is True and isinstance(out["reasons"], list) and out["reasons"]


def test_does_not_fit_exit_1_says_by_how_much():
    r = invoke(*BASE)
    assert r.exit_code == 1
    assert "DOES NOT FIT" in r.output and "short" in r.output


@pytest.mark.parametrize("args, needle", [
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40", "--precision", "fp8-mixed"], "fp8"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xV100-32", "--precision", "bf16-mixed"], "bf16"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100-80", "--optimizer", "paged-adamw-8bit", "--sharding", "fsdp"],
     "FSDP"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100-80", "--offload", "optimizer", "--sharding", "ddp"],
     "ZeRO"),
    (["--model", "openai-community/gpt2", "--gpus", "1xA100-40", "--seq-len", "2048"], "learned positions"),
])
def test_infeasible_exit_1_says_why(args, needle):
    r = invoke("estimate", *args, "--json")
    assert r.exit_code == 1
    out = json.loads(r.output)
    assert out["feasible"] is False and out["fits"] is False
    assert any(needle in reason for reason in out["reasons"]), out["reasons"]


@pytest.mark.parametrize("args, needle", [
    (["--model", "meta-llama/Llama-3.1-8", "--gpus", "1xA100-40"], "Did you mean"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA1000-40"], "unknown GPU"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "axb"], "unknown GPU"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40", "--micro-batch-size", "0"], "micro-batch-size"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40", "--margin", "1.5"], "margin"),
    (["--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40", "--optimizer", "adam"], "adam"),
    (["--model", "/nonexistent/dir/config.json", "--gpus", "1xA100-40"], "unknown model"),
])
def test_bad_input_exit_2_with_a_message(args, needle):
    r = invoke("estimate", *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output


def test_margin_turns_a_tight_fit_into_a_miss():
    args = ["estimate", "--model", "meta-llama/Llama-3.2-3B", "--gpus", "1xA100-40", "--optimizer", "adamw-8bit",
            "--precision", "bf16-pure", "--checkpointing", "full", "--seq-len", "512", "--json"]
    fits = json.loads(invoke(*args).output)
    assert fits["fits"]
    need = fits["memory"]["peak"] / fits["hardware"]["gpu_memory_bytes"]
    assert invoke(*args, "--margin", f"{1 - need - 0.01:.3f}").exit_code == 0
    assert invoke(*args, "--margin", f"{1 - need + 0.01:.3f}").exit_code == 1


def test_console_script_runs_without_torch_imported():
    """The installed `planner` command starts without importing torch (DESIGN layers)."""
    code = ("import sys; from planner.cli import app; from planner.engine.estimate import estimate; import planner.render.report; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-P", "-c", code], check=True)


@settings(max_examples=examples(300))
@given(model=st.one_of(st.sampled_from(["gpt2", "Qwen/Qwen2.5-0.5B", "", "."]), st.text(max_size=30)),
       gpus=st.one_of(st.sampled_from(["1xA100-40", "2x4xH100", "0x0x", "8xH100-80"]), st.text(max_size=20)),
       numbers=st.lists(st.one_of(st.integers(-10**20, 10**20), st.text(max_size=5)), min_size=3, max_size=3))
def test_garbage_never_makes_a_traceback(model, gpus, numbers):
    mbs, seq, host = (str(n) for n in numbers)
    r = invoke("estimate", "--model", model, "--gpus", gpus, "--mbs", mbs, "--seq-len", seq,
               "--host-memory-gb", host, "--json")
    assert r.exit_code in (0, 1, 2)


def test_lists_models_and_gpus():
    assert "meta-llama/Llama-3.1-405B" in invoke("models").output
    assert "H100-SXM-80" in invoke("gpus").output


def test_host_ram_is_checked_for_offload():
    """FSDP2's CPU offload of a 7.6B model under bf16-mixed keeps 16 bytes/param in host RAM per
    node (fp32 parameter shards, their fp32 gradients and AdamW's two fp32 states: torch
    CPUOffloadPolicy), up to the shards' padding."""
    args = ["estimate", "--model", "Qwen/Qwen2.5-7B", "--gpus", "2xRTX4090-24", "--sharding", "fsdp",
            "--offload", "optimizer+params", "--checkpointing", "full", "--json"]
    small = invoke(*args, "--host-memory-gb", "64")
    assert small.exit_code == 1
    out = json.loads(small.output)
    assert out["memory"]["peak"] <= out["usable_bytes"]
    assert any(r.startswith("host RAM does not fit") for r in out["reasons"])
    assert out["host_memory"]["offloaded"] == pytest.approx(16 * out["model"]["num_parameters"], rel=1e-6)
    assert invoke(*args, "--host-memory-gb", "256").exit_code == 0


@pytest.mark.parametrize("args, unused", [
    (["--adapter", "lora", "--kbit-prep", "fp32"], "--kbit-prep fp32 means nothing under adapter lora"),
    (["--lora-rank", "8"], "--lora-rank 8 means nothing under adapter none"),
    (["--adapter", "qlora", "--kbit-prep", "fp32-norms"], None)])
def test_a_setting_its_technique_leaves_unused_is_said(args, unused):
    """A setting named on the command line where its technique's value does not use it is planned
    without, and the estimate says so; one that is used is not mentioned."""
    r = runner.invoke(app, ["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xH100-80", "--json", *args])
    warnings = json.loads(r.stdout)["warnings"]
    said = [w for w in warnings if "means nothing under" in w]
    assert said == ([f"{unused}: planned without it"] if unused else []), warnings
