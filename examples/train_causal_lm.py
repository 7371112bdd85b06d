"""Train a causal LM for a few steps the way a planner plan says, under `accelerate launch`.

    TRAIN_SCRIPT=examples/train_causal_lm.py OUT/launch.sh --plan OUT/plan.json --steps 5
    accelerate launch --config_file OUT/accelerate_config.yaml examples/train_causal_lm.py --plan OUT/plan.json

Random weights built from the model's config (no download) and synthetic tokens. The emitted
accelerate config decides distribution (DDP, FSDP2, DeepSpeed) and mixed precision; planner's
runtime (planner/runtime/) applies the rest of the plan, the same way the probes do:
- bf16-pure: the model is built in bfloat16; attention: ``attn_implementation`` (sdpa or eager);
- checkpointing: full = HF gradient checkpointing, non-reentrant (under FSDP, FSDP's own,
  switched on by the config); selective = torch selective checkpointing of each decoder layer
  that saves the ops of strategies/checkpointing.py SELECTIVE_SAVE_OPS and recomputes the rest;
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


def main() -> None:
    args = parse_args()
    plan = load_plan(args.plan, args.rank)
    c = plan["config"]
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false") == "true"
    acc = Accelerator(**({} if deepspeed else {"gradient_accumulation_steps": c["grad_accum"]}))
    cpu_shims(acc)
    torch.manual_seed(args.seed)

    from planner import runtime
    from planner.runtime.model import build_config, build_model
    from planner.runtime.optimizer import build as build_optimizer
    from strategies import TrainingConfig

    plan_config = TrainingConfig.model_validate(c)
    config = build_config(model_config(plan["model"]["id"]))
    model = build_model(config, plan_config)  # the plan's dtype and attention implementation
    for note in runtime.prepare(model, plan_config, runtime.Site.LAUNCH):  # checkpointing, chunked loss
        acc.print(note)

    ds_config = acc.state.deepspeed_plugin.deepspeed_config if deepspeed else {}
    if "optimizer" in ds_config:  # DeepSpeed builds it; fill the JSON's "auto" values (the Trainer does the same)
        optimizer = DummyOptim(model.parameters(), lr=args.lr, weight_decay=0.0)
    else:
        optimizer = build_optimizer(c["optimizer"], model, config, lr=args.lr, fused=torch.cuda.is_available())

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
