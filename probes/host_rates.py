"""The host-side rates a plan's step time uses and no catalog holds, measured on this machine.

planner assumes two rates (planner/cost/overheads.py) unless a flag or a calibration sets them:
- the CPU optimizer step, parameters a second a node's CPUs update: DeepSpeed CPU-Adam
  (``DeepSpeedCPUAdam``, ZeRO-Offload's step; its op compiles on first use with the host's C++
  compiler) and torch's AdamW on host tensors (FSDP2's ``CPUOffloadPolicy`` steps with the user's
  torch optimizer; the fused CPU kernel where torch has one, else ``foreach``), all threads;
- page migration, bytes a second paged optimizer state moves between host RAM and the GPU:
  bitsandbytes' ``PagedAdamW32bit`` on a CUDA parameter, its two states (CUDA managed memory,
  bitsandbytes ``get_paged``, a host view of managed memory) sent to host RAM by writing them
  from the CPU (their pages fault over, page by page, as the driver's eviction moves them), then
  a step, which brings them back (bitsandbytes ``prefetch_state``) and updates; the step's time
  beyond a step with resident states, plus the send, is the round trip planner's model charges
  (strategies/optimizer.py: 2 x spilled bytes at this rate). Caveat: under real pressure the
  driver evicts pages to make room, which this does not reproduce: nothing asks for more managed
  memory than a quarter of what the GPU has free.
- the pinned host link, for reference (host-to-device and back, ``copy_`` from pinned memory).

Each rate is the median of ``REPEATS`` timed repetitions after one warm-up; a rate that cannot be
measured here (no GPU, no compiler, no bitsandbytes) is reported with why, never guessed.
"""

import statistics
import time
from collections.abc import Callable

#: Parameters per CPU optimizer measurement: 2^27 fp32 (512 MiB a tensor; parameter, gradient and
#: two states: 2 GiB of host RAM), long enough (~0.1 s at 1B params/s) to time, short for a window.
CPU_PARAMS = 1 << 27
#: Parameters of the paged measurement: 2^27 fp32, so 1 GiB of paged state (two states).
PAGED_PARAMS = 1 << 27
#: Bytes of the pinned copy.
PINNED_BYTES = 1 << 30
REPEATS = 5


def _median_seconds(fn, repeats: int = REPEATS, sync=None) -> float:
    fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cpu_tensors(n: int):
    import torch

    p = torch.nn.Parameter(torch.randn(n) * 0.02)
    p.grad = torch.randn(n) * 1e-3
    return p


def deepspeed_cpu_adam(n: int = CPU_PARAMS) -> dict:
    """DeepSpeed CPU-Adam's step over ``n`` fp32 parameters: params/s (its op is built first)."""
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    t0 = time.perf_counter()
    p = _cpu_tensors(n)
    opt = DeepSpeedCPUAdam([p], lr=1e-5, adamw_mode=True)
    built = time.perf_counter() - t0
    seconds = _median_seconds(opt.step)
    return {"params_per_s": n / seconds, "step_seconds": seconds, "params": n, "build_seconds": round(built, 1),
            "threads": torch.get_num_threads()}


def torch_cpu_adamw(n: int = CPU_PARAMS) -> dict:
    """torch AdamW's step on host tensors: fused where this torch has the CPU kernel, else foreach."""
    import torch

    out = {"params": n, "threads": torch.get_num_threads()}
    for kind in ("fused", "foreach"):
        p = _cpu_tensors(n)
        try:
            opt = torch.optim.AdamW([p], lr=1e-5, **{kind: True})
            seconds = _median_seconds(opt.step)
        except (RuntimeError, TypeError) as e:
            out[kind] = {"error": str(e)[:200]}
            continue
        out[kind] = {"params_per_s": n / seconds, "step_seconds": seconds}
    rates = [v["params_per_s"] for v in (out.get("fused"), out.get("foreach")) if isinstance(v, dict) and "params_per_s" in v]
    if rates:
        out["params_per_s"] = rates[0]  # the fused kernel where it ran (what the Trainer's default picks)
    return out


