"""The measured fidelity: a short real training run of one plan on this machine's GPU.

A fresh child process (probes/child.py: its own process group, a hard timeout) builds the plan's
model from its architecture with random weights and synthetic tokens, the way the emitted files
would (probes/measured_setup.py), runs warm-up steps and timed steps, and reports:
- ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the training steps (peaks
  reset after the model is built), allocator retries and OOMs (``memory_stats``);
- the memory the driver sees the process use: NVML or nvidia-smi per process, else the device's
  used memory less what was used before the probe started; the CUDA context is that reading less
  the allocator's reserved bytes at the same instant, and ``driver_used_bytes`` is the context
  plus the reserved peak;
- each timed step's wall time (``torch.cuda.synchronize`` around it);
- an out-of-memory error as a result (status ``oom``, where it happened, the peaks so far), never
  a crash; any other failure as ``error`` with its message.

Safety on a shared GPU: the allocator is capped (``set_per_process_memory_fraction``) at the
smaller of the plan's GPU memory less the context, and the device's free memory less a reserve;
a paged optimizer's unified memory is subtracted first, and a probe whose unified memory would
not fit in free device memory is refused (``memory_budget``). Nothing here changes clocks, power
or compute mode, or resets the device.

``device="cpu"`` runs the same code on the CPU (tests, no GPU): the step times are real, there
are no memory figures, and ``memory_cap_bytes`` caps the process's address space above what it
has mapped once the model is built (``RLIMIT_AS``), so a real allocation failure in a training
step exercises the OOM path.
"""

import os
import statistics
import sys
import time
from importlib import metadata

from pydantic import ConfigDict, Field

from planner.core.launch_contract import ALLOC_CONF_VAR, LAUNCH_ENV
from planner.core.record import Record
from planner.probes.gpu_readings import device_used_bytes, process_device_bytes, snapshot
from planner.strategies import TrainingConfig

#: Device memory a probe leaves free for everyone else on a shared GPU (and the driver).
SHARED_RESERVE_BYTES = 1 << 30
#: Messages of allocation failures that are not ``torch.OutOfMemoryError`` (cuBLAS / cuDNN
#: workspaces, NCCL, the CPU allocator under RLIMIT_AS).
OOM_MESSAGES = ("out of memory", "alloc_failed", "can't allocate memory", "cannot allocate memory",
                "failed to allocate")


