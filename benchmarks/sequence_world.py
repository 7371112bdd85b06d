"""planner against published sequence-parallel runs (Ulysses: ALST and its ablation with the tiled
MLP and checkpoint offload, the Hugging Face blog, ms-swift; ring attention: torchtitan's FSDP x CP
table, TRL's 1M-token example with checkpoint offload, accelerate's offload PR): the longest
sequence that fits, the peak and the step time, beside the published figure. Prints a markdown
table; the provenance of each row is in ``CASES`` (source, quote, configuration, caveat). A
published "longest" is the length a run reached, a lower bound of its limit.
Run: python benchmarks/sequence_world.py"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from planner.catalog.gpus import parse_gpus  # noqa: E402
from planner.catalog.models import resolve_model  # noqa: E402
from planner.engine.estimate import estimate_config  # noqa: E402
from planner.strategies import TrainingConfig  # noqa: E402

ALST = ("https://arxiv.org/abs/2506.13996 (v1) Table 1, configs in snowflakedb/ArcticTraining "
        "projects/sequence-parallelism; ZeRO-3, optimizer states on the CPU (DeepSpeed CPU Adam), activation "
        "checkpointing, flash_attention_2, bf16, micro-batch 1, no TiledMLP, no checkpoint offload")
ALST_FILES = ("snowflakedb/ArcticTraining projects/sequence-parallelism @b28638e6 (the ablation's configurations): "
              "Llama-3.1-8B-Instruct, 8 x H100, sequence_parallel_size 8, ZeRO-3 with the optimizer on the CPU "
              "(cpu_adam), micro-batch 1, the 'liger' model type (Liger's RMSNorm, SwiGLU and RoPE kernels too, which "
              "hold less than the transformers modules planner counts; planner: its chunked loss); the length each "
              "configuration ran, not a bisected limit; checkpoint offload: ArcticTraining's own (planner: the "
              "Trainer's save_on_cpu, the same inputs); ")
BLOG = ("https://huggingface.co/blog/ulysses-sp (2026-03-09, huggingface/blog ulysses-sp.md @5feb9948): "
        "Qwen3-4B, TRL SFTTrainer, ZeRO-3, CPU optimizer offload, gradient checkpointing, flash-attn2, SP=4 DP=1, "
        "GAS 8; loss not stated (TRL's chunked loss came later: the plain loss), memory reading not stated")

SWIFT = ("ms-swift's own Ulysses (before its 2025-09 ring merge; 4 key/value heads = SP 4: pure Ulysses), "
         "Qwen2.5-7B full fine-tuning, 4 x A100 (memory size not stated), ZeRO-3 (no offload), flash_attn, "
         "packing to --max_length, micro-batch 1, GAS 8, bf16, gradient checkpointing (swift's default), "
         "AdamW (swift's default); the header's 'GPU Memory' reading is not defined (nvidia-smi or torch, "
         "peak or not: not stated)")

#: (name, model, gpus, fields, published, what, source)
CASES = [
    ("alst-llama8b-sp8-liger-max", "meta-llama/Llama-3.1-8B", "8xH100-80",
     {"loss": "chunked", "sequence_parallel": "ulysses", "sp_size": 8}, 1_100_000, "longest", ALST
     + "; Liger (fused linear cross-entropy): '1.1M ... 9:24 ... 576.1' TFLOPS"),
] + [(f"alst-llama8b-sp8-liger-{name}-max", "meta-llama/Llama-3.1-8B", "8xH100-80",
      {"loss": "chunked", "sequence_parallel": "ulysses", "sp_size": 8} | fields, tokens, "longest", ALST_FILES
      + f"{file}: '{quote}'") for name, fields, tokens, file, quote in (
    ("tiled", {"tiled_mlp": "tiled"}, 1_200_000, "run-h100-sp8-llama-8b-yes-mlp.yml",
     "tiled_mlp_compute: true ... attn_implementation: sdpa ... max_length: 1_200_000 # ok"),
    ("ckpt-offload", {"checkpoint_offload": "host"}, 2_400_000, "run-h100-sp8-llama-8b-yes-act-offload.yml",
     "activation_checkpoint_cpu_offload: true ... max_length: 2_400_000"),
    ("tiled-ckpt-offload", {"tiled_mlp": "tiled", "checkpoint_offload": "host"}, 3_800_000,
     "run-h100-sp8-llama-8b.yml", "activation_checkpoint_cpu_offload: true / tiled_mlp_compute: true ... "
     "max_length: 3800000"))
] + [
    ("alst-llama8b-dp8-liger-max", "meta-llama/Llama-3.1-8B", "8xH100-80",
     {"loss": "chunked"}, 160_000, "longest", ALST + "; Liger, no sequence parallelism: '160K ... 2:03'"),
    ("alst-llama8b-dp8-max", "meta-llama/Llama-3.1-8B", "8xH100-80",
     {"loss": "standard"}, 32_000, "longest", ALST + "; no Liger, no sequence parallelism: '32K ... 17'"),
] + [(f"hf-blog-qwen3-4b-sp4-{k}k-peak", "Qwen/Qwen3-4B", "4xH100-80",
      {"loss": "standard", "sequence_parallel": "ulysses", "sp_size": 4, "seq_len": k * 1024, "grad_accum": 8},
      gb, "peak GB", BLOG) for k, gb in ((8, 23.4), (32, 35.0), (64, 50.5), (96, 66.0))] + [
    ("hf-blog-qwen3-4b-1gpu-8k-peak", "Qwen/Qwen3-4B", "1xH100-80",
     {"loss": "standard", "seq_len": 8192, "grad_accum": 8}, 76.4, "peak GB", BLOG + "; the 1-GPU baseline, no SP"),
] + [(f"ms-swift-qwen2.5-7b-sp4-{k}k-peak", "Qwen/Qwen2.5-7B", "4xA100-80",
      {"loss": "standard", "offload": "none", "sequence_parallel": "ulysses", "sp_size": 4, "seq_len": k * 1024,
       "grad_accum": 8}, gib, "peak GiB", f"{url}: '{quote}'; " + SWIFT) for k, gib, url, quote in (
    (64, 53, "https://github.com/modelscope/ms-swift/blob/11a345d41810e66108ba5a30b0e7a7e6df14d35f/examples/train/"
     "sequence_parallel/ulysses/sequence_parallel.sh", "# Env: 4 * A100 / # Max Length: 65536 / # GPU Memory: "
     "4 * 53GiB, Training Speed 50s/it"),
    (16, 43, "https://github.com/modelscope/ms-swift/blob/e3f270866a5bf5e4ee47a1cfbf310c671f05388e/examples/train/"
     "long_text/sequence_parallel.sh", "# Env: 4 * A100 / # Max Length: 16K / # GPU Memory: 4 * 43GiB, "
     "Training Speed 12s/it"))]

TRL_1M = ("TRL's long-context example (huggingface/trl PR #6845 table, #6846; examples/sft_qwen3_8b_1m_context): "
          "SFTTrainer, one PG-19 sequence of ~1M tokens a step, 8 x H100 80GB, accelerate parallelism_config_cp_size 8 "
          "(ring attention, allgather default), FSDP2, bf16, micro-batch 1, TRL's chunked_nll loss (planner: chunked), "
          "transformers checkpointing with offload (gradient_checkpointing_kwargs offload; planner: FSDP's own, "
          "non-reentrant: the same GPU rows, 4 % more host RAM for the rotary copies; the script at HEAD sets "
          "accelerate's fsdp_activation_checkpointing_offload, which is that), the model loaded in bf16 "
          "(model_init_kwargs dtype: bf16 weights and AdamW states, planner's bf16-pure), the Trainer's default "
          "AdamW, YaRN; 'peak GPU memory' in GB, its reading not stated")
ACC_4175 = ("accelerate PR #4175 (activation_checkpointing_offload): 'at 1,048,576 tokens with cp_size=8, Qwen3-0.6B "
            "goes from 27.9 GB to 20.8 GB (-25%) for +0.6% step time'; the same recipe as TRL's 1M example "
            "(FSDP2 full checkpointing, ring attention over 8 H100s), reading not stated")
#: the model loaded in bf16 (model_init_kwargs dtype) under FSDP2's bf16 policy: bf16 weights and AdamW states
RING = {"sharding": "fsdp", "offload": "none", "loss": "chunked", "sequence_parallel": "ring", "sp_size": 8,
        "precision": "bf16-pure"}

CASES += [
    ("trl-qwen3-8b-1m-cp8-offload-peak", "Qwen/Qwen3-8B", "8xH100-80",
     RING | {"seq_len": 1_048_576, "checkpoint_offload": "host"}, 56.2, "peak GB", TRL_1M + ": '| Qwen3-8B | 1M | "
     "364 s | 56.2 GB |'; 380 s/step after the cuDNN fallback fix (#6846)"),
    ("trl-qwen3-0.6b-4m-cp8-offload-peak", "Qwen/Qwen3-0.6B", "8xH100-80",
     RING | {"seq_len": 4_194_304, "checkpoint_offload": "host"}, 73.7, "peak GB", TRL_1M + ": '| Qwen3-0.6B | 4M | "
     "2135 s | 73.7 GB |'"),
    ("acc-qwen3-0.6b-1m-cp8-peak", "Qwen/Qwen3-0.6B", "8xH100-80", RING | {"seq_len": 1_048_576}, 27.9, "peak GB",
     ACC_4175 + ": without offload"),
    ("acc-qwen3-0.6b-1m-cp8-offload-peak", "Qwen/Qwen3-0.6B", "8xH100-80",
     RING | {"seq_len": 1_048_576, "checkpoint_offload": "host"}, 20.8, "peak GB", ACC_4175 + ": with offload"),
]

TITAN = ("torchtitan docs/performance.md @bf835b59 Table 2: 'FSDP + CP + torch.compile + Float8. Llama 3.1 8B "
         "model. 8 GPUs. Local batch size 1. Full activation checkpointing.' H100 96 GB HBM2e (500 W), torchtitan "
         "9dec370, torch 1963fc8 (2024-12); Memory(GiB) its max_reserved_gib; AdamW, torchtitan's own cross-entropy "
         "over the whole logits (planner: standard), bf16 compute over fp32 parameters; planner's rows for the "
         "80 GB card (the peak does not depend on the capacity); torch.compile's fusions are not modelled")
CASES += [(f"torchtitan-llama8b-fsdp{8 // p}-cp{p}-{seq // 1024}k-peak", "meta-llama/Llama-3.1-8B", "8xH100-80",
           {"sharding": "fsdp", "offload": "none", "loss": "standard", "precision": "fp8-mixed", "seq_len": seq}
           | ({"sequence_parallel": "ring", "sp_size": p} if p > 1 else {}), gib, "peak GiB",
           f"{TITAN}: '| FSDP {8 // p}, CP {p} | {seq} | ... | {gib} |'")
          for p, seq, gib in ((1, 32768, 83.9), (2, 65536, 84.2), (4, 131072, 84.0), (8, 262144, 84.5))]

BASE = {"sharding": "zero3", "offload": "optimizer", "checkpointing": "full", "precision": "bf16-mixed",
        "attention": "sdpa", "micro_batch_size": 1}


def plan(model: str, gpus: str, fields: dict):
    return estimate_config(resolve_model(model), parse_gpus(gpus), TrainingConfig(**(BASE | fields)))


def longest(model: str, gpus: str, fields: dict, step: int = 8192, ceiling: int = 4_194_304) -> int:
    """The longest multiple of ``step`` tokens whose plan fits (bisection: memory grows with it)."""
    lo, hi = 0, ceiling // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan(model, gpus, fields | {"seq_len": mid * step}).fits:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def main() -> None:
    print("| case | published | planner (device) | error | planner's step at it | planner allocated / reserved |")
    print("|---|---|---|---|---|---|")
    for name, model, gpus, fields, published, what, _ in CASES:
        if what == "longest":
            got = longest(model, gpus, fields)
            at = plan(model, gpus, fields | {"seq_len": got}) if got else None
            step = f"{at.time.step_seconds:,.0f} s, {at.time.tokens_per_second:,.0f} tok/s" if at else ""
            print(f"| {name} | {published:,} tokens | {got:,} tokens | {got / published - 1:+.1%} | {step} | |")
        else:
            p = plan(model, gpus, fields)
            unit, scale = ("GiB", 2**30) if what == "peak GiB" else ("GB", 1e9)
            got = p.memory["peak"] / scale
            print(f"| {name} | {published} {unit} | {got:.1f} {unit} | {got / published - 1:+.1%} | "
                  f"{p.time.step_seconds:,.1f} s, {p.time.tokens_per_second:,.0f} tok/s |"
                  f" {p.allocated_peak_bytes / scale:.1f} / {p.reserved_peak_bytes / scale:.1f} {unit} |")


if __name__ == "__main__":
    main()