def paged_migration(n: int = PAGED_PARAMS) -> dict:
    """bitsandbytes paged 32-bit AdamW: its state's round trip to host RAM, bytes/s."""
    import bitsandbytes as bnb
    import torch

    free, _ = torch.cuda.mem_get_info()
    state_bytes = 2 * 4 * n
    if state_bytes > free / 4:
        return {"error": f"{state_bytes / 2**30:.1f} GiB of paged state is over a quarter of the free memory"}
    p = torch.nn.Parameter(torch.randn(n, device="cuda") * 0.02)
    p.grad = torch.randn(n, device="cuda") * 1e-3
    opt = bnb.optim.PagedAdamW32bit([p], lr=1e-5)
    opt.step()
    states = [v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and getattr(v, "is_paged", False)]
    paged = sum(s.nbytes for s in states)
    sync = torch.cuda.synchronize

    def out() -> None:
        # a paged state is a host view of managed memory: writing it from the CPU faults its pages
        # to host RAM, as the driver's eviction does (bitsandbytes' prefetch to the host fails on
        # some CUDA 13 builds: "invalid device ordinal")
        for s in states:
            s.add_(0.0)

    resident = _median_seconds(opt.step, sync=sync)
    sends, steps = [], []
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter()
        out()
        t1 = time.perf_counter()
        opt.step()
        sync()
        sends.append(t1 - t0)
        steps.append(time.perf_counter() - t1)
    send, back = statistics.median(sends), max(statistics.median(steps) - resident, 1e-9)
    return {"bytes_per_s": 2 * paged / (send + back), "to_host_bytes_per_s": paged / send,
            "to_gpu_bytes_per_s": paged / back, "paged_bytes": paged, "resident_step_seconds": resident,
            "method": "PagedAdamW32bit: states written from the CPU (pages fault to host), then a step "
                      "(bitsandbytes prefetches them back)"}


def pinned_link() -> dict:
    """Pinned host memory to the GPU and back, bytes/s (one direction at a time)."""
    import torch

    host = torch.empty(PINNED_BYTES, dtype=torch.uint8, pin_memory=True).random_()
    dev = torch.empty(PINNED_BYTES, dtype=torch.uint8, device="cuda")
    sync = torch.cuda.synchronize
    up = _median_seconds(lambda: dev.copy_(host, non_blocking=True), sync=sync)
    down = _median_seconds(lambda: host.copy_(dev, non_blocking=True), sync=sync)
    return {"to_gpu_bytes_per_s": PINNED_BYTES / up, "to_host_bytes_per_s": PINNED_BYTES / down}


#: name -> (measurement, needs CUDA)
MEASUREMENTS: dict[str, tuple[Callable[..., dict], bool]] = {
    "deepspeed_cpu_adam": (deepspeed_cpu_adam, False), "torch_cpu_adamw": (torch_cpu_adamw, False),
    "paged_migration": (paged_migration, True), "pinned_link": (pinned_link, True)}


def measure(names: tuple[str, ...] | None = None, cuda: bool = True, params: int | None = None) -> dict[str, dict]:
    """Each measurement in ``names`` (all by default): its figures, or ``{"error": why}``; those
    that need CUDA are skipped without it; ``params`` overrides the CPU optimizer's size. Run it
    in a child process that owns the GPU."""
    out: dict[str, dict] = {}
    for name in names or tuple(MEASUREMENTS):
        fn, needs_cuda = MEASUREMENTS[name]
        if needs_cuda and not cuda:
            out[name] = {"error": "skipped: needs CUDA"}
            continue
        t0 = time.perf_counter()
        try:
            out[name] = fn(params) if params and not needs_cuda else fn()
        except Exception as e:  # noqa: BLE001 - a rate that cannot be measured here says why
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        out[name]["seconds"] = round(time.perf_counter() - t0, 2)
    return out
