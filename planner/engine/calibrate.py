"""``planner calibrate``: fit the analytic model's runtime assumptions to measured probes.

A measured probe (``planner probe --fidelity measured``) stores a Measurement per plan run on a
real GPU (planner/catalog/calibration.py). Per device GPU this module fits
- the memory a process holds beyond the caching allocator (CUDA context and the like),
- the allocator's reserve as a fraction of its allocated peak,
- a factor per compute dtype on the catalog's achieved FLOP/s (data/efficiency.yaml),
- the host's optimizer-step rate inside each engine, from plans that offload the optimizer,
and carries the host rates measured beside the GPU (paged state's migration) from the store; it
reports the analytic model's error on those measurements before and after, in sample and
leave-one-out. ``calibrate(request)`` is the command; ``fit`` and ``predict`` its parts.

Every prediction here is made with the GPU's *uncalibrated* catalog spec (the store's earlier
corrections never feed a new fit), on the device the measurement ran on.
"""

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache
from math import exp, log
from pathlib import Path
from statistics import median

from pydantic import ConfigDict, ValidationError

from planner.catalog.calibration import (
    ENV,
    CalibrationStore,
    Corrections,
    Measurement,
    apply,
)
from planner.catalog.efficiency import efficiency
from planner.catalog.families import spec_from_config, with_depth
from planner.catalog.gpus import (
    DEFAULT_INTER_NODE_GBPS_PER_GPU,
    catalog,
    default_host_memory_bytes,
    resolve_gpu,
)
from planner.core.errors import PlannerInputError
from planner.core.ledger import allocated_peak
from planner.core.record import Record
from planner.core.specs import GpuSpec, HardwareSpec, ModelSpec
from planner.core.timing import step_seconds
from planner.cost import overheads
from planner.engine.estimate import FRAGMENTATION_LABEL, evaluate, runtime_reserves
from planner.schema.calibrate import CalibrateRequest, CalibrateResult
from planner.strategies import TrainingConfig, reserve_extra
from planner.strategies.precision import LAYER_MATMUL_DTYPE
from planner.strategies.rates import cpu_optimizer_rate

#: The efficiency-table entry a plan's step time is fitted to: its decoder layers' matmul dtype
#: (strategies/precision.py; fp8-mixed runs them in fp8 and the rest in bf16, so it fits the "fp8"
#: entry with the bf16 factor already applied).
FIT_DTYPE = LAYER_MATMUL_DTYPE
#: Fit order: each later dtype is solved with the earlier factors applied (``apply`` scales
#: attention by the 16-bit factor, which fp32 and fp8 plans run too).
DTYPE_ORDER = ("bf16", "fp16", "fp32", "fp8")
#: Fewest rows a term is fitted from; with fewer it stays None (the assumption stays).
MIN_ROWS = 3
#: Range searched for a FLOP/s factor (k); a row outside it is clamped to the bound and counted.
SCALE_BOUNDS = (1 / 20, 20.0)
#: Bisection steps on log k: the bracket (log 400 ~ 6) shrinks to ~6e-12, far below timing noise.
BISECTION_STEPS = 40
_COUNTS = re.compile(r"^\s*(\d+)\s*[x×*]\s*(?:(\d+)\s*[x×*]\s*)?\S", re.IGNORECASE)


