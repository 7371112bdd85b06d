"""The traced fidelity: the real transformers model on fake tensors, every byte attributed.

torch's FakeTensorMode runs the model without allocating memory; MemTracker
(torch.distributed._tools.mem_tracker) attributes every tensor to parameters, buffers,
gradients, activations, temporaries or optimizer state, and records the peak. One process
sees one rank: sharded plans run FSDP2 (``fully_shard``) under a fake process group of the
plan's world size.

What is traced and what is computed (reported in ``TraceResult.notes``):
- traced: parameters, gradients, activations, temporaries, the peak; optimizer state for torch
  optimizers (AdamW, SGD, Adafactor);
- computed: bitsandbytes 8-bit / paged and Adam-mini states (their kernels do not run under fake
  tensors): the planner's state-layout formula for the traced parameters;
- not traced: ZeRO (DeepSpeed does not run under fake tensors): compare ZeRO plans through their
  activations with sharding none;
- CPU kernels: fake tensors live on the CPU (a CPU build of torch cannot fake CUDA tensors), so
  attention dispatches to the CPU flash kernel and autocast uses the CPU lists.

Each trace runs in a child process with a timeout (`trace`): a crash inside torch can never take
the planner down.
"""

import json
import subprocess
import sys
import time

from pydantic import BaseModel, ConfigDict

from planner.vocabulary import TrainingConfig

TRACED_OPTIMIZERS = ("adamw", "sgd", "adafactor")


class TraceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config_json: dict  # the model's config.json
    config: TrainingConfig
    world_size: int = 1
    layers: int | None = None  # reduced depth (None: full depth)
    iterations: int = 2


class TraceResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    peak_bytes: int  # all categories at the step's peak
    at_peak: dict[str, int]  # category -> bytes at that moment
    parameters_bytes: int
    gradients_bytes: int  # after backward, before the step
    optimizer_state_bytes: int
    activations_peak_bytes: int  # activations + temporaries at the peak
    seconds: float
    notes: list[str]


def run_trace(req: TraceRequest) -> TraceResult:
    """In this process: build, run ``iterations`` steps under MemTracker, report."""
    import torch
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    start = time.perf_counter()
    cfg_dict = dict(req.config_json)
    if req.layers is not None:
        cfg_dict["num_hidden_layers" if "num_hidden_layers" in cfg_dict or cfg_dict.get("model_type") != "gpt2"
                 else "n_layer"] = req.layers
    cfg = transformers.AutoConfig.for_model(**cfg_dict)
    cfg.use_cache = False
    c = req.config
    notes = ["traced on CPU fake tensors: CPU attention kernels and CPU autocast lists"]
    pure = c.precision == "bf16-pure"
    param_dtype = torch.bfloat16 if pure else torch.float32
    mesh = None
    if c.sharding.startswith("fsdp"):  # the mesh holds a real rank tensor: build it outside fake mode
        from torch.distributed.device_mesh import init_device_mesh

        _fake_process_group(req.world_size)
        mesh = init_device_mesh("cpu", (req.world_size,))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=param_dtype, attn_implementation=c.attention)
        if c.checkpointing == "full" and not c.sharding.startswith("fsdp"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif c.checkpointing == "selective" or (c.checkpointing == "full" and c.sharding.startswith("fsdp")):
            _checkpoint_layers(model, selective=c.checkpointing == "selective")
        if mesh is not None:
            _fully_shard(model, c, mesh)
            notes.append(f"FSDP2 fully_shard under a fake process group of {req.world_size} ranks (one rank traced)")
        elif c.sharding.startswith("zero"):
            notes.append("ZeRO is not traced (DeepSpeed does not run under fake tensors): model states are computed")
        optimizer = _optimizer(c.optimizer, model, notes)
        ids = torch.randint(0, cfg.vocab_size, (c.micro_batch_size, c.seq_len))
        tracker = MemTracker()
        tracker.track_external(model, *( [optimizer] if optimizer is not None else []))
        grads = 0
        with tracker:
            for i in range(req.iterations):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.precision in ("bf16-mixed", "fp8-mixed")):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                if i == req.iterations - 1:
                    grads = _category(tracker.get_tracker_snapshot("current"), "Gradient")
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                if i == 0:
                    tracker.reset_mod_stats()
        peak = _flat(tracker.get_tracker_snapshot("peak"))
        current = _flat(tracker.get_tracker_snapshot("current"))
    params = current.get("Parameter", 0)
    states = current.get("Optstate", 0) if optimizer is not None else _computed_states(model, c, notes)
    return TraceResult(
        peak_bytes=peak.get("Total", 0), at_peak={k: v for k, v in peak.items() if k != "Total"},
        parameters_bytes=params, gradients_bytes=grads, optimizer_state_bytes=states,
        activations_peak_bytes=peak.get("Activation", 0) + peak.get("Temp", 0),
        seconds=time.perf_counter() - start, notes=notes,
    )


def _fake_process_group(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def _fully_shard(model, c: TrainingConfig, mesh) -> None:
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mixed = c.precision in ("bf16-mixed", "fp8-mixed", "fp16-mixed")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else MixedPrecisionPolicy()
    reshard = c.sharding != "fsdp-grad-op"
    for layer in _layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)


def _layers(model):
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def _checkpoint_layers(model, selective: bool) -> None:
    from functools import partial

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention"):
        if hasattr(aten, name):
            save.add(getattr(aten, name).default)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    for layer in _layers(model):
        kw = {"context_fn": partial(create_selective_checkpoint_contexts, policy)} if selective else {}
        layer.forward = partial(checkpoint, layer.forward, use_reentrant=False, **kw)


def _optimizer(name: str, model, notes: list[str]):
    import torch

    params = list(model.parameters())
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-4, relative_step=False, scale_parameter=False)
    notes.append(f"{name}: states computed from their layout (the optimizer does not run under fake tensors)")
    return None


def _computed_states(model, c: TrainingConfig, notes: list[str]) -> int:
    from planner.cost import optimizer_states as S

    total = 0
    for p in model.parameters():
        n = p.numel()
        if c.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
            total += S.blockwise_8bit_states(n, 2)
        elif c.optimizer == "lion-8bit":
            total += S.blockwise_8bit_states(n, 1)
        elif c.optimizer in ("paged-adamw",):
            total += S.full_states(n, 2, 4)
        elif c.optimizer == "lion":
            total += S.full_states(n, 1, 4)
        elif c.optimizer == "adam-mini":
            total += S.adam_mini_states(tuple(p.shape), p.element_size())
    return total


def _flat(snapshot: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = key if isinstance(key, str) else key.value
            out[name] = out.get(name, 0) + value
    return out


def _category(snapshot: dict, name: str) -> int:
    return _flat(snapshot).get(name, 0)


def trace(req: TraceRequest, timeout: float = 600) -> TraceResult:
    """Run ``run_trace`` in a child process (JSON in, JSON out) with a timeout."""
    try:
        proc = subprocess.run([sys.executable, "-m", "probes.traced"], input=req.model_dump_json(), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"traced probe timed out after {timeout:g} s") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"traced probe failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return TraceResult.model_validate_json(lines[-1])


def main() -> None:
    req = TraceRequest.model_validate_json(sys.stdin.read())
    result = run_trace(req)
    sys.stdout.write("\n" + json.dumps(result.model_dump()) + "\n")


if __name__ == "__main__":
    main()
