"""``planner probe --fidelity measured`` and ``planner suggest --probe K``: measure plans on this
machine's GPU, set them beside the analytic model, keep them in the calibration store.

The plan's GPU and this machine's may differ: memory figures transfer (the allocator is capped
at the plan's GPU memory), step times are this device's. Sharded plans run as one rank under a
fake process group: their communication time is modelled, not measured, and the comparison
leaves it out of the prediction (and NCCL's buffers out of the predicted peak).
"""

import json
import statistics
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ConfigDict

from planner.catalog.calibration import CalibrationStore, Measurement
from planner.core.errors import PlannerInputError
from planner.core.ledger import allocated_peak
from planner.core.record import Record
from planner.probes.device import NO_GPU_HINT, DeviceInfo, catalog_gpu, local_device
from planner.probes.gpu_readings import unified_resident_bytes
from planner.probes.measured import MeasureRequest, MeasureResult, measure
from planner.probes.unprobed import refuse_method, refuse_ring, refuse_tensor_parallel
from planner.runtime.sharding import refuse_fsdp1
from planner.schema.estimate import EstimateResult
from planner.schema.suggest import SuggestResult
from planner.strategies import TrainingConfig

#: Agreement bands: the issue's targets for one plan (peak memory within 10 % worst case, step
#: time within 15 %).
MEMORY_BAND, TIME_BAND = 0.10, 0.15


