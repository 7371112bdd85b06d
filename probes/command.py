"""``planner probe``: run a probe of one plan and set it beside the cost model.

Fidelity ``traced`` (issue 6): the real transformers model on fake tensors (probes/traced.py) in a
child process; the comparison is probes/compare.py. FSDP2 plans are traced as one rank under a fake
process group; DDP as sharding none (its gradient buckets are computed, not traced); ZeRO plans as
sharding none in 16-bit for the activations, with the rank's model states computed from the ZeRO
partition rules (the output's notes say so). The probe needs the ``[probes]`` extra
(torch, transformers); without it the command says how to install it.
"""

import importlib.util
from collections.abc import Callable

from pydantic import ConfigDict, Field

from planner.core.distribution import install_line
from planner.core.errors import PlannerInputError
from planner.core.record import Record
from planner.probes.compare import ZERO_STAGES, Comparison, uniform_state_bytes
from planner.schema.estimate import EstimateRequest
from planner.strategies import PlanContext, TrainingConfig
from planner.strategies.optimizer import Optimizer

FIDELITIES = ("traced", "measured")
EXIT_AGREE, EXIT_DISAGREE = 0, 1


class ProbeRequest(EstimateRequest):
    fidelity: str = "traced"
    layers: int | None = Field(None, ge=1)  # reduced depth (default: the model's full depth)
    timeout: float = Field(1800.0, gt=0)  # seconds for the child process
    explain: bool = False
    extrapolate_from: list[int] = []  # measured: two (or three, one a check) reduced depths, extrapolated to full depth
    warmup_steps: int = Field(2, ge=1)  # measured
    steps: int = Field(5, ge=1)  # measured: timed steps


class ProbeResult(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fidelity: str
    comparison: Comparison
    phase_peaks: dict[str, int]
    explanation: list[str]

    @property
    def agrees(self) -> bool:
        return self.comparison.agrees


def run_probe(req: ProbeRequest, tracer: Callable | None = None) -> ProbeResult:
    """Resolve the plan as ``planner estimate`` does, trace it, compare. Raises PlannerInputError for
    bad input and ProbeFailedError when the probe itself fails (crash, timeout). ``tracer`` runs the
    trace (``probes.traced.trace``'s contract; None: ``trace``, a fresh child process):
    ``planner tune`` passes a persistent worker's (probes/trace_worker.py)."""
    if req.fidelity not in FIDELITIES:
        raise PlannerInputError(f"--fidelity {req.fidelity!r} is not available",
                                hint=f"Choose one of: {', '.join(FIDELITIES)}.")
    if req.extrapolate_from:
        raise PlannerInputError("--extrapolate-from is for --fidelity measured",
                                hint="Trace a reduced depth with --layers N.")
    # installed, not imported: the trace runs in a child that imports them (1.2 s here saved per probe)
    if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
        raise PlannerInputError("the traced probe needs torch and transformers",
                                hint=f"Install the probe extra: {install_line(['probes'])} (torch first, CPU build).")
    if tracer is not None:
        return _run_probe(req, tracer)
    from planner.probes.trace_worker import TraceWorker

    with TraceWorker() as worker:
        worker.start()  # its child imports torch and transformers while this process resolves the plan
        return _run_probe(req, worker.trace)


def _run_probe(req: ProbeRequest, tracer: Callable) -> ProbeResult:
    from planner.catalog.models import model_config, resolve_model
    from planner.engine.estimate import check_config, resolve_config
    from planner.probes.compare import compare_result, compare_zero_result
    from planner.probes.traced import TraceRequest
    from planner.probes.unprobed import refuse_method, refuse_ring
    from planner.runtime.sharding import refuse_fsdp1

    spec = resolve_model(req.model)
    hardware = req.hardware()
    config = resolve_config(req, spec, hardware)
    refuse_fsdp1(config)
    refuse_method(config)
    refuse_ring(config)
    if config.sharding == "fsdp-hybrid":
        raise PlannerInputError("--sharding fsdp-hybrid is not traced",
                                hint="Trace fsdp on one node's GPU count: one rank's memory is the same.")
    if config.offload != "none":
        raise PlannerInputError("offload is not traced", hint="Trace the plan with --offload none.")
    if str(getattr(config, "checkpoint_offload", "none")) != "none":
        raise PlannerInputError("--checkpoint-offload is not traced: on the CPU the host copies live where the GPU's "
                                "tensors would", hint="Trace the plan with --checkpoint-offload none: its GPU rows "
                                                      "are the same but the checkpointed inputs.")
    if config.adapter == "lora-int8":
        raise PlannerInputError("--adapter lora-int8 is not traced: bitsandbytes' int8 matmuls do not run on fake "
                                "tensors, and they keep other tensors than the 16-bit base a trace would run",
                                hint="Probe it on a GPU (--fidelity measured), or trace --adapter qlora or lora.")
    if str(getattr(config, "kbit_prep", "none")) != "none":
        raise PlannerInputError(f"--kbit-prep {config.kbit_prep} is not traced: the trace's 16-bit stand-ins for "
                                "bitsandbytes' 4-bit layers return their outputs in 16 bit, where Linear4bit returns "
                                "them in its fp32 input's dtype",
                                hint="Probe it on a GPU (--fidelity measured), or trace --kbit-prep none.")
    if config.grad_accum != 1:
        raise PlannerInputError("--grad-accum is not traced", hint="Trace one micro-batch (--grad-accum 1).")
    zero = config.sharding in ZERO_STAGES
    if zero and uniform_state_bytes(config.optimizer) is None:
        uniform = [str(o) for o in Optimizer if uniform_state_bytes(o) is not None]
        raise PlannerInputError(f"--optimizer {config.optimizer} with ZeRO is not probed",
                                hint=f"Use one of {', '.join(uniform)} with ZeRO.")
    refused = check_config(PlanContext(spec, hardware, config), first_only=True).infeasible
    if refused:  # a plan planner refuses is not traced as something else (a split it cannot make, ...)
        raise PlannerInputError(f"the plan is refused, so not probed: {refused[0]}"[:600],
                                hint="Probe a plan `planner estimate` accepts with the same flags.")
    traced_config, world = config, hardware.num_gpus
    if zero or config.sharding == "ddp":
        # one rank runs the whole model: sharding none (DeepSpeed's module is 16-bit)
        sixteen = zero and config.precision in ("bf16-mixed", "fp16-mixed")
        traced_config = TrainingConfig(**(config.model_dump() | {"sharding": "none"}
                                          | ({"precision": "bf16-pure"} if sixteen else {})))
        world = 1
    traced = tracer(TraceRequest(config_json=model_config(req.model), config=traced_config, world_size=world,
                                layers=req.layers, explain=req.explain), timeout=req.timeout)
    compare = compare_zero_result if zero else compare_result
    gpu = hardware.gpu.file or hardware.gpu.id  # (a user GPU file by its path: its id is not the catalog's)
    comparison = compare(req.model, config, hardware.num_gpus, req.layers, traced, gpu=gpu, spec=spec)
    return ProbeResult(fidelity=req.fidelity, comparison=comparison, phase_peaks=traced.phase_peaks,
                       explanation=traced.explanation)
