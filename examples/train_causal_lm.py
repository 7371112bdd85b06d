"""Train a causal LM for a few steps the way a planner plan says, under `accelerate launch`.

    TRAIN_SCRIPT=examples/train_causal_lm.py OUT/launch.sh --plan OUT/plan.json --steps 5
    accelerate launch --config_file OUT/accelerate_config.yaml examples/train_causal_lm.py --plan OUT/plan.json

Random weights built from the model's config (no download) and synthetic tokens. The emitted
accelerate config decides distribution (DDP, FSDP2, DeepSpeed) and mixed precision; this script
applies the rest of the plan as the emitted files describe it:
- bf16-pure: the model is built in bfloat16;
- attention: ``attn_implementation`` (sdpa or eager);
- checkpointing: full = HF gradient checkpointing, non-reentrant (under FSDP, FSDP's own,
  switched on by the config); selective = torch selective checkpointing of each decoder layer
  that saves matmul and attention outputs and recomputes the rest;
- optimizer: torch AdamW / SGD, bitsandbytes 8-bit, paged and Lion, Adam-mini (adam-mini
  package), transformers Adafactor; DeepSpeed's own optimizer where its JSON names one;
- micro-batch and gradient accumulation; gradient clipping at 1.0.
A chunked loss needs liger-kernel (CUDA); without it the standard loss runs and the script says so.

CPU-only runs (CI, no GPU): accelerate hands FSDP and DeepSpeed only to accelerators. Launched
with ACCELERATE_USE_CPU=1 it runs DDP / FSDP processes over gloo, and this script then gives
accelerate the FSDP plugin the launcher built from the emitted YAML (its FSDP_* variables), so
accelerate's own FSDP2 preparation runs. DeepSpeed runs without ACCELERATE_USE_CPU (DeepSpeed
brings up gloo itself); the script then tells accelerate the real process count. Nothing of
this happens when CUDA is available.
"""

import argparse
import json
import os
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, DummyOptim


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--plan", required=True, type=Path, help="plan.json written by planner")
    p.add_argument("--rank", type=int, default=1, help="which plan of a suggest result (1 = best)")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to run")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load_plan(path: Path, rank: int) -> dict:
    data = json.loads(path.read_text())
    return data["plans"][rank - 1] if "plans" in data else data


def model_config(model_id: str) -> dict:
    """The architecture: a config.json path or folder, or a planner catalog id."""
    from planner.catalog.models import catalog

    path = Path(model_id)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    entry = catalog().get(model_id)
    if entry is None:
        raise SystemExit(f"no config for {model_id}: pass a plan made for a catalog model or a config.json")
    return dict(entry.config)


def cpu_shims(acc: Accelerator) -> None:
    """Only without CUDA: see the module docstring."""
    if torch.cuda.is_available():
        return
    if os.environ.get("ACCELERATE_USE_FSDP", "false") == "true" and acc.distributed_type == DistributedType.MULTI_CPU:
        AcceleratorState._shared_state["fsdp_plugin"] = FullyShardedDataParallelPlugin()  # from the FSDP_* variables
        for shared in (PartialState._shared_state, AcceleratorState._shared_state):
            shared["distributed_type"] = DistributedType.FSDP
    if acc.distributed_type == DistributedType.DEEPSPEED and dist.is_initialized() and acc.num_processes != dist.get_world_size():
        for shared in (PartialState._shared_state, AcceleratorState._shared_state):
            shared.update(num_processes=dist.get_world_size(), process_index=dist.get_rank(),
                          local_process_index=int(os.environ.get("LOCAL_RANK", 0)))


def selective_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint each decoder layer, saving matmul and attention outputs (torchtitan's op-level
    selective activation checkpointing), recomputing norms, activations and RoPE."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention"):
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    layers = model.model.layers if hasattr(model, "model") else model.transformer.h
    for layer in layers:
        forward = layer.forward
        layer.forward = partial(checkpoint, forward, use_reentrant=False,
                                context_fn=partial(create_selective_checkpoint_contexts, policy))


def build_optimizer(name: str, model: torch.nn.Module, lr: float, cfg) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, fused=torch.cuda.is_available())
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, relative_step=False, scale_parameter=False)
    if name == "adam-mini":
        from adam_mini import Adam_mini

        return Adam_mini(named_parameters=model.named_parameters(), lr=lr, dim=cfg.hidden_size,
                         n_heads=cfg.num_attention_heads, n_kv_heads=getattr(cfg, "num_key_value_heads", None))
    import bitsandbytes as bnb  # the 8-bit, paged and Lion optimizers need CUDA

    return {
        "adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw": bnb.optim.PagedAdamW32bit,
        "paged-adamw-8bit": bnb.optim.PagedAdamW8bit, "lion": bnb.optim.Lion32bit, "lion-8bit": bnb.optim.Lion8bit,
    }[name](params, lr=lr)


def main() -> None:
    args = parse_args()
    plan = load_plan(args.plan, args.rank)
    c = plan["config"]
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") == "true"
    acc = Accelerator(**({} if deepspeed else {"gradient_accumulation_steps": c["grad_accum"]}))
    cpu_shims(acc)
    torch.manual_seed(args.seed)

    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**model_config(plan["model"]["id"]))
    config.use_cache = False
    dtype = torch.bfloat16 if c["precision"] == "bf16-pure" else torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=c["attention"])
    fsdp = acc.distributed_type == DistributedType.FSDP
    if c["checkpointing"] == "full" and not fsdp:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif c["checkpointing"] == "selective":
        selective_checkpointing(model)
    if c["loss"] == "chunked":
        try:
            from liger_kernel.transformers import _apply_liger_kernel_to_instance

            _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, cross_entropy=False)
        except Exception as e:  # no CUDA / no Triton / not installed
            acc.print(f"chunked loss unavailable here ({type(e).__name__}); running the standard loss")

    ds_config = acc.state.deepspeed_plugin.deepspeed_config if deepspeed else {}
    if "optimizer" in ds_config:  # DeepSpeed builds it; fill the JSON's "auto" values (the Trainer does the same)
        optimizer = DummyOptim(model.parameters(), lr=args.lr, weight_decay=0.0)
    else:
        optimizer = build_optimizer(c["optimizer"], model, args.lr, config)

    per_step = c["micro_batch_size"] * c["grad_accum"] * acc.num_processes
    g = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, config.vocab_size, (per_step * args.steps, c["seq_len"]), generator=g)
    loader = torch.utils.data.DataLoader(tokens, batch_size=c["micro_batch_size"])
    model, optimizer, loader = acc.prepare(model, optimizer, loader)

    model.train()
    steps, losses = 0, []
    for batch in loader:
        with acc.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            acc.backward(loss)
            if acc.sync_gradients and not deepspeed:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        if acc.sync_gradients:
            steps += 1
            losses.append(loss.item())
            acc.print(f"step {steps}: loss {losses[-1]:.4f}")
        if steps >= args.steps:
            break
    print(f"planner-example: rank {acc.process_index}/{acc.num_processes} {acc.distributed_type} "
          f"{type(model).__name__} {c['optimizer']} {c['precision']} ckpt={c['checkpointing']}: {steps} steps, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    acc.end_training()


if __name__ == "__main__":
    main()