class Prediction(Record):
    """The analytic model's figures for one measurement's plan on the device it ran on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str
    nodes: int
    gpus_per_node: int
    allocated_bytes: int  # what torch's allocator counts (planner/core/ledger.py allocated_peak)
    pool_bytes: int = 0  # of the reserve, the engines' stream pools (strategies' allocator_reserve rows)
    peak_bytes: int  # the full per-GPU peak (Evaluation.peak)
    nccl_bytes: int  # NCCL buffers in the peak (none under a fake process group)
    step_seconds: float
    step_seconds_without_communication: float
    communication: str  # the measurement's: none | modelled | ...
    engine: str = ""  # who owns the step (strategies Engine): the CPU step's rate is per engine
    cpu_optimizer_seconds: float = 0.0  # the step's optimizer step on the host (offload plans)
    cpu_optimizer_rate: float = 0.0  # the rate that time was predicted at, parameters a second per node

    @property
    def comparable_peak_bytes(self) -> int:
        """The peak the measurement can show: without NCCL buffers when collectives were modelled."""
        return self.peak_bytes - (self.nccl_bytes if self.communication == "modelled" else 0)

    @property
    def comparable_step_seconds(self) -> float:
        """The step the measurement timed: without communication when collectives took no time."""
        return self.step_seconds_without_communication if self.communication == "modelled" else self.step_seconds


@cache
def uncalibrated_gpu(gpu_id: str) -> GpuSpec:
    """A catalog GPU (id or alias) as the catalog and efficiency.yaml state it, with no corrections
    from the calibration store (GpuFile.to_spec applies them; they are replaced here)."""
    files = catalog()
    if gpu_id not in files:
        gpu_id = resolve_gpu(gpu_id).id  # an alias; an unknown name raises PlannerInputError with a hint
    if gpu_id not in files:
        raise PlannerInputError(f"{gpu_id}: not a catalog GPU", hint="Calibration is kept per catalog GPU (`planner gpus`).")
    f = files[gpu_id]
    return f.to_spec().model_copy(update={"calibration": None, "efficiency": efficiency(f.id, f.architecture)})


def measured_model(m: Measurement) -> ModelSpec:
    """The architecture measured: its config.json at the measured depth (``num_hidden_layers``, or
    GPT-2's ``n_layer``, set to ``m.layers``)."""
    config = with_depth(m.config_json, m.layers)
    return spec_from_config(config, model_id=m.model, source=f"measured probe of {m.model}")


def hardware_for(m: Measurement, gpu: GpuSpec) -> HardwareSpec:
    """The plan's GPUs with the device's GPU: the target's NODES x GPUS when they hold
    ``world_size`` GPUs and fit the device's node size, else one node of ``world_size`` (or full
    nodes of it). Host RAM and network take the --gpus defaults (planner/catalog/gpus.py)."""
    nodes, per_node = 1, m.world_size
    match = _COUNTS.match(m.target_gpus or "")
    if match:
        first, second = match.groups()
        n, g = (int(first), int(second)) if second else (1, int(first))
        if n * g == m.world_size and g <= gpu.max_gpus_per_node:
            nodes, per_node = n, g
    if per_node > gpu.max_gpus_per_node:
        if m.world_size % gpu.max_gpus_per_node:
            raise PlannerInputError(f"measurement of {m.model}: world size {m.world_size} does not fill whole "
                                    f"{gpu.id} nodes of {gpu.max_gpus_per_node}")
        nodes, per_node = m.world_size // gpu.max_gpus_per_node, gpu.max_gpus_per_node
    return HardwareSpec(
        gpu=gpu, nodes=nodes, gpus_per_node=per_node,
        host_memory_bytes_per_node=default_host_memory_bytes(gpu, per_node),
        inter_node_bytes_per_s=DEFAULT_INTER_NODE_GBPS_PER_GPU * per_node * 1e9 / 8,
    )


def training_config(m: Measurement) -> TrainingConfig:
    try:
        return TrainingConfig.model_validate(m.config)
    except ValidationError as e:
        raise PlannerInputError(f"measurement of {m.model}: unusable plan: {e.errors()[0]['msg']}") from None


def predict(m: Measurement, gpu: GpuSpec | None = None) -> Prediction:
    """Evaluate the measurement's plan on ``gpu`` (default: the device's uncalibrated catalog spec).

    allocated: planner/core/ledger.py ``allocated_peak`` (torch.cuda.max_memory_allocated sees
    neither the context, the allocator's pools, nor CUDA managed memory).
    The step time without communication drops the "communication" time rows and resolves the rest
    again (planner/core/timing.py): under a fake process group collectives return at once."""
    gpu = gpu or uncalibrated_gpu(m.device_gpu)
    hardware = hardware_for(m, gpu)
    config = training_config(m)
    ev = evaluate(measured_model(m), hardware, config)
    context_rows = sum(r.bytes for r in ev.ledger.of("cuda_context"))
    pools = sum(r.bytes for r in ev.ledger.of("allocator_reserve") if r.label != FRAGMENTATION_LABEL)
    nccl = context_rows - runtime_reserves(hardware)[0]
    quiet = replace(ev.timing, rows=[r for r in ev.timing.rows if r.term != "communication"])
    return Prediction(
        gpu=gpu.id, nodes=hardware.nodes, gpus_per_node=hardware.gpus_per_node,
        allocated_bytes=allocated_peak(ev.ledger.rows, ev.paged), pool_bytes=pools, peak_bytes=ev.peak, nccl_bytes=nccl,
        step_seconds=ev.step_seconds, step_seconds_without_communication=step_seconds(quiet, config.grad_accum),
        communication=m.communication, engine=str(ev.ctx.engine),
        cpu_optimizer_seconds=sum(r.seconds for r in ev.timing.rows if r.term == "cpu_optimizer_step"),
        cpu_optimizer_rate=cpu_optimizer_rate(hardware, ev.ctx.engine),
    )


def fit_fragmentation(rows: Sequence[Measurement]) -> float | None:
    """The caching allocator's base reserve as a fraction of its allocated peak: the median over
    rows of (max_reserved_bytes - max_allocated_bytes - the engines' stream pools) /
    max_allocated_bytes less what the row's techniques add (strategies ``reserve_extra``), in [0, 1].

    Unit: a fraction. Assumption: the reserve (block rounding, split and cached segments, the
    techniques' own pools) grows with the allocated peak, as planner/cost/overheads.py
    FRAGMENTATION_FRACTION and the strategies' ``reserve`` assume; the median keeps one odd run
    from moving it. Source: torch.cuda.max_memory_reserved / max_memory_allocated (PyTorch "CUDA
    semantics", memory management). None with fewer than MIN_ROWS rows."""
    ratios = [(m.max_reserved_bytes - m.max_allocated_bytes - predict(m).pool_bytes) / m.max_allocated_bytes
              - reserve_extra(training_config(m)) for m in rows if m.max_reserved_bytes is not None and m.max_allocated_bytes]
    return min(1.0, max(0.0, median(ratios))) if len(ratios) >= MIN_ROWS else None


def fit_context(rows: Sequence[Measurement]) -> int | None:
    """Bytes per process beyond the allocator's reserved peak: the median over rows of
    (driver_used_bytes - max_reserved_bytes), at least 0.

    Unit: bytes per GPU. It holds the CUDA context, loaded kernel modules, and library workspaces
    and handles the caching allocator does not own. Assumptions: it does not depend on the plan
    (the median over plans); NCCL buffers are *not* in it (multi-GPU plans are measured under a
    fake process group; planner/cost/overheads.py NCCL_BYTES stays an assumption). probes/measured.py
    reads the driver's per-process figure (NVML / nvidia-smi, else the device's used memory less
    what was used before), subtracts the reserved bytes of that instant and adds the reserved peak:
    so driver_used - reserved peak is that context. Memory the driver keeps for itself outside
    any process (nvidia-smi total less CUDA's total, ~0.6 GiB on an A100-40, which
    the assumed context includes) is not in a per-process reading: the probe records
    it as driver_reserved_bytes (the catalog's memory, which is nvidia-smi's total, less
    cudaMemGetInfo's total) and it is added here, because the planner compares peaks with the
    catalog's memory. Source: NVML process usage vs torch.cuda.max_memory_reserved;
    cudaMemGetInfo. None with fewer than MIN_ROWS rows."""
    extra = [m.driver_used_bytes - m.max_reserved_bytes + (m.driver_reserved_bytes or 0) for m in rows
             if m.driver_used_bytes is not None and m.max_reserved_bytes is not None]
    return max(0, round(median(extra))) if len(extra) >= MIN_ROWS else None


def solve_flops_scale(m: Measurement, gpu: GpuSpec, fixed: dict[str, float], dtype: str) -> tuple[float, bool]:
    """The factor k on ``gpu``'s achieved FLOP/s in ``dtype`` (with ``fixed`` factors for the other
    dtypes) at which the predicted step equals the measured median step: (k, clamped).

    Unit: a dimensionless factor on GpuSpec.efficiency (gemm[dtype]; attention too for a 16-bit
    dtype), applied exactly as the store's corrections are (``apply``: fractions capped at 1).
    Method: bisection on log k in SCALE_BOUNDS; the predicted step never rises as k grows (faster
    compute, a roofline max and an unchanged dispatch floor). A measured step slower than the
    prediction at the lower bound, or faster than at the upper one, clamps k to that bound.
    The prediction leaves out communication when it was modelled (fake process group)."""
    target = m.median_step_seconds
    if target is None:
        raise ValueError("a measurement without step times fits no rate")

    def seconds(k: float) -> float:
        return predict(m, scaled(gpu, fixed | {dtype: k})).comparable_step_seconds

    lo, hi = log(SCALE_BOUNDS[0]), log(SCALE_BOUNDS[1])
    if target >= seconds(exp(lo)):
        return SCALE_BOUNDS[0], True
    if target <= seconds(exp(hi)):
        return SCALE_BOUNDS[1], True
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if seconds(exp(mid)) > target:
            lo = mid
        else:
            hi = mid
    return exp((lo + hi) / 2), False


def solve_cpu_optimizer_rate(m: Measurement, p: Prediction) -> float | None:
    """The host's optimizer-step rate inside the measurement's engine at which the predicted step
    equals the measured median step: parameters a second per node, or None when the plan has no
    step on the host, or the measured step is not longer than everything else predicted.

    Unit: parameters a second per node (planner/cost/overheads.py
    CPU_OPTIMIZER_PARAMS_PER_SECOND_PER_NODE). Method: closed form. The CPU step is one serial row
    (strategies/offload.py: trained parameters x ranks per node / rate), exposed whole, so the
    measured CPU seconds are the measured step less the rest of the prediction, and the rate
    scales inversely with them. It holds what the engine does on the host around the update
    (DeepSpeed's fp32 gradient copy and the 16-bit parameters written back), which a bare
    optimizer benchmark does not."""
    t = m.median_step_seconds
    if not t or p.cpu_optimizer_seconds <= 0:
        return None
    on_host = t - (p.comparable_step_seconds - p.cpu_optimizer_seconds)
    return p.cpu_optimizer_rate * p.cpu_optimizer_seconds / on_host if on_host > 0 else None


def scaled(gpu: GpuSpec, flops_scale: dict[str, float]) -> GpuSpec:
    """``gpu`` with FLOP/s factors only (the memory assumptions stay), as ``apply`` puts them."""
    return apply(gpu, Corrections(gpu=gpu.id, software="", measurements=1, flops_scale=flops_scale, fitted_at=""))


class _Group:
    """One GPU's ok measurements: their uncalibrated predictions and per-row FLOP/s factors,
    cached, because the leave-one-out refits reuse them."""

    def __init__(self, gpu: GpuSpec, rows: list[Measurement]) -> None:
        self.gpu, self.rows = gpu, rows
        self.dtypes = [FIT_DTYPE[training_config(m).precision] for m in rows]
        self.before = [predict(m, gpu) for m in rows]
        self._solved: dict[tuple, tuple[float, bool]] = {}

    def timed(self, i: int) -> bool:
        """A timed row whose step is the GPU's: plans with an optimizer step on the host fit that
        rate instead (their step is mostly the CPU's)."""
        return bool(self.rows[i].median_step_seconds) and not self.before[i].cpu_optimizer_seconds

    def host_stepped(self, i: int) -> bool:
        """A timed row whose optimizer steps on the host: it fits the CPU step's rate."""
        return bool(self.rows[i].median_step_seconds) and self.before[i].cpu_optimizer_seconds > 0

    def fit(self, subset: Sequence[int]) -> tuple[Corrections, int]:
        """Corrections fitted on the rows in ``subset`` (no report), and how many rows were clamped."""
        rows = [self.rows[i] for i in subset]
        scales: dict[str, float] = {}
        clamped = 0
        for dtype in DTYPE_ORDER:
            idx = [i for i in subset if self.dtypes[i] == dtype and self.timed(i)]
            if len(idx) < MIN_ROWS:
                continue
            solved = [self._solve(i, dict(scales)) for i in idx]
            scales[dtype] = median(k for k, _ in solved)
            clamped += sum(c for _, c in solved)
        return Corrections(gpu=self.gpu.id, software="", measurements=max(1, len(rows)),
                           context_bytes=fit_context(rows), fragmentation_fraction=fit_fragmentation(rows),
                           flops_scale=scales, cpu_optimizer_params_per_s=self._cpu_rates(subset, scales),
                           fitted_at=""), clamped

    def _cpu_rates(self, subset: Sequence[int], scales: dict[str, float]) -> dict[str, float]:
        """Per engine, the median over its offload rows of the CPU step's rate
        (``solve_cpu_optimizer_rate``), each predicted with the FLOP/s factors just fitted; one
        row suffices (its step is already the median of the measured steps)."""
        gpu = scaled(self.gpu, scales)
        by_engine: dict[str, list[float]] = {}
        for i in subset:
            if self.host_stepped(i):
                p = predict(self.rows[i], gpu)
                rate = solve_cpu_optimizer_rate(self.rows[i], p)
                if rate is not None:
                    by_engine.setdefault(p.engine, []).append(rate)
        return {engine: median(r) for engine, r in sorted(by_engine.items())}

    def _solve(self, i: int, fixed: dict[str, float]) -> tuple[float, bool]:
        key = (i, tuple(sorted(fixed.items())))
        if key not in self._solved:
            self._solved[key] = solve_flops_scale(self.rows[i], self.gpu, fixed, self.dtypes[i])
        return self._solved[key]


def measured_peak_bytes(m: Measurement, context_bytes: int) -> int | None:
    """The per-GPU peak the process took of the GPU's memory: driver_used_bytes plus what the
    driver keeps outside any process (driver_reserved_bytes) when read, else the allocator's
    reserved peak plus ``context_bytes`` (the fitted context, or the assumption)."""
    if m.driver_used_bytes is not None:
        return m.driver_used_bytes + (m.driver_reserved_bytes or 0)
    return m.max_reserved_bytes + context_bytes if m.max_reserved_bytes is not None else None


def relative_errors(m: Measurement, p: Prediction, context_bytes: int | None) -> tuple[float | None, float | None]:
    """Absolute relative errors (memory, time) of a prediction against a measurement:
    |predicted - measured| / measured, for the peak bytes and the median step seconds (None where
    the measurement lacks the figure). Both sides leave out what a fake process group does not
    have (NCCL buffers, communication time)."""
    context = context_bytes if context_bytes is not None else overheads.cuda_context_bytes(uncalibrated_gpu(m.device_gpu))
    peak = measured_peak_bytes(m, context)
    memory = abs(p.comparable_peak_bytes - peak) / peak if peak else None
    t = m.median_step_seconds
    time = abs(p.comparable_step_seconds - t) / t if t else None
    return memory, time


def _summary(report: dict, prefix: str, when: str, values: list[float | None]) -> None:
    present = [v for v in values if v is not None]
    report[f"{prefix}_median_error_{when}"] = median(present) if present else None
    report[f"{prefix}_worst_error_{when}"] = max(present) if present else None


def fit_gpu(gpu_id: str, rows: Sequence[Measurement]) -> Corrections:
    """Fit one GPU's corrections on its ok measurements and report the errors: before (the
    assumptions), after (the fitted corrections, in sample) and leave-one-out (each row predicted
    from a fit on the others: the honest figure)."""
    rows = list(rows)
    group = _Group(uncalibrated_gpu(gpu_id), rows)
    everything = range(len(rows))
    fitted, clamped = group.fit(everything)
    after = apply(group.gpu, fitted)
    report: dict[str, float | int | dict[str, int] | None] = {
        "rows": len(rows),
        "memory_rows": sum(measured_peak_bytes(m, 0) is not None for m in rows),
        "context_assumed": overheads.cuda_context_bytes(group.gpu),
        "time_rows": sum(group.timed(i) for i in everything),
        "time_rows_clamped": clamped,
    }
    for dtype in DTYPE_ORDER:
        report[f"time_rows_{dtype}"] = sum(group.dtypes[i] == dtype and group.timed(i) for i in everything)
    report["cpu_rows"] = dict(Counter(group.before[i].engine for i in everything if group.host_stepped(i)))
    runs = {"before": [relative_errors(m, p, None) for m, p in zip(rows, group.before, strict=False)],
            "after": [relative_errors(m, predict(m, after), fitted.context_bytes) for m in rows],
            "loo": []}
    for i, m in enumerate(rows):
        others, _ = group.fit([j for j in everything if j != i]) if len(rows) > 1 else (None, 0)
        runs["loo"].append(relative_errors(m, predict(m, apply(group.gpu, others)), others.context_bytes if others else None))
    for when, pairs in runs.items():
        _summary(report, "memory", when, [mem for mem, _ in pairs])
        _summary(report, "time", when, [t for _, t in pairs])
    software = Counter(m.software_key for m in rows).most_common(1)[0][0]
    return fitted.model_copy(update={
        "software": software, "measurements": len(rows), "report": report,
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
    })


def fit(measurements: Sequence[Measurement]) -> list[Corrections]:
    """Corrections per device GPU (sorted by id) from the measurements with status "ok"; CPU runs
    are skipped. A GPU with no ok measurement gets none."""
    groups: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.status == "ok" and m.device_gpu != "cpu":
            groups.setdefault(m.device_gpu, []).append(m)
    return [fit_gpu(gpu, rows) for gpu, rows in sorted(groups.items())]


# --- the command ------------------------------------------------------------------------------

EXIT_FITTED = 0
EXIT_NOTHING_TO_FIT = 1
NO_MEASUREMENTS_HINT = ("Run `planner probe --fidelity measured` on a GPU first: it records its measurements in the "
                        f"calibration store (${ENV}, or pass --store PATH).")


def calibrate(request: CalibrateRequest) -> CalibrateResult:
    """Fit every device GPU's corrections from the store's measurements and save them there
    (unless ``dry_run``). Raises PlannerInputError when there is no store or nothing was measured."""
    if request.store is None:
        raise PlannerInputError(f"no calibration store: --store is off (or ${ENV} is)",
                                hint=f"Pass --store PATH, or point ${ENV} at the store file.\n{NO_MEASUREMENTS_HINT}")
    path = Path(request.store).expanduser()
    if not path.is_file():
        raise PlannerInputError(f"no calibration store at {path}", hint=NO_MEASUREMENTS_HINT)
    store = CalibrationStore(path)
    gpu = _catalog_id(request.gpu) if request.gpu else None
    measurements = store.measurements(gpu)
    if not measurements:
        others = sorted({m.device_gpu for m in store.measurements()}) if gpu else []
        elsewhere = f" (it holds measurements of {', '.join(others)})" if others else ""
        raise PlannerInputError(f"no measurements{f' of {gpu}' if gpu else ''} in {path}{elsewhere}",
                                hint=NO_MEASUREMENTS_HINT)
    corrections = [c.model_copy(update={"host_rates": store.host_rates(c.gpu)}) for c in fit(measurements)]
    if not request.dry_run:
        for c in corrections:
            store.save_corrections(c)
    default = request.default_store
    return CalibrateResult(
        store=str(path), measurements=len(measurements),
        ok_measurements=sum(m.status == "ok" and m.device_gpu != "cpu" for m in measurements),
        corrections=corrections, saved=bool(corrections) and not request.dry_run,
        in_use=default is not None and default.expanduser().resolve() == path.resolve(),
    )


def _catalog_id(name: str) -> str:
    return name if name in catalog() else resolve_gpu(name).id


__all__ = ["CalibrateRequest", "CalibrateResult", "Prediction", "calibrate", "fit", "fit_context",
           "fit_fragmentation", "fit_gpu", "predict", "solve_flops_scale", "uncalibrated_gpu"]
