"""What a measured probe trains, built the way the emitted files make accelerate, the Trainer and
DeepSpeed build it (planner/emit/files.py writes those files):

- model: the transformers class from the architecture's config.json, random weights, built
  directly on the device (``with torch.device(...)``); bf16 weights for bf16-pure, fp32 otherwise;
- precision: autocast to bf16 (fp16 with a GradScaler) around forward for the mixed precisions,
  as accelerate does; FSDP2 casts parameters itself (``MixedPrecisionPolicy``); DeepSpeed runs
  its 16-bit module; fp8-mixed converts the linears to torchao ``Float8Linear`` with accelerate's
  own ``convert_model_to_fp8_ao`` (first and last linear kept in bf16, as accelerate does);
- checkpointing, attention, precision, FSDP2 wrapping, the optimizer: the runtime (planner/runtime/),
  as every user of a plan applies them;
- chunked loss: Liger-Kernel's fused linear cross-entropy when installed, else the PyTorch
  re-implementation of its allocations (probes/chunked_loss.py; same memory, not Liger's speed);
- ZeRO: ``deepspeed.initialize`` with the emitted DeepSpeed JSON, its ``"auto"`` values filled as
  the Trainer fills them;
- a step: ``grad_accum`` micro-batches (FSDP2 under ``gradient_sync`` step skips the gradient
  reduction on all but the last, as accelerate's ``no_sync`` does; micro-batch reduces every one,
  as ``sync_each_batch``), gradient clipping at 1.0 (the Trainer's
  ``max_grad_norm``), the optimizer step, gradients set to None.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from planner import runtime
from planner.probes import model_setup
from planner.runtime.model import build_config, build_model
from planner.runtime.optimizer import LEARNING_RATE
from planner.runtime.optimizer import build as build_optimizer
from planner.runtime.precision import autocast
from planner.runtime.sharding import apply_fsdp
from planner.strategies import TrainingConfig
from planner.strategies.sharding import auto_buckets


@dataclass
class Run:
    step: Callable[[Callable[[str], None]], None]  # one optimizer step; calls mark(phase) as each phase begins
    notes: list[str] = field(default_factory=list)


def build_run(req, device: torch.device) -> Run:
    """Model, optimizer and one training step for ``req`` (a probes.measured.MeasureRequest)."""
    c: TrainingConfig = req.config
    notes: list[str] = []
    if device.type == "cpu" and c.offload != "none":  # host offload needs an accelerator to offload from
        c = c.model_copy(update={"offload": "none"})
        notes.append("CPU run: offload has no device to offload from; run without it")
    cfg = build_config(req.config_json, req.layers)
    fsdp = c.sharding.startswith("fsdp")
    zero = c.sharding.startswith("zero")
    mesh = None
    if fsdp or zero:
        _fake_ranks(req.world_size)
        notes.append(f"{'FSDP2' if fsdp else 'DeepSpeed ZeRO'} under a fake process group of {req.world_size} "
                     "ranks: one rank's memory is measured; collectives return at once, so communication time "
                     "is modelled, not measured")
        if fsdp:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (req.world_size,))
    elif c.sharding == "ddp":
        notes.append("DDP measured as one process: its gradient buckets and all-reduce are modelled")
    # FSDP: built on the meta device, sharded, then materialised (one rank's shards only, as a
    # real FSDP2 job); ZeRO: on the host, DeepSpeed places it; otherwise on the device itself
    with torch.device("meta" if fsdp else "cpu" if zero else device):
        model = build_model(cfg, c)
    model.train()
    from planner.probes.chunked_loss import chunked_causal_lm_forward

    notes += runtime.prepare(model, c, runtime.Site.MEASURED, chunked_fallback=chunked_causal_lm_forward)
    model, wrapped = runtime.wrap(model, c, runtime.Site.MEASURED)
    notes += wrapped
    if fsdp:
        apply_fsdp(model, c, mesh)
        _materialize(model, torch.device("cpu") if c.offload != "none" else device)
    ids = torch.randint(0, cfg.vocab_size, (c.micro_batch_size, c.seq_len), device=device)
    if zero:
        return _deepspeed_run(req, model, ids, notes)
    optimizer = build_optimizer(c.optimizer, model, cfg, fsdp2=fsdp)  # (measured probes refuse FSDP1)
    forward_autocast = autocast(c, device.type)
    scaler = torch.amp.GradScaler(device.type) if c.precision == "fp16-mixed" and not fsdp else None
    params = [p for p in model.parameters() if p.requires_grad]

    def step(mark: Callable[[str], None]) -> None:
        for micro in range(c.grad_accum):
            if fsdp and c.grad_accum > 1 and c.gradient_sync == "step":
                model.set_requires_gradient_sync(micro == c.grad_accum - 1)
            mark("forward")
            with forward_autocast:
                loss = model(input_ids=ids, labels=ids).loss / c.grad_accum
            mark("backward")
            (scaler.scale(loss) if scaler else loss).backward()
            del loss
        mark("step")
        if scaler:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return Run(step, notes)


def _materialize(model, device: torch.device) -> None:
    """Storage on ``device`` for a model built on the meta device: parameters (this rank's shards)
    drawn from N(0, 0.02) — values do not change memory or speed — and the non-persistent buffers
    (rotary frequencies) computed again by a fresh instance of their module on the host."""
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).normal_(0.0, 0.02)
        for module in model.modules():
            own = dict(module.named_buffers(recurse=False))
            if own and hasattr(module, "config"):
                with torch.device("cpu"):
                    fresh = dict(type(module)(module.config).named_buffers(recurse=False))
                for name, buffer in own.items():
                    buffer.copy_(fresh[name])


def _fake_ranks(world: int) -> None:
    """The fake process group (probes/model_setup.py), and the environment DeepSpeed checks."""
    for key, value in (("LOCAL_RANK", "0"), ("RANK", "0"), ("WORLD_SIZE", str(world)),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    model_setup.fake_process_group(world)


def filled_deepspeed_config(ds: dict, c: TrainingConfig, world: int, hidden_size: int) -> dict:
    """The emitted DeepSpeed JSON with its ``"auto"`` values filled as the Trainer fills them
    (micro-batch, accumulation, global batch, clipping, learning rate, weight decay 0, the
    buckets from the hidden size: strategies.sharding ``auto_buckets``)."""
    known = {"train_micro_batch_size_per_gpu": c.micro_batch_size, "gradient_accumulation_steps": c.grad_accum,
             "train_batch_size": c.micro_batch_size * c.grad_accum * world, "gradient_clipping": 1.0,
             "lr": LEARNING_RATE, "weight_decay": 0.0} | auto_buckets(hidden_size)

    def fill(node, key=None):
        if isinstance(node, dict):
            return {k: fill(v, k) for k, v in node.items()}
        if node == "auto":
            if key not in known:
                raise ValueError(f"DeepSpeed config: no value known for \"auto\" at {key!r}")
            return known[key]
        return node

    out = fill(ds)
    out.update({k: known[k] for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                      "train_batch_size")})
    return out


def _deepspeed_run(req, model, ids, notes: list[str]) -> Run:
    if ids.device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    c = req.config
    if req.deepspeed_config is None:
        raise ValueError("a ZeRO plan needs its emitted DeepSpeed config")
    ds = filled_deepspeed_config(req.deepspeed_config, c, req.world_size, model.config.hidden_size)
    optimizer = None
    if "optimizer" not in ds:
        optimizer = build_optimizer(c.optimizer, model, model.config)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds, dist_init_required=False)
    notes.append("DeepSpeed engine from the emitted deepspeed_config.json (\"auto\" values filled)")

    def step(mark: Callable[[str], None]) -> None:
        for _ in range(c.grad_accum):  # DeepSpeed steps the optimizer at the accumulation boundary
            mark("forward")
            loss = engine(input_ids=ids, labels=ids).loss
            mark("backward")
            engine.backward(loss)
            mark("step")
            engine.step()
            del loss

    return Run(step, notes)