class MeasuredComparison(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    gpus: str  # the plan's
    device: str  # the GPU measured on, as the driver names it
    device_gpu: str  # its catalog id
    config: TrainingConfig
    layers: int | None  # measured depth (None: full depth, or extrapolated to it)
    extrapolated_from: list[int]
    status: str
    message: str
    where: str
    predicted_fits: bool
    predicted_peak_bytes: int  # less NCCL under a fake process group
    predicted_allocated_bytes: int  # torch's allocated peak (planner/core/ledger.py allocated_peak)
    predicted_step_seconds: float  # less communication under a fake process group
    modelled_communication_seconds: float
    measured_peak_bytes: int | None  # driver-seen (driver reserve + context + reserved peak), else reserved + predicted
    # context; with paged state resident on the GPU added (probes/gpu_readings.py)
    measured_allocated_bytes: int | None
    measured_reserved_bytes: int | None
    measured_step_seconds: float | None
    tokens_per_second: float | None  # this rank's
    mfu: float | None
    memory_error: float | None  # (predicted - measured) / measured
    time_error: float | None
    agrees: bool
    verdict: str
    notes: list[str]
    stored: str | None  # the calibration store written to
    measurement: MeasureResult


def require_gpu(timeout: float = 180.0) -> DeviceInfo:
    device = local_device(timeout)
    if not device.available:
        raise PlannerInputError(f"no GPU for a measured probe: {device.message}", hint=NO_GPU_HINT)
    return device


def measure_plan(plan: EstimateResult, model_ref: str, config_json: dict, device: DeviceInfo, *,
                 layers: int | None = None, extrapolate_from: list[int] | None = None, warmup_steps: int = 2,
                 steps: int = 5, timeout: float = 900.0, runner=measure, device_kind: str = "cuda",
                 store: Path | None = None, timed: bool = True, allocator_conf: str | None = None) -> MeasuredComparison:
    """Measure one plan (``plan``: its analytic estimate at full depth), compare, and keep every run
    in the calibration ``store`` (None: keep nothing). ``runner`` is ``probes.measured.measure``
    (or ``measure_forked``; tests pass a CPU runner); each run gets ``timeout`` seconds.
    ``timed=False``: the run's step times say nothing about the plan's (fp8 run eager where the
    launch compiles; a paged state that would spill on the plan's smaller card does not here), so
    the store keeps its memory and no step times, and the calibration fits no speed to it.
    ``allocator_conf``: the run's PYTORCH_CUDA_ALLOC_CONF where it is not the launch's (None); such a
    run is not the plan's, and the store keeps nothing of it (the calibration fits the launch's
    allocator)."""
    from planner.catalog.models import resolve_model
    from planner.cost import compute
    from planner.engine.estimate import estimate_config
    from planner.probes.extrapolate import extrapolate_runs

    c = plan.config
    spec = resolve_model(model_ref)
    hardware = _hardware(plan)
    world = plan.hardware.num_gpus
    sharded = c.sharding.startswith(("fsdp", "zero"))
    # fsdp-hybrid shards inside a node and replicates across nodes: one rank holds what a node's
    # fully sharded rank holds
    ranks = plan.hardware.gpus_per_node if c.sharding == "fsdp-hybrid" else world
    depths = sorted(extrapolate_from or [])
    device_gpu = catalog_gpu(device.name, device.total_bytes) if device_kind == "cuda" else "cpu"
    # the plan's GPU offers its memory less what its driver keeps (taken as this device's share)
    reserve = _driver_reserved(device_gpu, device.total_bytes)
    base = dict(config_json=config_json, config=c, world_size=ranks if sharded else 1,
                warmup_steps=warmup_steps, timed_steps=steps, device=device_kind,
                memory_cap_bytes=plan.hardware.gpu_memory_bytes - reserve if device_kind == "cuda" else None,
                unified_bytes=plan.paged.state_bytes if plan.paged else 0,
                deepspeed_config=_deepspeed_config(plan) if c.sharding.startswith("zero") else None)
    if allocator_conf is not None:
        base["allocator_conf"] = allocator_conf
    calibration = CalibrationStore(store) if store is not None and allocator_conf is None else None
    runs: list[tuple[int | None, MeasureResult]] = []
    todo: list[int | None] = [*depths] or [layers]
    for depth in todo:
        result = runner(MeasureRequest(**base, layers=depth), timeout)
        runs.append((depth, result))
        if calibration is not None:
            flops = compute.model_flops_per_token(spec.model_copy(update={"num_layers": depth or spec.num_layers}), c.seq_len)
            kept = result if timed else result.model_copy(update={"step_seconds": []})
            calibration.add(_measurement(model_ref, config_json, depth, c, ranks if sharded else 1, plan, device,
                                   device_gpu, kept, flops))
    if depths:
        result, layers = extrapolate_runs([(d, r) for d, r in runs if d is not None], spec.num_layers), None
        result = _over_capacity(result, plan.hardware.gpu_memory_bytes, device_gpu)
    else:
        result = runs[0][1]
    at_depth = plan if layers is None else estimate_config(
        spec.model_copy(update={"num_layers": layers}), hardware, c,
        1 - plan.usable_bytes / plan.hardware.gpu_memory_bytes)
    return compare(at_depth, model_ref, device, device_gpu, layers, depths, world > 1, result,
                    str(calibration.path) if calibration is not None else None)


def compare(plan: EstimateResult, model_ref: str, device: DeviceInfo, device_gpu: str, layers: int | None,
             depths: list[int], modelled: bool, m: MeasureResult, stored: str | None) -> MeasuredComparison:
    """``modelled``: the plan has several GPUs, and one process ran (one rank under a fake process
    group, or DDP as one process): NCCL's buffers and the communication time are left out."""
    rows = plan.ledger
    nccl = sum(r.bytes for r in rows if r.term == "cuda_context" and "NCCL" in r.label) if modelled else 0
    context = sum(r.bytes for r in rows if r.term == "cuda_context") - nccl
    predicted_peak = plan.memory["peak"] - nccl
    communication = plan.time.terms.get("communication", 0.0) if modelled else 0.0
    predicted_step = plan.time.step_seconds - communication
    measured_peak = _driver_peak(m, device_gpu)
    if measured_peak is None and m.max_reserved_bytes is not None:
        measured_peak = m.max_reserved_bytes + context
    unified = unified_resident_bytes(m.readings)  # paged state on the GPU: the driver's process figure omits it
    if measured_peak is not None:
        measured_peak += unified
    step = statistics.median(m.step_seconds) if m.step_seconds else None
    tokens = plan.config.micro_batch_size * plan.config.grad_accum * plan.config.seq_len
    notes = list(m.notes)
    if modelled:
        notes.append(f"communication modelled, not measured: {communication:.4f} s of the analytic step is left out")
    if plan.hardware.gpu != device_gpu:
        notes.append(f"measured on {device.name or device_gpu} for a plan on {plan.hardware.gpu}: memory transfers "
                     "(the allocator was capped at the plan's GPU memory); step times are this device's")
    memory_error = _error(predicted_peak, measured_peak)
    time_error = _error(predicted_step, step)
    if m.status == "ok":
        agrees = (memory_error is None or abs(memory_error) <= MEMORY_BAND) and (
            time_error is None or abs(time_error) <= TIME_BAND)
        verdict = "AGREE" if agrees else "DIFFER"
    elif m.status == "oom":
        agrees = not plan.fits
        verdict = "OOM, as predicted" if agrees else "OOM, but the plan was predicted to fit"
        needed = allocated_peak(rows, plan.paged)
        if plan.fits and m.allocator_limit_bytes and m.allocator_limit_bytes < needed:
            verdict = (f"OOM, inconclusive: a busy device capped the allocator at {m.allocator_limit_bytes / 2**30:.1f}"
                       f" GiB, below the plan's {needed / 2**30:.1f} GiB")
    else:
        agrees, verdict = False, f"PROBE {m.status.upper()}"
    return MeasuredComparison(
        model=model_ref, gpus=plan.hardware.spec, device=device.name, device_gpu=device_gpu, config=plan.config,
        layers=layers, extrapolated_from=depths, status=m.status, message=m.message, where=m.where,
        predicted_fits=plan.fits, predicted_peak_bytes=predicted_peak,
        predicted_allocated_bytes=allocated_peak(rows, plan.paged), predicted_step_seconds=predicted_step,
        modelled_communication_seconds=communication, measured_peak_bytes=measured_peak,
        measured_allocated_bytes=m.max_allocated_bytes, measured_reserved_bytes=m.max_reserved_bytes,
        measured_step_seconds=step, tokens_per_second=tokens / step if step else None,
        mfu=_mfu(plan.time.model_flops_per_token * tokens, plan.config.precision, device_gpu, step),
        memory_error=memory_error, time_error=time_error, agrees=agrees,
        verdict=verdict, notes=notes, stored=stored, measurement=m)


def _over_capacity(m: MeasureResult, capacity: int, device_gpu: str) -> MeasureResult:
    """An extrapolated run whose peak exceeds the plan's GPU memory would have run out of memory:
    it is reported as an OOM (where: "extrapolated"), as a real full-depth run would be."""
    peak = _driver_peak(m, device_gpu)
    peak = m.max_reserved_bytes if peak is None else peak
    if m.status != "ok" or peak is None or peak <= capacity:
        return m
    return m.model_copy(update={"status": "oom", "where": "extrapolated", "message": (
        f"the extrapolated peak, {peak / 2**30:.2f} GiB, exceeds the GPU's {capacity / 2**30:.2f} GiB")})


def _driver_reserved(device_gpu: str, cuda_total_bytes: int | None) -> int:
    """Bytes of the GPU's memory (the catalog's figure: nvidia-smi's total) that CUDA never
    offers (cudaMemGetInfo's total is smaller): the driver's own reservation, outside any process."""
    from planner.catalog.gpus import catalog

    gpu = catalog().get(device_gpu)
    if gpu is None or not cuda_total_bytes:
        return 0
    return max(0, gpu.memory_mib * 2**20 - cuda_total_bytes)


def _driver_peak(m: MeasureResult, device_gpu: str) -> int | None:
    """The run's peak share of the GPU's memory as the driver sees it: the process (context and
    reserved peak) plus the driver's own reservation; None without a driver reading."""
    if m.driver_used_bytes is None:
        return None
    return m.driver_used_bytes + _driver_reserved(device_gpu, m.device_total_bytes)


def _error(predicted: float, measured: float | None) -> float | None:
    return None if not measured else (predicted - measured) / measured


def _mfu(step_flops: float, precision: str, device_gpu: str, step: float | None) -> float | None:
    """Model FLOPs of this rank's step / (step seconds x the measuring GPU's dense peak in the
    plan's compute dtype), as StepTime.mfu defines it (recomputation is not model FLOPs)."""
    from planner.catalog.gpus import catalog
    from planner.strategies.precision import COMPUTE_DTYPE, Precision

    gpu = catalog().get(device_gpu)
    if gpu is None or not step:
        return None
    peak = (gpu.dense_tflops.get(COMPUTE_DTYPE[Precision(precision)]) or gpu.dense_tflops["fp32"] or 0) * 1e12
    if not peak:
        return None
    return step_flops / (step * peak)


def _hardware(plan: EstimateResult):
    return plan.hardware.parse()


def _deepspeed_config(plan: EstimateResult) -> dict:
    from planner.emit import build_files, single_plan_result

    return json.loads(build_files(single_plan_result(plan))["deepspeed_config.json"])


def _measurement(model_ref: str, config_json: dict, layers: int | None, c: TrainingConfig, world: int,
                 plan: EstimateResult, device: DeviceInfo, device_gpu: str, m: MeasureResult,
                 flops_per_token: float) -> Measurement:
    step = statistics.median(m.step_seconds) if m.step_seconds else None
    tokens = c.micro_batch_size * c.grad_accum * c.seq_len
    return Measurement(
        model=model_ref, config_json=config_json, layers=layers, config=c.model_dump(mode="json"), world_size=world,
        target_gpus=plan.hardware.spec, device_gpu=device_gpu, device_name=device.name or device_gpu,
        versions=m.versions or device.versions, status=m.status, message=(m.where + ": " + m.message)[:2000] if m.message else "",
        max_allocated_bytes=m.max_allocated_bytes, max_reserved_bytes=m.max_reserved_bytes,
        driver_used_bytes=m.driver_used_bytes, driver_method=m.driver_method,
        driver_reserved_bytes=_driver_reserved(device_gpu, m.device_total_bytes), alloc_retries=m.alloc_retries,
        num_ooms=m.num_ooms, step_seconds=m.step_seconds, median_step_seconds=step,
        tokens_per_second=tokens / step if step else None,
        mfu=_mfu(flops_per_token * tokens, c.precision, device_gpu, step),
        communication="modelled" if world > 1 else "none", created=datetime.now(UTC).isoformat(timespec="seconds"))


def plan_fields(path, rank: int) -> dict:
    """``model``, ``gpus`` and the training configuration of the plan at ``rank`` of a plan file
    (``planner suggest --json``, an emitted plan.json, ``planner estimate --json``)."""
    from planner.emit import load_plan_file

    search = load_plan_file(path)
    if not 1 <= rank <= len(search.plans):
        raise PlannerInputError(f"--rank {rank}: {path} holds {len(search.plans)} plan(s)")
    plan = search.plans[rank - 1]
    return {"model": plan.model.id, "gpus": plan.hardware.spec, **plan.config.model_dump()}


def run_measured_probe(req, device: DeviceInfo | None = None) -> MeasuredComparison:
    """``planner probe --fidelity measured`` for a probes.command.ProbeRequest."""
    from planner.catalog.models import model_config
    from planner.engine.estimate import estimate

    if req.explain:
        raise PlannerInputError("--explain lists traced tensors", hint="Use it with --fidelity traced.")
    if req.extrapolate_from and (len(set(req.extrapolate_from)) not in (2, 3) or req.layers is not None):
        raise PlannerInputError("--extrapolate-from takes two or three different depths, e.g. 2,4 or 2,4,8, "
                                "and no --layers")
    plan = estimate(req)  # bad input is reported before any GPU work
    refuse_fsdp1(plan.config)
    refuse_method(plan.config)
    refuse_ring(plan.config)
    refuse_tensor_parallel(plan.config)
    device = device or require_gpu()
    if plan.config.precision == "fp8-mixed" and device.capability and float(device.capability) < 8.9:
        raise PlannerInputError(f"fp8-mixed needs compute capability 8.9+; {device.name} has {device.capability}")
    return measure_plan(plan, req.model, model_config(req.model), device, layers=req.layers,
                        extrapolate_from=req.extrapolate_from, warmup_steps=req.warmup_steps, steps=req.steps,
                        timeout=req.timeout, store=req.calibration)


class ProbedSuggestion(Record):
    """``planner suggest --probe K``: the search, and its top K plans measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suggestion: SuggestResult
    probes: list[MeasuredComparison]  # rank order
    best_rank: int | None  # 1-based rank of the fastest measured plan that ran (None: none ran)

    @property
    def fits(self) -> bool:
        return self.suggestion.fits


def probe_suggestion(result, k: int, device: DeviceInfo, timeout: float, runner=measure,
                     device_kind: str = "cuda", store: Path | None = None) -> ProbedSuggestion:
    """Measure the top ``k`` plans of a suggest result, best first; the winner is the one with
    the most measured tokens per second per GPU among those that ran without OOM."""
    from planner.catalog.models import model_config

    probes = []
    for plan in result.plans[:k]:
        probes.append(measure_plan(plan, plan.model.id, model_config(plan.model.id), device, timeout=timeout,
                                   runner=runner, device_kind=device_kind, store=store))
    ran = [(p.tokens_per_second, i + 1) for i, p in enumerate(probes) if p.status == "ok" and p.tokens_per_second]
    return ProbedSuggestion(suggestion=result, probes=probes, best_rank=max(ran)[1] if ran else None)