class MeasureRequest(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config_json: dict  # the model's config.json
    config: TrainingConfig
    world_size: int = Field(1, ge=1)  # FSDP / ZeRO ranks under a fake process group (one rank measured)
    layers: int | None = Field(None, ge=1)  # reduced depth (None: the model's full depth)
    warmup_steps: int = Field(2, ge=1)
    timed_steps: int = Field(5, ge=1)
    device: str = Field("cuda", pattern="^(cuda|cpu)$")
    memory_cap_bytes: int | None = Field(None, gt=0)  # the plan's GPU memory: the process may use no more
    unified_bytes: int = Field(0, ge=0)  # paged optimizer state it will place in unified memory (predicted)
    deepspeed_config: dict | None = None  # the emitted DeepSpeed JSON (ZeRO plans)
    device_used_before_bytes: int | None = None  # device-wide used memory before the probe (parent's reading)
    seed: int = 0
    #: PYTORCH_CUDA_ALLOC_CONF the run starts with: the launch's (expandable segments), or "" for
    #: torch's default allocator (a validation case measuring what a job without it reserves)
    allocator_conf: str = LAUNCH_ENV[ALLOC_CONF_VAR]


class MeasureResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    status: str  # ok | oom | error | refused | timeout
    message: str = ""
    where: str = ""  # build | warmup N | step N: where an oom or error happened
    device_name: str = ""
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None  # free on the device when the probe began
    allocator_limit_bytes: int | None = None  # the cap given to the caching allocator
    context_bytes: int | None = None  # driver-seen process memory less the allocator's reserved bytes
    max_allocated_bytes: int | None = None
    max_reserved_bytes: int | None = None
    phase_peaks: dict[str, int] = {}  # forward / backward / step -> allocated peak over the training steps
    driver_used_bytes: int | None = None  # context + reserved peak
    driver_method: str = ""
    alloc_retries: int | None = None
    num_ooms: int | None = None
    step_seconds: list[float] = []
    readings: dict[str, dict[str, int | None]] = {}  # start | built | peak -> probes/gpu_readings.py READINGS
    allocator_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF the run's allocator started with
    versions: dict[str, str | None] = {}
    notes: list[str] = []
    seconds: float = 0.0

    @property
    def median_step_seconds(self) -> float | None:
        return statistics.median(self.step_seconds) if self.step_seconds else None


class Budget(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    allocator_limit_bytes: int
    refused: str = ""  # why the probe must not run ("" when it may)
    note: str = ""


def memory_budget(total: int, free: int, context: int, cap: int | None, unified: int) -> Budget:
    """The caching allocator's limit, in bytes, for a probe on a possibly shared GPU.

    - The plan's GPU holds ``cap`` bytes in all (None: this device's ``total``); the process's
      context is already resident, so the allocator may use ``cap - context``: on a bigger card
      that emulates a smaller one, exactly the room the plan's card gives it.
    - Paged optimizer state lives in CUDA unified memory outside the allocator. Its bytes come off
      this device's free memory only (never ask for more unified memory than the card has free),
      not off the emulated card's room: on the plan's card the driver would evict pages to host
      RAM where the allocator needs the memory, which a bigger card never has to do (so a
      predicted spill is not measured: the probe's caller says so).
    - On a shared device at most ``free - SHARED_RESERVE_BYTES - unified`` is taken; when that is
      below the plan's limit an OOM here says less about the plan's GPU (``note``)."""
    target = (cap if cap is not None else total) - context
    room = free - SHARED_RESERVE_BYTES
    if unified and unified > room:
        return Budget(allocator_limit_bytes=0, refused=(
            f"the paged optimizer needs {unified / 2**30:.2f} GiB of unified memory and the device has "
            f"{free / 2**30:.2f} GiB free: a probe never asks for more unified memory than the card has free"))
    available = room - unified
    if available <= 0:
        return Budget(allocator_limit_bytes=0, refused=f"the device has only {free / 2**30:.2f} GiB free")
    limit = min(target, available)
    note = (f"allocator capped at {limit / 2**30:.2f} GiB by this device's free memory, below the plan's "
            f"{target / 2**30:.2f} GiB: an OOM here may fit on the plan's GPU" if available < target else "")
    return Budget(allocator_limit_bytes=max(limit, 0), note=note)


def classify_failure(exc: BaseException) -> str:
    """``oom`` for an allocation failure (torch.OutOfMemoryError, MemoryError, or an error whose
    message says the allocator failed: cuBLAS/cuDNN workspaces, the CPU allocator); ``refused``
    when a package the plan needs is not installed here (the message says which); else ``error``."""
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return "oom"
    if isinstance(exc, ImportError):
        return "refused"
    text = str(exc).lower()
    return "oom" if any(m in text for m in OOM_MESSAGES) else "error"


def software_versions() -> dict[str, str | None]:
    import torch

    out: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "accelerate", "deepspeed", "bitsandbytes", "torchao"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_measure(req: MeasureRequest) -> MeasureResult:
    """In this process: build the plan, run it, measure. Never raises for the plan's own failures."""
    import torch

    start = time.perf_counter()
    fields: dict = {"versions": software_versions(), "notes": [],
                    "allocator_conf": os.environ.get(ALLOC_CONF_VAR, "")}
    cuda = req.device == "cuda"
    readings: dict[str, dict[str, int | None]] = {}
    if cuda and not torch.cuda.is_available():
        return MeasureResult(status="refused", message="no CUDA GPU is visible to this process", **fields)
    torch.manual_seed(req.seed)
    device = torch.device(req.device)
    peaks = PhasePeaks(cuda)
    where = "setup"
    times: list[float] = []
    try:
        if cuda:
            budget = _cap_cuda(req, device, fields, readings)
            if budget.refused:
                return MeasureResult(status="refused", message=budget.refused, readings=readings, **fields)
        where = "build"
        from planner.probes.measured_setup import build_run

        run = build_run(req, device)
        fields["notes"] += run.notes
        if cuda:
            # what the build freed (a quantized model's 16-bit copies) goes back to the driver, as a
            # training process that loads the model and then trains holds only what training keeps
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            readings["built"] = snapshot()
            torch.cuda.reset_peak_memory_stats()
        elif req.memory_cap_bytes:
            _cap_address_space(req.memory_cap_bytes)
        for i in range(req.warmup_steps + req.timed_steps):
            warm = i < req.warmup_steps
            where = f"warmup {i + 1}" if warm else f"step {i - req.warmup_steps + 1}"
            t0 = time.perf_counter()
            run.step(peaks.mark)
            peaks.mark("")
            if cuda:
                torch.cuda.synchronize()
            if not warm:
                times.append(time.perf_counter() - t0)
            if cuda:  # after the timer: the readings at the step's end, the largest device use kept
                now = snapshot()
                if (now["device_used"] or 0) >= ((readings.get("peak") or {}).get("device_used") or -1):
                    readings["peak"] = now
        status, message, where = "ok", "", ""
    except (Exception, MemoryError) as exc:  # the plan's failure is the result
        status, message = classify_failure(exc), f"{type(exc).__name__}: {str(exc)[:1500]}"
    if cuda:
        peaks.mark("")
        fields |= _cuda_memory(req, peaks)
        if status != "ok":
            readings["end"] = _safe_snapshot()
    return MeasureResult(status=status, message=message, where=where, step_seconds=times, readings=readings,
                         seconds=time.perf_counter() - start, **fields)


def _safe_snapshot() -> dict[str, int | None]:
    """The readings after a failure; empty when the device cannot answer (a CUDA error)."""
    try:
        return snapshot()
    except Exception:  # a sticky CUDA error: nothing more can be read
        return {}


class PhasePeaks:
    """The allocator's peaks per phase: ``mark(phase)`` closes the phase running until now (its
    max allocated and reserved since the last mark) and resets the peak counters."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.current = cuda, ""
        self.allocated: dict[str, int] = {}
        self.max_allocated = self.max_reserved = 0

    def mark(self, phase: str) -> None:
        if self.cuda:
            import torch

            allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
            if self.current:
                self.allocated[self.current] = max(self.allocated.get(self.current, 0), allocated)
            self.max_allocated, self.max_reserved = max(self.max_allocated, allocated), max(self.max_reserved, reserved)
            torch.cuda.reset_peak_memory_stats()
        self.current = phase


def _cap_cuda(req: MeasureRequest, device, fields: dict, readings: dict) -> Budget:
    """Start CUDA (context and cuBLAS), read the free memory and the context, cap the allocator."""
    import torch

    x = torch.ones(256, 256, device=device)
    (x @ x).sum().item()  # loads cuBLAS: its workspace is part of what every step needs
    del x
    readings["start"] = snapshot()
    free, total = torch.cuda.mem_get_info(device)
    used, _ = process_device_bytes(req.device_used_before_bytes)
    context = max(0, used - torch.cuda.memory_reserved(device)) if used is not None else 0
    budget = memory_budget(total, free, context, req.memory_cap_bytes, req.unified_bytes)
    fields.update(device_name=torch.cuda.get_device_name(device), device_total_bytes=total, device_free_bytes=free,
                  allocator_limit_bytes=budget.allocator_limit_bytes or None)
    if budget.note:
        fields["notes"].append(budget.note)
    if not budget.refused:
        index = device.index if device.index is not None else torch.cuda.current_device()  # (torch wants one)
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget.allocator_limit_bytes / total), index)
    return budget


def _cuda_memory(req: MeasureRequest, peaks: PhasePeaks) -> dict:
    """The peaks, the allocator's retry and OOM counts (cumulative since start: never reset), and
    the driver's reading with the reserved bytes of the same instant."""
    import torch

    stats = torch.cuda.memory_stats()
    used, method = process_device_bytes(req.device_used_before_bytes)
    context = max(0, used - torch.cuda.memory_reserved()) if used is not None else None
    return {"max_allocated_bytes": peaks.max_allocated, "max_reserved_bytes": peaks.max_reserved,
            "phase_peaks": peaks.allocated,
            "alloc_retries": stats.get("num_alloc_retries", 0), "num_ooms": stats.get("num_ooms", 0),
            "context_bytes": context, "driver_method": method,
            "driver_used_bytes": context + peaks.max_reserved if context is not None else None}


def _cap_address_space(extra: int) -> None:
    """CPU runs: at most ``extra`` bytes of address space beyond what the process maps now."""
    import resource

    import torch

    torch.ones(64, 64) @ torch.ones(64, 64)  # start the thread pools before the cap
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, resource.getrlimit(resource.RLIMIT_AS)[1]))


