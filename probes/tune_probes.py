"""The probes ``planner tune`` spends (planner/engine/tune.py takes them as functions):

- measured (a GPU on this machine): a short real run (probes/measured_command.py); the step is the
  measured one plus the analytic model's exposed communication, because sharded plans run as one
  rank under a fake process group whose collectives take no time;
- traced (no GPU): the real model on fake tensors for the memory (probes/command.py), the analytic
  model for the time: the traced peak replaces the ledger's traced part, the context, NCCL and
  allocator reserve stay analytic. Plans the trace refuses (fsdp-hybrid, offload) are evaluated
  analytically and say so; gradient accumulation is traced as one micro-batch (the peak is the same);
  the trials share one trace child (probes/trace_worker.py: imports paid once, not per trial);
- analytic: the cost model itself (for tests and dry runs: its best is ``suggest``'s best).
"""

import importlib.util

from planner.core.distribution import install_line
from planner.core.errors import PlannerInputError, ProbeFailedError
from planner.schema.estimate import EstimateResult
from planner.schema.tune import ProbeOutcome


def analytic_probe(plan: EstimateResult) -> ProbeOutcome:
    return ProbeOutcome(fidelity="analytic", status="ok", peak_bytes=plan.memory["peak"],
                        step_seconds=plan.time.step_seconds)


def traced_probe(timeout: float):
    import atexit

    from planner.probes.command import ProbeRequest, run_probe
    from planner.probes.trace_worker import TraceWorker

    worker = TraceWorker()
    atexit.register(worker.close)

    def probe(plan: EstimateResult) -> ProbeOutcome:
        fields = plan.config.model_dump() | {"grad_accum": 1}
        try:
            result = run_probe(ProbeRequest(model=plan.model.id, gpus=plan.hardware.spec, timeout=timeout, **fields),
                               tracer=worker.trace)
        except PlannerInputError as e:  # not traceable: the analytic figures, marked as such
            return analytic_probe(plan).model_copy(update={"message": f"not traced ({e.problems[0]}): analytic"})
        except ProbeFailedError as e:
            status = "timeout" if "timed out" in str(e) else "error"
            return ProbeOutcome(fidelity="traced", status=status, message=str(e)[-1000:])
        terms = {t.term: t for t in result.comparison.terms}
        peak = terms.get("step_peak") or terms["activations"]
        return ProbeOutcome(fidelity="traced", status="ok", peak_bytes=plan.memory["peak"] + peak.traced - peak.analytic,
                            step_seconds=plan.time.step_seconds,
                            message="traced memory, analytic time")

    return probe


def measured_probe(device, timeout: float, store=None):
    from planner.catalog.models import model_config
    from planner.probes.measured_command import measure_plan

    def probe(plan: EstimateResult) -> ProbeOutcome:
        r = measure_plan(plan, plan.model.id, model_config(plan.model.id), device, timeout=timeout, store=store)
        step = r.measured_step_seconds + r.modelled_communication_seconds if r.measured_step_seconds else None
        message = r.message or ("communication modelled" if r.modelled_communication_seconds else "")
        return ProbeOutcome(fidelity="measured", status=r.status, peak_bytes=r.measured_peak_bytes, step_seconds=step,
                            message=message)

    return probe


def choose(fidelity: str, timeout: float, store=None):
    """(fidelity, probe, notes) for ``--fidelity``: auto is measured with a GPU, else traced.
    Measured probes are kept in the calibration ``store`` (None: nowhere)."""
    from planner.probes.device import local_device
    from planner.probes.measured_command import require_gpu

    if fidelity == "analytic":
        return "analytic", analytic_probe, ["analytic fidelity: the cost model's own figures, nothing probed"]
    if fidelity == "measured":
        return "measured", measured_probe(require_gpu(), timeout, store), []
    if fidelity == "auto":
        device = local_device()
        if device.available:
            return "measured", measured_probe(device, timeout, store), []
    if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
        if fidelity == "traced":
            raise PlannerInputError("the traced fidelity needs torch and transformers",
                                    hint=f"Install the probe extra: {install_line(['probes'])} (torch first, CPU build).")
        return "analytic", analytic_probe, ["no GPU and no torch here: the analytic model's figures, nothing probed "
                                            f"({install_line(['probes'])} for the traced fidelity)"]
    return "traced", traced_probe(timeout), [
        "no GPU on this machine: memory from the traced fidelity (fake tensors), time from the analytic model"
        if fidelity == "auto" else "traced fidelity: memory traced, time analytic"]
