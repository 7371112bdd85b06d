"""MoE experts under autocast over fp32 parameters: the library facts the planner's rule rests on
(strategies/precision.py ``moe_autocast_reason``), read off the installed torch and transformers,
and the rule itself: such plans are never offered, while the layouts that hand the experts 16-bit
parameters are."""

import pytest
import torch
from transformers.integrations.moe import _grouped_mm

from helpers import run

MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"


def _operands(device: str = "cpu"):
    tokens = torch.randn(8, 16, device=device)
    experts = torch.randn(2, 16, 32, device=device)  # (experts, in, out), fp32 like autocast's parameters
    offsets = torch.tensor([4, 8], dtype=torch.int32, device=device)
    return tokens, experts, offsets


def test_transformers_grouped_mm_experts_stay_fp32_under_autocast():
    """The experts' matmul ignores autocast (pytorch#174763) and follows the weights' dtype, while
    an nn.Linear in the same region runs in bf16: the precision a mixed plan would promise is lost."""
    tokens, experts, offsets = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _grouped_mm(tokens, experts, offsets).dtype == torch.float32
        assert torch.nn.functional.linear(tokens, experts[0].T).dtype == torch.bfloat16
        assert _grouped_mm(tokens.bfloat16(), experts.bfloat16(), offsets).dtype == torch.bfloat16


def test_torch_meta_grouped_mm_refuses_fp32_operands():
    """The traced probe's fake tensors run torch's meta kernel, which takes only bf16."""
    tokens, experts, offsets = _operands("meta")
    with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
        torch._grouped_mm(tokens, experts, offs=offsets)
    assert torch._grouped_mm(tokens.bfloat16(), experts.bfloat16(), offs=offsets).dtype == torch.bfloat16


@pytest.mark.parametrize("precision", ["bf16-mixed", "fp16-mixed", "fp8-mixed"])
@pytest.mark.parametrize("sharding", ["none", "ddp"])
def test_moe_under_autocast_over_fp32_parameters_is_never_offered(precision, sharding):
    gpus = "1xH100-80" if sharding == "none" else "8xH100-80"
    r = run(MIXTRAL, gpus, precision=precision, sharding=sharding)
    assert not r.feasible
    assert any("grouped_mm experts have no autocast" in reason for reason in r.reasons), r.reasons


@pytest.mark.parametrize("precision, sharding", [("bf16-mixed", "fsdp"), ("bf16-mixed", "zero3"),
                                                 ("bf16-mixed", "zero2"), ("bf16-pure", "ddp"), ("fp32", "ddp")])
def test_layouts_with_16_bit_or_fp32_experts_stay_offered(precision, sharding):
    """FSDP2's MixedPrecisionPolicy and DeepSpeed's bf16 hand the experts bf16 parameters;
    bf16-pure and fp32 leave nothing to autocast."""
    r = run(MIXTRAL, "8xH100-80", precision=precision, sharding=sharding)
    assert not any("grouped_mm" in reason for reason in r.reasons), r.reasons


def test_dense_models_under_autocast_stay_offered():
    r = run("meta-llama/Llama-3.1-8B", "8xH100-80", precision="bf16-mixed", sharding="ddp")
    assert r.feasible
