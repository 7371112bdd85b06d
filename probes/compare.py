"""Analytic against traced: the cost model's ledger next to the traced step, term by term.

Compared (bytes per GPU, one rank):
- parameters, gradients, optimizer states: must agree exactly;
- activations: the forward phase (end of forward and start of backward, up to the last decoder
  layer's backward) less the parameters and optimizer states held through it: saved activations,
  autocast weight casts, gathered FSDP parameters, the loss and the head's backward;
- each phase's peak (forward, backward, backward_end, step: planner/core/ledger.py), and the step peak (the largest).
What a trace cannot see is left out of the analytic side: the CUDA context and NCCL, the
allocator's fragmentation reserve, QLoRA's dequantized weight, and DDP/ZeRO communication
buckets (DDP and ZeRO do not run under the trace; FSDP2's all-gather and reduce-scatter buffers
do, and are compared). Model states of ZeRO plans are computed, not traced (probes/traced.py).
"""

from pydantic import ConfigDict

from planner.core.ledger import Location, Phase
from planner.core.ledger import phase_sum as ledger_phase_sum
from planner.core.ledger import resident as ledger_resident
from planner.core.record import Record
from planner.strategies import TrainingConfig
from planner.strategies.adapter import NF4_DEQUANTIZED

UNTRACED = frozenset({"cuda_context", "allocator_reserve"})  # and DDP / ZeRO buckets (not traced)
UNTRACED_ROWS = frozenset({NF4_DEQUANTIZED})  # QLoRA's dequantized weight: bitsandbytes does not run on fake tensors
STATES = {"parameters": ("weights", "master_weights"), "gradients": ("gradients",),
          "optimizer_states": ("optimizer_states",)}
TOLERANCE = 0.05  # issue 6: transients and the step peak within 5 %


