"""GRPO plans against the published world: veRL's table of minimum GPU counts for GRPO, and TRL's
recommendation for ``vllm_gpu_memory_utilization``. Prints, per row, planner's answer for the same
model, GPUs and lengths as TRL's GRPOTrainer would run them.

Sources (collected 2026-11-28; quotes in the closing note of issue 37):
- veRL ``docs/perf/device_tuning.rst`` ("Hardware Resource Needed for RL", last updated
  2025-06-25; volcengine/verl @ b178a3cd): "determining how much resources are needed to
  successfully run it before training is a relatively difficult task"; "min" rows run "after
  applying all memory optimization techniques (e.g., offload, gradient checkpointing)": FSDP with
  actor parameter and optimizer offload, reference parameter offload, vLLM 0.8.3 rollout with the
  stated tensor parallelism and gpu_memory_utilization. LoRA rows: rank 32, prompt 512, response
  1024. H800 rows are read as H100-SXM-80 (the same 80 GB; planner has no H800 entry).
- TRL ``docs/source/grpo_trainer.md`` (PR #3554) links a Space whose script recommends
  ``gpu_memory_utilization = ceil_0.05(1.2 x (weights / tp + kv_per_token x
  per_device_train_batch_size x (max_prompt + max_completion)) / 79 GiB)``, with weights =
  parameters x 2 B and kv_per_token = 2 x layers x kv_heads x head_dim x 2 B ("this generous
  estimate works much better than actual prediction!").

The two are not the same program as planner's: veRL offloads what TRL keeps on the GPU and runs
its rollout with vLLM tensor parallelism, which planner does not plan yet. A row where veRL runs
and planner finds no TRL plan is a difference of programs, stated as such.

    .venv/bin/python benchmarks/grpo_world.py
"""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from planner.catalog.models import resolve_model  # noqa: E402
from planner.cost import params, rollout  # noqa: E402
from planner.engine.suggest import suggest  # noqa: E402
from planner.schema.suggest import SuggestRequest  # noqa: E402

#: veRL's rows planner's catalog can state: (model, GPUs, LoRA, prompt, response, veRL's rollout TP
#: and gpu_memory_utilization).
VERL = [
    ("Qwen/Qwen2.5-0.5B", "1xH100-80", True, 512, 1024, 1, 0.1),
    ("Qwen/Qwen2.5-1.5B", "1xH100-80", True, 512, 1024, 1, 0.1),
    ("Qwen/Qwen2.5-3B", "1xH100-80", True, 512, 1024, 1, 0.1),
    ("Qwen/Qwen2.5-7B", "1xH100-80", True, 512, 1024, 1, 0.2),
    ("Qwen/Qwen2.5-7B", "2xH100-80", False, 1024, 1024, 2, 0.6),  # Qwen2-7B-Instruct on 2xH800
    ("Qwen/Qwen2.5-14B", "2xH100-80", True, 512, 1024, 2, 0.25),
    ("Qwen/Qwen2.5-14B", "4xH100-80", False, 512, 1024, 4, 0.5),  # Qwen2.5-Coder-14B on 4xH800
    ("Qwen/Qwen2.5-32B", "4xH100-80", True, 512, 1024, 4, 0.3),
    ("Qwen/Qwen2.5-72B", "8xH100-80", True, 512, 1024, 8, 0.4),
]

#: TRL's recommendation cases: (model, per_device_train_batch_size, prompt, completion).
TRL_CASES = [("Qwen/Qwen2.5-1.5B", 8, 512, 1024), ("Qwen/Qwen2.5-7B", 8, 512, 1024), ("Qwen/Qwen2.5-7B", 16, 512, 2048),
             ("meta-llama/Llama-3.1-8B", 4, 512, 1024)]


def trl_recommendation(model: str, per_device: int, prompt: int, completion: int, gpu_gib: float = 79) -> float:
    """TRL's Space script's gpu_memory_utilization (the module docstring)."""
    m = resolve_model(model)
    weights = params.total_parameters(m) * 2
    kv = rollout.kv_bytes_per_token(m, 2) * per_device * (prompt + completion)
    return math.ceil(round(1.2 * (weights + kv) / (gpu_gib * 2**30) / 0.05, 9)) * 0.05


def main() -> None:
    print("veRL's minimum GPUs for GRPO against planner's TRL plan on the same GPUs")
    print(f"{'model':20} {'GPUs':10} {'kind':5} {'veRL TP/util':12} planner (TRL GRPOTrainer)")
    for model, gpus, lora, prompt, response, tp, util in VERL:
        request = SuggestRequest(model=model, gpus=gpus, method=["grpo"], seq_len=prompt + response,
                                 completion_len=response, adapter=["lora"] if lora else ["none"],
                                 lora_rank=32 if lora else None, top=1)
        result = suggest(request)
        if result.plans:
            p = result.plans[0]
            said = (f"fits {p.memory['peak'] / 2**30:.1f} GiB, {p.config.generation}"
                    f"{f' {p.config.vllm_share:.2f}' if p.config.vllm_share else ''}, {p.config.sharding}, "
                    f"{p.time.tokens_per_second:,.0f} tok/s")
        else:
            short = result.nearest[0].memory["peak"] / 2**30 if result.nearest else float("nan")
            said = f"nothing fits (nearest {short:.1f} GiB)"
        kind = "lora" if lora else "full"
        print(f"{model.split('/')[1]:20} {gpus:10} {kind:5} {f'{tp} / {util}':12} {said}")
    print()
    print("TRL's recommended vllm_gpu_memory_utilization against planner's share (1xH100-80, colocated)")
    for model, per_device, prompt, completion in TRL_CASES:
        trl = trl_recommendation(model, per_device, prompt, completion)
        request = SuggestRequest(model=model, gpus="1xH100-80", method=["grpo"], generation=["vllm-colocate"],
                                 seq_len=prompt + completion, completion_len=completion, micro_batch_size=[per_device],
                                 global_batch_size=per_device, num_generations=per_device, adapter=["lora"], top=1)
        result = suggest(request)
        share = f"{result.plans[0].config.vllm_share:.2f}" if result.plans else "no plan"
        print(f"{model.split('/')[1]:20} batch {per_device:3} rows {prompt + completion:5}: TRL {trl:.2f}, "
              f"planner {share}")


if __name__ == "__main__":
    main()
