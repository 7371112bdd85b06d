"""The traced fidelity: the real transformers model on fake tensors, every byte attributed.

torch's FakeTensorMode runs the model without allocating memory; the step tracker (torch's
MemTracker, or FSDPMemTracker for sharded plans, plus the planner's phases: probes/tracker.py)
attributes every tensor to parameters, gradients, optimizer state, activations or temporaries,
and records each phase's peak. One process sees one rank: sharded plans run FSDP2
(``fully_shard``) under a fake process group of the plan's world size (tensor-parallel ones
transformers' own parallel plans: probes/model_setup.py ``distributed_model``); Ulysses plans run
DeepSpeed's Ulysses attention under one of their degree, rank 0 holding its share of the positions
(probes/model_setup.py ``ulysses_attention``).

What is traced and what is computed (reported in ``TraceResult.notes``):
- traced: parameters, gradients, activations, temporaries, each phase's peak; optimizer state
  for torch optimizers (AdamW, SGD, Adafactor); the chunked loss through a re-implementation
  with Liger-Kernel's allocations (probes/chunked_loss.py);
- computed: the states of optimizers whose kernels do not run under fake tensors (bitsandbytes,
  torchao, Adam-mini: ``Impl.fake``), from the optimizer's own state rule for the traced
  parameters, added to every phase's peak (paged state as resident); QLoRA's NF4 weights
  (traced as LoRA over the 16-bit base, the quantized weights' bytes replaced by
  planner.cost.adapters.nf4_bytes);
- adapters: the peft-wrapped model (planner.runtime.adapter), as the launch wraps it;
- not traced: ZeRO (DeepSpeed does not run under fake tensors): per-rank model states follow the
  ZeRO partition rules (planner.cost.zero); compare a ZeRO plan's activations with sharding none;
- CPU kernels: fake tensors live on the CPU (a CPU build of torch cannot fake CUDA tensors), so
  attention dispatches to the CPU flash kernel and autocast uses the CPU lists; dropout and SDPA
  with dropout are sent to the GPU kernels' ops (probes/model_setup.py ``gpu_kernels``).

Each trace runs in a child process with a timeout (``trace``, ``trace_many``): a crash inside
torch can never take the planner down.
"""

import contextlib
import json
import sys
import time
from typing import Literal

from pydantic import ConfigDict

from planner.core.errors import ProbeFailedError
from planner.core.record import Record
from planner.strategies import TrainingConfig


