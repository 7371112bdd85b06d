"""Host RAM while a quantized base loads (planner/cost/adapters.py ``quantized_load_host_bytes``):
transformers reads the checkpoint a shard at a time and quantizes each weight as it moves to the
GPU, so a QLoRA load holds one 16-bit shard per process, not the 16-bit model (131 GiB for a 70B).

Published figures (the judge):

| source | quote | hardware | config | caveat |
|---|---|---|---|---|
| PEFT docs, accelerate/fsdp.md, "finetuning 70B llama model on 2X24GB GPUs" | "the memory consumed per GPU is 19.6 GB while CPU RAM usage is around 107 GB" | 2 x 24 GB GPUs, host RAM not stated | meta-llama/Llama-2-70b-hf, FSDP FULL_SHARD + fsdp_offload_params, cpu_ram_efficient_loading, bnb_4bit_quant_storage bf16, nested quant, LoRA r 8 all-linear, 2 x 2048 | how "CPU RAM usage" was read is not said; planner reads ~80 GB (-25 %): tests/test_recipe_corpus.py holds the comparison |
| AnswerDotAI/fsdp_qlora README | "This requires roughly 55GB of CPU RAM for model loading and FSDP CPU offloading" | 2 x 24 GB | Llama-2-70b-hf, --train_type qlora --use_cpu_offload true, batch 2, 2048 | their own layer-wise loader, not from_pretrained: a lower bound for the Trainer's path |
"""

from planner.engine.suggest import suggest
from planner.schema.estimate import EstimateRequest
from planner.schema.suggest import SuggestRequest

LLAMA2_70B = "meta-llama/Llama-2-70b-hf"
GB = 10**9


def _host(gpus: str, **config) -> dict[str, int]:
    from planner.engine.estimate import estimate

    shape = dict(adapter="qlora", lora_rank=8, precision="bf16-mixed", checkpointing="full", micro_batch_size=2,
                 seq_len=2048)
    return estimate(EstimateRequest(model=LLAMA2_70B, gpus=gpus, **(shape | config))).host_memory


def test_one_gpu_qlora_loads_a_shard_not_the_model():
    """One process, no FSDP: the load holds one 10 GB shard of the 138 GB 16-bit checkpoint."""
    from planner.cost.adapters import CHECKPOINT_SHARD_BYTES

    h = _host("1xA100-80", sharding="none", offload="none")
    assert h["model_loading"] == CHECKPOINT_SHARD_BYTES
    assert h["peak"] < 20 * GB


def test_70b_qlora_fits_on_one_a100_80_with_96_gb_of_host_ram():
    """The issue's case: 70B QLoRA on 1xA100-80 with 96 GB of host RAM read NOTHING FITS while the
    16-bit model was assumed in host RAM; with the shard-by-shard load it fits, and the winner's
    host peak is within the usable 90 % of 96 GB."""
    result = suggest(SuggestRequest(model=LLAMA2_70B, gpus="1xA100-80", adapter=["qlora"], host_memory_gb=96, top=1))
    assert result.fits
    plan = result.plans[0]
    assert plan.host_memory["peak"] <= plan.host_usable_bytes == int(96 * GB * 0.9)


def test_70b_fsdp_qlora_on_two_4090s_with_128_gb():
    """PEFT's guide ran this shape; with 128 GB of host RAM planner finds a plan (it read NOTHING
    FITS with the 16-bit model in host RAM at load)."""
    result = suggest(SuggestRequest(model=LLAMA2_70B, gpus="2xRTX4090-24", adapter=["qlora"], host_memory_gb=128, top=1))
    assert result.fits