def measure(req: MeasureRequest, timeout: float) -> MeasureResult:
    """``run_measure`` in a fresh child process that ends within ``timeout`` seconds."""
    from planner.probes.child import run_child

    if req.device == "cuda" and req.device_used_before_bytes is None:
        req = req.model_copy(update={"device_used_before_bytes": device_used_bytes()})
    outcome = run_child("planner.probes.measured", req.model_dump_json(), timeout,
                        env=LAUNCH_ENV | {ALLOC_CONF_VAR: req.allocator_conf})
    return _result(outcome)


def measure_forked(req: MeasureRequest, timeout: float) -> MeasureResult:
    """``run_measure`` in a child forked from this process (probes/forked.py): the libraries this
    process imported are not imported again, so a probe starts in a fraction of a second. This
    process must not have started CUDA (the child starts its own context, and its allocator reads
    the environment ``measure`` gives its child, set in the child before that). Fork from a
    process with no other threads: a lock another thread held at the fork stays held in the child
    (gpu_validate's case runner is such a process)."""
    from planner.probes.forked import run_forked

    if req.device == "cuda" and req.device_used_before_bytes is None:
        req = req.model_copy(update={"device_used_before_bytes": device_used_bytes()})
    return _result(run_forked(_measure_payload, req.model_dump_json(), timeout))


def _measure_payload(payload: str) -> dict:
    """The forked child: the launch's allocator environment (this child's only), then the run."""
    req = MeasureRequest.model_validate_json(payload)
    os.environ.update(LAUNCH_ENV | {ALLOC_CONF_VAR: req.allocator_conf})
    return run_measure(req).model_dump()


def _result(outcome) -> MeasureResult:
    """A child's outcome (probes/child.py ChildOutcome) as a result: timeouts and crashes too."""
    if outcome.status == "timeout":
        return MeasureResult(status="timeout", message=outcome.describe(), seconds=outcome.seconds)
    if outcome.status != "ok" or not isinstance(outcome.value, dict):
        return MeasureResult(status="error", message=outcome.describe(), seconds=outcome.seconds)
    return MeasureResult.model_validate(outcome.value)


def main() -> None:
    from planner.probes.child import answer

    req = MeasureRequest.model_validate_json(sys.stdin.read())
    answer(run_measure(req).model_dump())


if __name__ == "__main__":
    main()
