"""The step-time model against published end-to-end training measurements.

Source: MosaicML llm-foundry, scripts/train/benchmarking/README.md (measured on 8 GPUs, FSDP
FULL_SHARD, amp_bf16 / amp_fp8, FlashAttention). Their MPT-7B / MPT-13B have the width and depth
of Llama-2-7B / 13B and the same matmul FLOPs per token within 1% (4h GELU MLP vs a gated 2.7h
MLP), so the Llama-2 catalog entries stand in for them. The efficiency table's fractions were
fitted to these rows; planner plans the stack it launches (transformers' eager model code), which
reaches the table's ``stack`` factor of llm-foundry's fused layers (planner/catalog/data/efficiency.yaml,
measured on an H100 with planner's own launch path). So planner's figures are llm-foundry's times
that factor. Tolerance: 10% relative on MFU / tokens per second (the test keeps the fit true).
"""

import pytest

from planner.catalog.efficiency import stack_flops_scale
from planner.cost import compute

from helpers import run

ROWS = [
    # model, gpus, config, published MFU
    ("meta-llama/Llama-2-7b-hf", "8xH100-80", dict(micro_batch_size=6, grad_accum=1, seq_len=2048), 0.4644),
    ("meta-llama/Llama-2-7b-hf", "8xH100-80",
     dict(checkpointing="full", micro_batch_size=16, grad_accum=2, seq_len=4096), 0.4042),
    ("meta-llama/Llama-2-13b-hf", "8xH100-80", dict(micro_batch_size=2, grad_accum=1, seq_len=2048), 0.3979),
    ("meta-llama/Llama-2-13b-hf", "8xH100-80",
     dict(checkpointing="full", micro_batch_size=10, grad_accum=3, seq_len=4096), 0.4160),
    ("meta-llama/Llama-2-13b-hf", "8xA100-80", dict(micro_batch_size=2, grad_accum=3, seq_len=2048), 0.5957),
    ("meta-llama/Llama-2-13b-hf", "8xA100-80",
     dict(checkpointing="full", micro_batch_size=10, grad_accum=3, seq_len=4096), 0.5762),
]


@pytest.mark.parametrize("model, gpus, config, published", ROWS)
def test_mfu_matches_llm_foundry(model, gpus, config, published):
    r = run(model, gpus, sharding="fsdp", precision="bf16-mixed", **config)
    assert r.time.mfu == pytest.approx(published * stack_flops_scale(), rel=0.10)


def test_fp8_throughput_matches_llm_foundry():
    """H100 80GB FP8 table: 3B, seq 2048, micro-batch 10: 30,586 tokens/s/GPU."""
    r = run("meta-llama/Llama-3.2-3B", "8xH100-80", sharding="fsdp", precision="fp8-mixed",
            micro_batch_size=10, grad_accum=6, seq_len=2048)
    assert r.time.tokens_per_second_per_gpu == pytest.approx(30_586 * stack_flops_scale(), rel=0.10)


def test_model_flops_follow_the_6n_rule():
    """Without attention, model FLOPs per token are 6 x active parameters in matmuls (Kaplan et al.)."""
    r = run("meta-llama/Llama-3.1-8B", "1xH100-80", seq_len=1)
    from planner.catalog.models import resolve_model

    m = resolve_model("meta-llama/Llama-3.1-8B")
    embedding = m.vocab_size * m.hidden_size  # a lookup, not a matmul
    assert compute.model_flops_per_token(m, 1) == pytest.approx(6 * (r.model.num_parameters - embedding), rel=1e-4)
    mixtral = resolve_model("mistralai/Mixtral-8x7B-v0.1")
    assert compute.matmul_flops_per_token(mixtral) == pytest.approx(2 * (12.88e9 - 32000 * 4096), rel=0.01)