class TermComparison(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    term: str
    analytic: int
    traced: int
    exact: bool  # must agree to the byte (else within TOLERANCE)
    source: str = "traced"  # or "computed" (ZeRO model states: partition rules, not traced)

    @property
    def error(self) -> float:
        """(analytic - traced) / traced: positive when the cost model over-estimates."""
        return (self.analytic - self.traced) / self.traced if self.traced else float(self.analytic != 0)

    @property
    def agrees(self) -> bool:
        return self.analytic == self.traced if self.exact else abs(self.error) <= TOLERANCE


class Comparison(Record):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    config: TrainingConfig
    world_size: int
    layers: int | None
    terms: list[TermComparison]
    trace_seconds: float
    notes: list[str]

    @property
    def agrees(self) -> bool:
        return all(t.agrees for t in self.terms)


def analytic_result(model: str, config: TrainingConfig, world_size: int, layers: int | None, gpu: str = "H100-80",
                    spec=None):
    """The ledger of the plan (the GPU only sets capacity and speed: memory terms do not depend on it)."""
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.engine.estimate import estimate_config

    spec = spec or resolve_model(model)
    if layers is not None:
        spec = spec.model_copy(update={"num_layers": layers})
    return estimate_config(spec, parse_gpus(f"{world_size}x{gpu}"), config)


def compare_result(model: str, config: TrainingConfig, world_size: int, layers: int | None, traced,
                   gpu: str = "H100-80", spec=None) -> Comparison:
    """Set the analytic ledger of the same plan beside a TraceResult."""
    untraced = UNTRACED | ({"communication_buffers"} if not config.sharding.startswith("fsdp") else set())
    rows = [r for r in analytic_result(model, config, world_size, layers, gpu, spec).ledger
            if r.location == Location.GPU and r.term not in untraced and r.label not in UNTRACED_ROWS]

    def phase_sum(phase: Phase) -> int:
        return ledger_phase_sum(rows, phase, Location.GPU)

    traced_states = {"parameters": traced.parameters_bytes, "gradients": traced.gradients_bytes,
                     "optimizer_states": traced.optimizer_state_bytes}
    terms = [TermComparison(term=name, analytic=sum(r.bytes for r in rows if r.term in analytic_terms
                                                    and Phase.STEP in r.phases),
                            traced=traced_states[name], exact=True)
             for name, analytic_terms in STATES.items()]
    resident = traced.parameters_bytes + traced.optimizer_state_bytes  # held through the forward phase
    analytic_resident = terms[0].analytic + terms[2].analytic
    forward = phase_sum(Phase.FORWARD)
    terms.append(TermComparison(term="activations", analytic=forward - analytic_resident,
                                traced=traced.phase_peaks.get("forward", 0) - resident, exact=False))
    for p in Phase:
        if p not in traced.phase_peaks:  # a phase the step never entered (an adapter's frozen embeddings: no backward_end)
            continue
        terms.append(TermComparison(term=f"{p}_phase", analytic=phase_sum(p), traced=traced.phase_peaks[p],
                                    exact=False))
    terms.append(TermComparison(term="step_peak", analytic=max(phase_sum(p) for p in Phase),
                                traced=traced.peak_bytes, exact=False))
    ddp = ["DDP: one rank traced as sharding none; DDP's gradient buckets are not traced"] if config.sharding == "ddp" else []
    return Comparison(model=model, config=config, world_size=world_size, layers=layers, terms=terms,
                      trace_seconds=traced.seconds, notes=[*traced.notes, *ddp])


def per_layer_comparison(deep: Comparison, shallow: Comparison) -> TermComparison:
    """Activations of one decoder layer: the difference of two depths' forward phases (less the
    model states), over the difference in depth. The loss, embeddings and head cancel, so this
    checks the per-layer lists (planner.cost.activations) even where the loss dominates a shallow
    model's memory. It holds only where the forward phase peaks at the same moment at both depths
    (``same_moment`` checks the ledger; a trace whose peak moment moves shows up as a miss): the
    loss's alternative moments differ by the autocast casts the layers hold, so a switch between
    them moves the difference by a cast per layer."""
    depth = (deep.layers or 0) - (shallow.layers or 0)

    def act(c: Comparison, side: str) -> int:
        return getattr(next(t for t in c.terms if t.term == "activations"), side)

    return TermComparison(term="layer_activations", analytic=(act(deep, "analytic") - act(shallow, "analytic")) // depth,
                          traced=(act(deep, "traced") - act(shallow, "traced")) // depth, exact=False)


def same_moment(model: str, config: TrainingConfig, world_size: int, depths: tuple[int, int]) -> bool:
    """Whether the analytic forward phase peaks at the same moment at both depths: its resident rows
    carry the same labels, the layer count apart (``per_layer_comparison`` holds only then)."""
    import re

    def labels(d: int) -> set[str]:
        rows = analytic_result(model, config, world_size, d).ledger
        return {re.sub(r"\d+ layers", "N layers", r.label) for r in ledger_resident(rows, Phase.FORWARD)}

    return labels(depths[0]) == labels(depths[1])


#: ZeRO stage of each DeepSpeed sharding mode.
ZERO_STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}
def uniform_state_bytes(optimizer: str) -> int | None:
    """Optimizer state bytes per parameter where every tensor has the same (fp32 states: the
    optimizer's own state rule, strategies/optimizer.py, gives k bytes per element for a vector
    and a matrix alike), else None (8-bit blocks, factored or per-block moments)."""
    from planner.strategies.optimizer import CHOICES, Optimizer

    rule = CHOICES[Optimizer(optimizer)].states
    vector, matrix = rule(4096, (4096,), 4), rule(1 << 20, (1024, 1024), 4)
    k = vector // 4096
    return k if vector == k * 4096 and matrix == k * (1 << 20) else None


def zero_rank_states(psi: int, stage: int, world: int, optimizer: str) -> dict[str, float]:
    """One rank's model states under ZeRO (bytes), from the ZeRO paper's partition rules
    (Rajbhandari et al. 2020, Sec. 5.1; planner/cost/zero.py): 16-bit weights (partitioned from
    stage 3), fp32 master weights and optimizer states (partitioned from stage 1), 16-bit gradients
    (partitioned from stage 2), for ``psi`` parameters."""
    k = uniform_state_bytes(optimizer)
    assert k is not None, optimizer
    return {"parameters": 2 * psi / (world if stage >= 3 else 1) + 4 * psi / world,
            "gradients": 2 * psi / (world if stage >= 2 else 1),
            "optimizer_states": k * psi / world}


def compare_zero_result(model: str, config: TrainingConfig, world_size: int, layers: int | None, traced,
                        gpu: str = "H100-80", spec=None) -> Comparison:
    """A ZeRO plan beside a trace of the same model with sharding none in 16-bit (DeepSpeed runs the
    module in bf16/fp16; its fp32 master weights live in the optimizer's partition).

    Computed, not traced: the rank's model states, from the ZeRO partition rules applied to the
    traced parameter count (the ledger's rows add ZeRO-3's unpartitioned small parameters and the
    step counter; they agree within the tolerance). Traced: the activations (the forward phase less
    the traced model states). DeepSpeed's buffers (reduce buckets, ZeRO-3 gathers) are not traced,
    so phases and the step peak are not compared."""
    rows = [r for r in analytic_result(model, config, world_size, layers, gpu, spec).ledger
            if r.location == Location.GPU and r.term not in UNTRACED | {"communication_buffers"}]
    states = zero_rank_states(traced.parameters_bytes // 2, ZERO_STAGES[config.sharding], world_size, config.optimizer)
    terms = [TermComparison(term=name, analytic=sum(r.bytes for r in rows if r.term in analytic_terms
                                                    and Phase.STEP in r.phases),
                            traced=round(states[name]), exact=False, source="computed")
             for name, analytic_terms in STATES.items()]
    activation_terms = ("activations", "logits", "autocast_weight_copies")
    analytic = sum(r.bytes for r in ledger_resident(rows, Phase.FORWARD) if r.term in activation_terms)
    traced_act = traced.phase_peaks.get("forward", 0) - traced.parameters_bytes - traced.optimizer_state_bytes
    terms.append(TermComparison(term="activations", analytic=analytic, traced=traced_act, exact=False))
    notes = [*traced.notes, "ZeRO: model states computed from the ZeRO partition rules on the traced parameter count; "
             "activations traced with sharding none in 16-bit; DeepSpeed's buffers are not traced (phases not compared)"]
    return Comparison(model=model, config=config, world_size=world_size, layers=layers, terms=terms,
                      trace_seconds=traced.seconds, notes=notes)
