"""The memory model against published formulas and DeepSpeed's own estimators."""

import re

import pytest

from planner.catalog.models import resolve_model
from planner.core.ledger import Location, Phase
from planner.cost import activations, params
from planner.cost.zero import zero_model_state_bytes
from planner.strategies.sharding import ZERO_SUB_GROUP_SIZE, deepspeed_buckets

from helpers import run

GIB = 2**30
STATE_TERMS = ("weights", "master_weights", "gradients", "optimizer_states")


def gpu_state_rows(result, *, persistent_small=False) -> int:
    """Per-GPU model states: the GPU rows of the four model-state terms at the optimizer step (the
    backward phases hold partial gradient rows of their own)."""
    return sum(
        r.bytes for r in result.ledger
        if r.location == Location.GPU and r.term in STATE_TERMS and Phase.STEP in r.phases
        and ("persistent" in r.label) == persistent_small
    )


def host_bytes(result) -> int:
    return result.host_memory["offloaded"]


@pytest.mark.parametrize("stage, gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.88)])
def test_zero_paper_figure_1(stage, gb):
    """ZeRO paper: Psi=7.5B, K=12, Nd=64 -> 120 / 31.4 / 16.6 / 1.88 GB (3 significant digits)."""
    assert zero_model_state_bytes(7.5e9, 12, stage, 64) / 1e9 == pytest.approx(gb, rel=0.005)


@pytest.mark.parametrize("sharding, stage", [("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)])
def test_ledger_model_states_equal_zero_paper(sharding, stage):
    """Mixed-precision AdamW on 64 GPUs: the ledger's model-state rows are the paper's formula."""
    r = run("meta-llama/Llama-3.1-8B", "8x8xH100-80", optimizer="adamw", precision="bf16-mixed", sharding=sharding)
    psi = r.model.num_parameters
    # plus torch AdamW's fp32 step scalar per parameter tensor (under DeepSpeed one per flat group:
    # the Trainer's two, with and without weight decay), which the paper's K=12 leaves out
    counters = sum(row.bytes for row in r.ledger if row.label.startswith("optimizer step counters"))
    tensors = 2 if stage else 32 * 9 + 3
    assert counters == 4 * tensors
    assert gpu_state_rows(r) - counters == pytest.approx(zero_model_state_bytes(psi, 12, stage, 64), abs=8)
    if stage == 3:  # plus small tensors ZeRO-3 leaves whole on every rank (stage3_param_persistence_threshold)
        m = resolve_model("meta-llama/Llama-3.1-8B")
        small = sum(t.numel * params.multiplicity(m, t) for t in params.model_tensors(m)
                    if t.numel <= deepspeed_buckets(m.hidden_size)["stage3_param_persistence_threshold"])
        assert gpu_state_rows(r, persistent_small=True) == pytest.approx(2 * small * 63 / 64, abs=2)


@pytest.mark.parametrize("sharding, stage", [("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)])
def test_adapter_model_states_are_the_zero_paper_over_the_adapters(sharding, stage):
    """LoRA (rank 16, all-linear) under mixed-precision AdamW on 64 GPUs: the adapters' states are
    the paper's formula with Psi = the 41,943,040 adapter parameters (DeepSpeed: 16-bit adapters,
    fp32 masters and moments; DDP: fp32 adapters under autocast, the same 16 B per parameter), and
    the frozen 16-bit base (2 B per parameter, no gradient or state) is divided only by ZeRO-3."""
    r = run("meta-llama/Llama-3.1-8B", "8x8xH100-80", optimizer="adamw", precision="bf16-mixed", sharding=sharding,
            adapter="lora")
    psi_a, psi_f = r.model.num_trainable_parameters, r.model.num_parameters
    assert psi_a == 41_943_040
    frozen = sum(row.bytes for row in r.ledger if row.label.startswith("frozen base"))
    assert frozen == pytest.approx(2 * psi_f / (64 if stage == 3 else 1), abs=1)
    counters = sum(row.bytes for row in r.ledger if row.label.startswith("optimizer step counters"))
    assert counters == 4 * (2 if stage else 32 * 7 * 2)  # one per flat group (two), or per adapter tensor
    assert gpu_state_rows(r) - frozen - counters == pytest.approx(zero_model_state_bytes(psi_a, 12, stage, 64), abs=8)


def _deepspeed_table(capsys, fn, **kw) -> dict[str, tuple[float, float]]:
    """Run one of DeepSpeed's *_all_cold estimators; {options: (per CPU GiB, per GPU GiB)}."""
    fn(**kw)
    rows = re.findall(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.+)$", capsys.readouterr().out, re.M)
    return {opts.replace("OffloadDeviceEnum.", ""): (float(cpu), float(gpu)) for cpu, gpu, opts in rows}


def test_deepspeed_zero2_estimator(capsys):
    """estimate_zero2_model_states_mem_needs_all_cold, 1 node x 4 GPUs, Llama-3.1-8B.

    GPU: identical (2 Psi 16-bit weights + 18 Psi / N: 16-bit and fp32 gradient partitions,
    fp32 master and Adam states), read at our optimizer-step phase. CPU with offload: DeepSpeed
    multiplies by additional_buffer_factor=1.5 (a safety factor we do not apply) and takes
    max(4 * N, 16) bytes per parameter; with N = 4 that is our 16 bytes per parameter per node.
    """
    stage_1_and_2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    psi = 8_030_261_248
    table = _deepspeed_table(capsys, stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold,
                             total_params=psi, num_gpus_per_node=4, num_nodes=1)
    plain = run("meta-llama/Llama-3.1-8B", "4xH100-80", sharding="zero2")
    step_states = sum(r.bytes for r in plain.ledger if r.location == Location.GPU and Phase.STEP in r.phases
                      and (r.term in STATE_TERMS or "fp32 gradient partition" in r.label))
    assert step_states / GIB == pytest.approx(table["offload_optimizer=none"][1], abs=0.006)
    off = run("meta-llama/Llama-3.1-8B", "4xH100-80", sharding="zero2", offload="optimizer", host_memory_gb=1000)
    assert gpu_state_rows(off) / GIB == pytest.approx(table["offload_optimizer=cpu"][1], abs=0.006)
    assert 1.5 * host_bytes(off) / GIB == pytest.approx(table["offload_optimizer=cpu"][0], abs=0.006)


def test_deepspeed_zero3_estimator(capsys):
    """estimate_zero3_model_states_mem_needs_all_cold, 1 node x 4 GPUs, Llama-3.1-8B.

    Differences, each checked: (1) DeepSpeed adds 4 bytes x the largest layer (its 16-bit
    parameters and gradients, here the 525M-parameter embedding); we model gathered parameters
    separately (gathered_parameters rows), so we compare the partitioned states without that
    term. (2) Without offload DeepSpeed counts 18 Psi / N; we count the persistent 16 Psi / N
    (16-bit weights and gradients, fp32 master, Adam states) plus, during the step, the fp32
    gradient of one sub-group (sub_group_size = 1e9 elements). (3) CPU: DeepSpeed's factor 1.5.
    """
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    m = resolve_model("meta-llama/Llama-3.1-8B")
    psi, n = params.total_parameters(m), 4
    largest = max(params.layer_parameters(m), m.vocab_size * m.hidden_size)
    table = _deepspeed_table(capsys, stage3.estimate_zero3_model_states_mem_needs_all_cold,
                             total_params=psi, largest_layer_params=largest, num_gpus_per_node=n, num_nodes=1)
    largest_gib = 4 * largest / GIB

    both = run("meta-llama/Llama-3.1-8B", "4xH100-80", sharding="zero3", offload="optimizer+params", host_memory_gb=1000)
    ds_cpu, ds_gpu = table["offload_param=cpu, offload_optimizer=cpu, zero_init=1"]
    assert ds_gpu == pytest.approx(largest_gib, abs=0.006)
    assert gpu_state_rows(both) == 0
    assert 1.5 * host_bytes(both) / GIB == pytest.approx(ds_cpu, abs=0.006)

    opt = run("meta-llama/Llama-3.1-8B", "4xH100-80", sharding="zero3", offload="optimizer", host_memory_gb=1000)
    ds_cpu, ds_gpu = table["offload_param=none, offload_optimizer=cpu, zero_init=1"]
    assert gpu_state_rows(opt) / GIB == pytest.approx(ds_gpu - largest_gib, abs=0.006)
    assert 1.5 * host_bytes(opt) / GIB == pytest.approx(ds_cpu, abs=0.006)

    plain = run("meta-llama/Llama-3.1-8B", "4xH100-80", sharding="zero3")
    _, ds_gpu = table["offload_param=none, offload_optimizer=none, zero_init=1"]
    ours = gpu_state_rows(plain) + 4 * min(-(-psi // n), ZERO_SUB_GROUP_SIZE)
    expected_difference = 16 * psi / n + 4 * min(psi / n, ZERO_SUB_GROUP_SIZE) - 18 * psi / n
    assert (ours - (ds_gpu - largest_gib) * GIB) / GIB == pytest.approx(expected_difference / GIB, abs=0.006)


@pytest.mark.parametrize("s, b", [(1024, 1), (1024, 8), (512, 4), (128, 32)])
def test_korthikanti_gpt_block(s, b):
    """s*b*h*(34 + 5*a*s/h) bytes per layer: GPT-2 block, eager attention, dropout, 16-bit, and a
    GELU that saves only its input (Megatron's; transformers' "gelu", F.gelu)."""
    m = resolve_model("openai-community/gpt2-xl").model_copy(update={"activation": "gelu"})
    dt = activations.DTypes(compute=2, residual=2)
    saved = activations.total(activations.layer_saved(m, dt, False, s)) * s * b
    # the paper omits LayerNorm's per-row statistics: an fp32 mean and rstd per token per norm, two norms
    stats = 2 * 2 * 4 * s * b
    assert saved - stats == activations.korthikanti_layer_bytes(s, b, m.hidden_size, m.num_heads)
    # full recomputation keeps 2*s*b*h per layer (Korthikanti et al., Sec. 5)
    assert activations.layer_input_bytes(m, dt) * s * b == 2 * s * b * m.hidden_size


def test_korthikanti_through_the_ledger():
    r = run("openai-community/gpt2", "1xA100-40", precision="bf16-pure", attention="eager",
            seq_len=1024, micro_batch_size=4)
    saved = next(row for row in r.ledger if row.label.startswith("saved activations"))
    # GPT-2's gelu_new is Python ops that also save tanh(.), 0.5x and 1 + tanh(.): 3 * 2 B * 4h per token
    # and LayerNorm's fp32 mean and rstd per token, two norms, which the paper omits
    assert saved.bytes == 12 * (activations.korthikanti_layer_bytes(1024, 4, 768, 12) + 3 * 2 * 4 * 768 * 1024 * 4
                                + 2 * 2 * 4 * 1024 * 4)
    full = run("openai-community/gpt2", "1xA100-40", precision="bf16-pure", attention="eager",
               seq_len=1024, micro_batch_size=4, checkpointing="full")
    saved = next(row for row in full.ledger if row.label.startswith("saved activations"))
    assert saved.bytes == 12 * 2 * 1024 * 4 * 768


@pytest.mark.parametrize("optimizer, fits", [("adamw", False), ("adamw-8bit", False),
                                             ("paged-adamw", True), ("paged-adamw-8bit", True)])
def test_seed_article_paged_optimizers_llama_8b_a100_40(optimizer, fits):
    """Seed article (AdamW 8-bit vs paged AdamW, Llama 3.1 8B on a 40 GB A100): bf16 weights,
    seq 512, micro-batch 1, gradient checkpointing: only the paged optimizers ran."""
    r = run("meta-llama/Llama-3.1-8B", "1xA100-40", optimizer=optimizer, precision="bf16-pure",
            checkpointing="full", seq_len=512, micro_batch_size=1)
    assert r.fits is fits
    if fits:
        assert r.paged.spilled_bytes > 0  # the state spills to host RAM
        assert r.memory["peak"] - r.paged.resident_bytes <= r.usable_bytes


def test_adamw_8bit_state_is_about_2_bytes_per_parameter():
    """DESIGN: ~2 bytes per parameter (block-wise, fp32 absmax per 256), 32-bit under 4096."""
    r = run("meta-llama/Llama-3.1-8B", "1xH100-80", optimizer="adamw-8bit", precision="bf16-pure")
    states = r.memory["optimizer_states"]
    assert states / r.model.num_parameters == pytest.approx(2 * (1 + 4 / 256), rel=1e-4)