class TraceRequest(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config_json: dict  # the model's config.json
    config: TrainingConfig
    world_size: int = 1
    layers: int | None = None  # reduced depth (None: full depth)
    iterations: int = 2  # with warm_up "iteration": whole iterations, the last one measured
    warm_up: Literal["step", "iteration"] | None = None  # None: ``warm_up_of`` decides
    explain: bool = False  # list the tensors alive at the peak
    real: bool = False  # real CPU tensors instead of fake ones (small models only: checks the fake trace)


class TraceResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    peak_bytes: int  # the whole step's peak (largest phase)
    peak_phase: str
    phase_peaks: dict[str, int]  # forward / backward / step -> bytes
    at_peak: dict[str, int]  # category -> bytes at the step's peak
    phase_snapshots: dict[str, dict[str, int]]  # phase -> category -> bytes at that phase's peak
    parameters_bytes: int  # this rank's parameters (sharded under FSDP)
    gradients_bytes: int  # after backward, before the step
    optimizer_state_bytes: int
    baseline_bytes: int  # alive when the measured iteration starts (model states)
    inplace_adds: int  # the measured iteration's gradient accumulations counted in place (probes/tracker.py)
    seconds: float
    notes: list[str]
    explanation: list[str] = []


def preload() -> None:
    """Import what ``run_trace`` imports (torch, transformers' model classes, torch's memory
    tracker: about 4 s on 2 CPU cores), so that a child started ahead of its first request
    (probes/trace_worker.py) has them by the time the request comes."""
    import torch  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    from planner.probes import chunked_loss, model_setup, tracker  # noqa: F401
    from planner.runtime import model, optimizer, precision, sharding  # noqa: F401


def run_trace(req: TraceRequest) -> TraceResult:
    """In this process: build, warm up (``warm_up_of``), run the measured iteration under the step
    tracker, report it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from planner import runtime
    from planner.probes import model_setup
    from planner.probes.chunked_loss import chunked_causal_lm_forward
    from planner.probes.tracker import StepTracker, fsdp_step_tracker
    from planner.runtime.model import build_config, build_model
    from planner.runtime.optimizer import build as build_optimizer
    from planner.runtime.precision import autocast_on
    from planner.runtime.sharding import apply_fsdp

    start = time.perf_counter()
    c = req.config
    cfg = build_config(req.config_json, req.layers)
    fsdp = c.sharding.startswith("fsdp")
    sp = c.sequence_shards
    notes = ["real CPU tensors" if req.real else "traced on CPU fake tensors: CPU attention kernels and CPU autocast lists"]
    mesh = meshes = None
    tp = c.tensor_shards
    if fsdp:  # the mesh holds a real rank tensor: build it outside fake mode
        from torch.distributed.device_mesh import init_device_mesh

        model_setup.fake_process_group(req.world_size)
        if tp > 1:
            meshes = model_setup.tensor_parallel_mesh(c, req.world_size)
        else:
            mesh = init_device_mesh("cpu", (req.world_size,))
    if sp > 1:
        model_setup.fake_process_group(sp)
    mode = contextlib.nullcontext() if req.real else FakeTensorMode(allow_non_fake_inputs=True)
    undo = (lambda: None) if req.real else model_setup.gpu_kernels(c)
    with mode, contextlib.ExitStack() as cleanup:
        cleanup.callback(undo)
        if meshes is not None:
            model, unpatch = model_setup.distributed_model(cfg, c, meshes)
            cleanup.callback(unpatch)
            notes.append(f"tensor parallelism: transformers' DistributedConfig (TP {tp} x FSDP2 {req.world_size // tp}) "
                         f"under a fake process group of {req.world_size} ranks, its own FSDP2 units (one rank traced)")
        else:
            model = build_model(cfg, c)
        notes += runtime.prepare(model, c, runtime.Site.TRACED, chunked_fallback=chunked_causal_lm_forward)
        if c.adapter != "none" and not req.real:
            cleanup.callback(model_setup.peft_on_fake_tensors())
        if c.adapter == "qlora":
            cleanup.callback(model_setup.bnb_lora_casts())
        model, wrapped = runtime.wrap(model, c, runtime.Site.TRACED)
        notes += wrapped
        if sp > 1:
            cleanup.callback(model_setup.ulysses_attention(model, c))
            notes.append(f"Ulysses: DeepSpeed's UlyssesSPAttentionHF under a fake process group of {sp} ranks (rank 0 "
                         f"traced, its {c.seq_len // sp:,} positions of each sequence)")
        nf4_saving = model_setup.nf4_saving_bytes(model) if c.adapter == "qlora" else 0
        if nf4_saving:
            notes.append("qlora: traced over the 16-bit base; the NF4 weights computed (bitsandbytes does not run on "
                         "fake tensors), and its per-matmul dequantization not traced")
        if fsdp and meshes is None:
            apply_fsdp(model, c, mesh)
            notes.append(f"FSDP2 fully_shard under a fake process group of {req.world_size} ranks (one rank traced)")
        elif c.sharding.startswith("zero"):
            notes.append("ZeRO is not traced (DeepSpeed does not run under fake tensors): model states are computed")
        optimizer = build_optimizer(c.optimizer, model, cfg, fused=True, fake=True)
        ids = torch.randint(0, cfg.vocab_size, (c.micro_batch_size, c.seq_len // sp))  # a rank's positions
        # (Ulysses gathers each rank's position ids; accelerate's data loader adapter passes them)
        positions = {"position_ids": torch.arange(c.seq_len // sp).expand(c.micro_batch_size, -1)} if sp > 1 else {}
        if fsdp:
            tracker = fsdp_step_tracker(model, optimizer, explain=req.explain)
        else:
            tracker = StepTracker(explain=req.explain)
            tracker.track_external(model, *([optimizer] if optimizer is not None else []))
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_on(c))
        grads = 0
        warm_up = warm_up_of(req)
        iterations = 1 if warm_up == "step" else req.iterations
        with tracker:
            if warm_up == "step" and optimizer is not None:
                _create_states(model, optimizer, tracker)
            for i in range(iterations):
                tracker.measuring = i == iterations - 1  # the last iteration: optimizer states exist
                if tracker.measuring:
                    baseline = _categories(tracker.get_tracker_snapshot("current"), None)
                tracker.phase = "forward"
                with autocast:
                    loss = model(input_ids=ids, labels=ids, **positions)
                    loss = loss if isinstance(loss, torch.Tensor) else loss.loss
                tracker.start_backward()
                loss.backward()
                del loss
                if i == iterations - 1:
                    grads = _categories(tracker.get_tracker_snapshot("current"), {"Gradient", "Sharded Grad"})
                if i == iterations - 1:  # what the step starts from (a step fake mode cannot run allocates nothing)
                    step_start = _categories(tracker.get_tracker_snapshot("current"), None)
                tracker.phase = "step"
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                else:
                    model.zero_grad(set_to_none=True)
                if i < iterations - 1:
                    tracker.reset_mod_stats()
        current = tracker.get_tracker_snapshot("current")
    params = _categories(current, {"Parameter", "Sharded Param"}) - nf4_saving
    # states of an optimizer fake mode cannot run: computed, and held on the GPU through every
    # phase as a real run holds them (paged state too: unified memory stays on the GPU while it
    # has room, as the analytic ledger's resident rows say for a GPU that holds it)
    computed = 0
    if optimizer is not None:
        states = _categories(current, {"Optstate", "OptState"})
    else:
        dense, paged = model_setup.computed_state_bytes(model, c)
        states = computed = dense + paged
        notes.append(f"{c.optimizer}: {states:,} state bytes computed, held through every phase"
                     + (f" ({paged:,} paged, resident)" if paged else "")
                     + " (the optimizer does not run under fake tensors)")
    peaks = {p: v - nf4_saving + computed for p, v in tracker.phase_peaks.items()}
    if optimizer is None:  # the step holds the states and its temporaries over what it starts from
        temporaries = model_setup.computed_step_temporaries(model, c)
        peaks["step"] = max(peaks.get("step", 0), step_start - nf4_saving + computed + temporaries)
        if temporaries:
            notes.append(f"{c.optimizer}: its step's temporaries computed ({temporaries:,} bytes)")
    phase = max(peaks, key=lambda k: peaks[k])
    return TraceResult(
        peak_bytes=peaks[phase], peak_phase=phase, phase_peaks=peaks, at_peak=tracker.phase_snapshots.get(phase, {}),
        phase_snapshots=tracker.phase_snapshots,
        parameters_bytes=params, gradients_bytes=grads, optimizer_state_bytes=states,
        baseline_bytes=baseline - nf4_saving + computed, inplace_adds=tracker.inplace_adds,
        seconds=time.perf_counter() - start, notes=notes,
        explanation=tracker.explanation() if req.explain else [],
    )


def warm_up_of(req: TraceRequest) -> str:
    """What runs before the measured iteration. "step": one optimizer step over zero gradients
    creates the optimizer's state (no forward or backward: about 45 % of a trace's time); the
    measured iteration then sees what a whole first iteration leaves (tests/test_traced.py: model
    states to the byte, phase peaks and baseline within 4 KiB, under no sharding, FSDP2 and
    Ulysses). "iteration": ``iterations - 1`` whole iterations, for tensor-parallel plans, whose
    first forward frees a tensor alive since the model was built (262,667,264 bytes at Llama-3.2-1B,
    TP 2 x FSDP2 2: about a bf16 TP shard of its embedding): after a step alone the baseline would
    still hold it (the peaks agree)."""
    if req.warm_up is not None:
        return req.warm_up
    return "iteration" if req.config.tensor_shards > 1 else "step"


def _create_states(model, optimizer, tracker) -> None:
    """The optimizer's state as its first step leaves it, without a forward or backward: every
    trainable parameter gets a zero gradient of its own shape, dtype and placement (a sharded one
    under FSDP2), the optimizer steps, the gradients are dropped. torch's optimizers size their
    state from the parameter alone (AdamW's ``exp_avg``/``exp_avg_sq``/``step``, SGD's momentum
    buffer, Adafactor's factored rows and columns), never from the gradient's values. Not measured:
    the tracker counts nothing until the measured iteration."""
    import torch

    tracker.measuring, tracker.phase = False, "step"
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker.reset_mod_stats()


def fake_world(req: TraceRequest) -> int | None:
    """The ranks of the fake process group ``req``'s trace runs under (one per process): the world
    of an FSDP plan, the degree of a Ulysses one; None where it runs none."""
    if req.config.sharding.startswith("fsdp"):
        return req.world_size
    return req.config.sequence_shards if req.config.sequence_shards > 1 else None


def _categories(snapshot: dict, names: set[str] | None) -> int:
    """Bytes of the named categories in a tracker snapshot (None: the total)."""
    total = 0
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = key.value if hasattr(key, "value") else key
            if (names is None and name == "Total") or (names is not None and name in names):
                total += value
    return total


def trace_many(requests: list[TraceRequest], timeout: float = 600, workers: int = 1) -> list[TraceResult | str]:
    """Run the requests in child processes (one per world size at least: the fake process group is
    per process; each world's requests split over ``workers`` children, at most ``workers`` running
    at once), each child with ``timeout`` seconds. A failed request yields its error text."""
    from concurrent.futures import ThreadPoolExecutor

    by_world: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        by_world.setdefault(fake_world(r) or 1, []).append(i)
    chunks = [indices[k::workers] for indices in by_world.values() for k in range(workers) if indices[k::workers]]
    out: list[TraceResult | str] = [""] * len(requests)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for indices, items in zip(chunks, pool.map(lambda c: _run_child([requests[i] for i in c], timeout), chunks), strict=True):
            for i, item in zip(indices, items, strict=True):
                out[i] = TraceResult.model_validate(item) if isinstance(item, dict) else item
    return out


def _run_child(batch: list[TraceRequest], timeout: float) -> list:
    """One child process over ``batch`` (same world size): the raw JSON items it returns."""
    from planner.probes.child import run_child

    outcome = run_child("planner.probes.traced", "[" + ",".join(r.model_dump_json() for r in batch) + "]", timeout)
    if outcome.status == "timeout":
        raise ProbeFailedError(f"traced probe timed out after {timeout:g} s")
    if outcome.status != "ok" or outcome.returncode != 0:
        raise ProbeFailedError(f"traced probe failed: {outcome.describe()}")
    if not isinstance(outcome.value, list):
        raise ProbeFailedError(f"traced probe failed: its child answered {type(outcome.value).__name__}, not a list")
    return outcome.value


def trace(req: TraceRequest, timeout: float = 600) -> TraceResult:
    """Run ``run_trace`` in a child process (JSON in, JSON out) with a timeout."""
    result = trace_many([req], timeout)[0]
    if isinstance(result, str):
        raise ProbeFailedError(f"traced probe failed: {result}")
    return result


def main() -> None:
    from planner.probes.child import answer

    results: list = []
    for raw in json.loads(sys.stdin.read()):
        try:
            results.append(run_trace(TraceRequest.model_validate(raw)).model_dump())
        except Exception as exc:  # one bad request must not lose the batch
            results.append(f"{type(exc).__name__}: {str(exc)[:1500]}")
    answer(results)


if __name__ == "__main__":
    main()
