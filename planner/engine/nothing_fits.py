"""When no plan fits: what the plan needs, and the smallest changes with which one fits.

A *probe* of some hardware evaluates only the smallest micro-batch (memory never falls as it
grows) and, per combination of the other techniques, only the memory-saving choice of the
dominated ones (``MEMORY_SAVING``: full checkpointing, fused attention): that choice has the
lowest GPU peak and the lowest host RAM of its combination (a test holds the model to it), so a
plan fits on the hardware exactly when a probed candidate does, at about a sixth of the work.
Probes are cached per hardware; the GPU and host sides are kept apart, so one probe answers "does
it fit with N GB of host RAM?" for every N.

The fixes, smallest first:

- more host RAM, when a candidate fits the GPU and only host RAM is short (the default host RAM
  is a guess: planner/catalog/gpus.py ``default_host_memory_bytes``);
- more GPUs of the kind (doubling, within a node first): the first count at which a plan fits
  with the default host RAM; else the first at which host RAM needed per node falls to its floor
  (the model load, which no count divides), with that host RAM;
- a larger kind from the catalog at the same count, when the GPU memory itself is short.

Only the hardware of a fix is searched in full, over the combinations its probe found fitting.
"""

import itertools
import math
from dataclasses import dataclass
from functools import cache, cached_property, partial

from planner.catalog import gpus as gpu_catalog
from planner.catalog.calibration import any_corrections
from planner.core.errors import PlannerInputError
from planner.core.formatting import gib
from planner.core.numerics import NumericsPolicy
from planner.core.specs import HardwareSpec, ModelSpec
from planner.core.units import GB
from planner.cost.overheads import context_bytes, cuda_context_bytes, host_capacity_for, usable_host_bytes
from planner.engine.estimate import Shared, evaluate, result_of, size_free_key
from planner.engine.lengths_file import lengths_of
from planner.engine.ranking import rank, searched
from planner.engine.refusals import RefusalMemo
from planner.engine.search import SearchOutcome, search_plans
from planner.engine.space import SearchSpace, build_space, settings_of
from planner.schema.estimate import EstimateResult
from planner.schema.suggest import HardwareSuggestion
from planner.strategies import BY_FIELD, FIELDS, PlanContext, TrainingConfig, summary
from planner.strategies.base import Check

MAX_NODES = 128
#: Per technique, its choices from the least GPU memory to the most, for the techniques whose
#: choice moves no model state: full checkpointing saves the most activations, fused (sdpa)
#: attention no s^2 scores; neither touches host RAM, and a paged optimizer keeps more of its
#: state on the GPU (less spilled to host) the less the rest takes. (The loss is not here: the
#: chunked loss keeps buffers the standard one does not, so neither is always smaller.)
MEMORY_SAVING: dict[str, tuple[str, ...]] = {"checkpointing": ("full", "selective", "none"),
                                             "attention": ("sdpa", "eager")}
#: Host RAM per node as servers are built (GB): a host-RAM fix names the first that suffices.
HOST_SIZES_GB = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)


@dataclass(frozen=True)
class Probe:
    """One technique combination at the smallest micro-batch, memory-saving choices."""

    techniques: dict
    peak: int  # GPU bytes
    usable: int
    host: int  # host RAM bytes per node

    @property
    def gpu_fits(self) -> bool:
        return self.peak <= self.usable


@dataclass
class Scan:
    """The feasible probes of one hardware that can answer: each that fits the GPU, and each
    whose peak was the least when it was probed (a probe whose model states alone exceed both is
    left out: ``Prober._scan``)."""

    spec: str
    hardware: HardwareSpec
    space: SearchSpace
    probes: list[Probe]
    complete: bool = True  # every combination probed (``Prober.fits`` stops at the first that fits)

    @property
    def min_peak(self) -> int | None:
        return min((p.peak for p in self.probes), default=None)

    @cached_property
    def host_needed(self) -> int | None:
        """The least host RAM per node with which a candidate that fits the GPU fits (None: none fits the GPU)."""
        return min((p.host for p in self.probes if p.gpu_fits), default=None)

    def fits(self, host_bytes: int | None = None) -> bool:
        """A plan fits, with ``host_bytes`` of host RAM per node (None: the hardware's)."""
        cap = self.hardware.host_memory_bytes_per_node if host_bytes is None else host_bytes
        return self.host_needed is not None and self.host_needed <= usable_host_bytes(cap)


@dataclass
class Verdict:
    needs_bytes: int | None  # the smallest GPU peak a feasible candidate reaches on the asked hardware
    suggestions: list[HardwareSuggestion]
    reasons: list[str]


def host_gb(need_bytes: int) -> int:
    """The first common host RAM size (GB per node) whose usable share holds ``need_bytes``."""
    capacity = host_capacity_for(need_bytes)
    return next((s for s in HOST_SIZES_GB if s * GB >= capacity), 1024 * math.ceil(capacity / (1024 * GB)))


class Prober:
    """Probes hardware for one request and model, each spec once."""

    def __init__(self, request, model: ModelSpec):
        self.request, self.model = request, model
        self._scans: dict[str, Scan | None] = {}
        self._fitting: dict[str, int] = {}  # spec -> host RAM of a probe found fitting its GPU by ``fits``

    def fits(self, spec: str, host_bytes: int | None = None) -> bool:
        """Whether a plan fits on ``spec`` with ``host_bytes`` of host RAM per node (None: its
        own): the full scan's answer when there is one; else a scan that stops at the first probe
        that fits (only kept when it ran to the end)."""
        if spec in self._scans:
            scan = self._scans[spec]
            return scan is not None and scan.fits(host_bytes)
        hw = self.request.hardware(spec)
        cap = hw.host_memory_bytes_per_node if host_bytes is None else host_bytes
        if self._fitting.get(spec, math.inf) <= usable_host_bytes(cap):
            return True
        scan = self._scan(spec, hw, until=usable_host_bytes(cap))
        if scan is None or scan.complete:
            self._scans[spec] = scan
            return scan is not None and scan.fits(host_bytes)
        self._fitting[spec] = min(p.host for p in scan.probes if p.gpu_fits)
        return True

    def scan(self, spec: str) -> Scan | None:
        """The probes of ``spec`` (None: no search space there, e.g. a fixed micro-batch that does
        not divide its share of the batch)."""
        if spec not in self._scans:
            self._scans[spec] = self._scan(spec)
        return self._scans[spec]

    def _scan(self, spec: str, hw: HardwareSpec | None = None, until: float | None = None) -> Scan | None:
        """``until``: stop at the first probe that fits the GPU with at most that host RAM per
        node (the scan is then not ``complete``)."""
        hw = hw or self.request.hardware(spec)
        try:
            space = space_for(self.request, hw.num_gpus)
        except PlannerInputError:
            return None
        mbs, margin = space.micro_batch_sizes[0], self.request.margin
        light = [f for f in MEMORY_SAVING if f in space.choices]
        heavy = [f for f in space.choices if f not in light]
        lights = [dict(zip(light, values, strict=True)) for values in itertools.product(
            *(sorted(space.choices[f], key=_saving_rank(f)) for f in light))]
        probes: list[Probe] = []
        shared = Shared()  # one layout per distinct tuple of the fields the layout reads
        rules = RefusalMemo(self.model, hw, shared)  # each rule's findings, by the values it read
        least = math.inf  # the least peak so far: a probe cut above it and the GPU is neither least nor fits
        for values in itertools.product(*(space.choices[f] for f in heavy)):
            for extra in lights:
                techniques = {f: BY_FIELD[f].enum(v) for f, v in (dict(zip(heavy, values, strict=True)) | extra).items()}
                config = space.config(techniques, mbs)
                # (its fields are its __dict__: the values the rules' tries read)
                shared.checks[size_free_key(config)] = rules.check(config.__dict__, partial(_itself, config))
                ev = evaluate(self.model, hw, config, margin, skip_infeasible=True, cut_misses=True, cut_above=least,
                              shared=shared)
                if ev.feasible:
                    if not ev.cut:
                        probe = Probe(techniques, ev.peak, ev.usable, ev.host_memory["peak"])
                        probes.append(probe)
                        least = min(least, ev.peak)
                        if until is not None and probe.gpu_fits and probe.host <= until:
                            return Scan(spec, hw, space, probes, complete=False)
                    break
                if not _light_rejects(ev.ctx, light):
                    break  # another choice of the memory-saving techniques cannot make it feasible
        return Scan(spec, hw, space, probes)

    def kind_floor(self, hardware: HardwareSpec) -> float:
        """A lower bound of the GPU peak on every catalog kind at ``hardware``'s shape: the least
        peak on a GPU like it that supports every dtype, less how much more CUDA context it has
        than the catalog kind with the least. A candidate's memory depends on the kind only through
        whether its precision is supported and that context (planner/cost/overheads.py
        ``cuda_context_bytes``), so no kind needs less; a paged optimizer's state only fills memory
        a larger kind has more of. With measured corrections (--calibration) the context is
        fitted per kind: no bound (0) when the store holds any."""
        if any_corrections(self.request.calibration):
            return 0
        top = max(v for v in hardware.gpu.dense_flops_per_s.values() if v)
        gpu = hardware.gpu.model_copy(update={"calibration": None, "dense_flops_per_s": dict.fromkeys(
            hardware.gpu.dense_flops_per_s, top)})
        scan = self._scan("", hardware.model_copy(update={"gpu": gpu}))
        if scan is None:
            return math.inf
        surplus = max(0, cuda_context_bytes(gpu) - _least_catalog_context())
        return min((p.peak for p in scan.probes), default=math.inf) - surplus

    def plan(self, scan: Scan, host_gb: float | None = None) -> EstimateResult:
        """The plan suggest would rank first (planner/engine/ranking.py) on ``scan``'s hardware
        (with ``host_gb`` GB of host RAM per node; None: its own): a full search over the
        technique choices of the probes that fit there, which holds every plan that fits (a
        probe's choices are the memory-saving ones)."""
        host = scan.hardware.host_memory_bytes_per_node if host_gb is None else int(host_gb * GB)
        fitting = [p for p in scan.probes if p.gpu_fits and p.host <= usable_host_bytes(host)]
        narrowed = {f: list(dict.fromkeys(p.techniques[f] for p in fitting)) for f in fitting[0].techniques
                    if f not in MEMORY_SAVING}
        request = self.request.model_copy(update=narrowed | ({"host_memory_gb": host_gb} if host_gb else {}))
        hw = request.hardware(scan.spec)
        space = space_for(request, hw.num_gpus)
        outcome = search_plans(space, self.model, hw, request.margin)
        cands = searched(outcome)
        ranked = rank(cands, request.numerics, 1).plans
        best = ranked[0] if ranked else rank(cands, NumericsPolicy.LADDER, 1).least
        assert best is not None, "the scan holds a plan that fits"
        return result_of(evaluate(self.model, hw, best.config, request.margin), request.margin)


def space_for(request, num_gpus: int) -> SearchSpace:
    """The request's space on ``num_gpus`` GPUs; its global batch when that divides among them,
    else the default one."""
    gbs = request.global_batch_size
    if gbs is not None and gbs % num_gpus:
        gbs = None  # (the default global batch)
    fixed = {f: [str(v) for v in getattr(request, f)] for f in FIELDS}
    return build_space(num_gpus, request.seq_len, fixed, list(request.micro_batch_size), gbs,
                       request.exact_optimizer, request.launcher, settings_of(request), request.batching_used,
                       lengths_of(request))


def _saving_rank(field: str):
    order = MEMORY_SAVING[field]
    return lambda v: order.index(v) if v in order else len(order)


def _itself(config: TrainingConfig) -> TrainingConfig:
    return config


def _light_rejects(ctx: PlanContext, light: list[str]) -> bool:
    """Whether the memory-saving techniques' own checks reject this candidate."""
    check = Check()
    for f in light:
        BY_FIELD[f].check(ctx, check)
    return bool(check.codes)


Fixes = tuple["Scan | None", list[HardwareSuggestion]]  # the asked hardware's probes, the fixes


def explain(request, model: ModelSpec, hardware: HardwareSpec, outcome: SearchOutcome,
            nearest: list[EstimateResult], found: Fixes | None = None) -> Verdict:
    """Why nothing fits on the asked hardware, and the smallest fixes (``found``: already found,
    by ``hardware_fixes``)."""
    here, fixes = found if found is not None else _fixes(Prober(request, model), request, hardware)
    needs = here.min_peak if here else None
    return Verdict(needs, fixes, _reasons(request, outcome, here, nearest, fixes))


def hardware_fixes(request, model: ModelSpec, hardware: HardwareSpec) -> Fixes | None:
    """``explain``'s probes and fixes, when no candidate fits on the asked hardware (None: one
    does, found by a probe scan that stops at the first that fits). ``suggest`` runs it beside
    its search, whose verdict decides whether it is used."""
    prober = Prober(request, model)
    return None if prober.fits(request.gpus) else _fixes(prober, request, hardware)


def _fixes(prober: Prober, request, hardware: HardwareSpec) -> Fixes:
    """The asked hardware's probes, and the smallest fixes: more host RAM, more GPUs, a larger GPU."""
    here = prober.scan(request.gpus)
    fixes = []
    if here is not None and here.host_needed is not None:
        gb = host_gb(here.host_needed)
        fixes.append(HardwareSuggestion(change="more host RAM", gpus=request.gpus, host_memory_gb=gb,
                                        plan=prober.plan(here, gb)))
    fixes += [f for f in (_more_gpus(prober, hardware, here), _larger_gpu(prober, hardware, here)) if f]
    return here, fixes


def _fix(prober: Prober, scan: Scan, change: str) -> HardwareSuggestion:
    """``scan``'s hardware with its host RAM, or with the least common size that holds what the
    plan needs."""
    needed = scan.host_needed
    assert needed is not None, "a fix is a scan on which a plan fits the GPU"
    gb = None if scan.fits() else host_gb(needed)
    return HardwareSuggestion(change=change, gpus=scan.spec, host_memory_gb=gb, plan=prober.plan(scan, gb))


def _more_gpus(prober: Prober, hardware: HardwareSpec, here: Scan | None) -> HardwareSuggestion | None:
    """The first count of the ladder at which a plan fits with the host RAM asked (or the
    default); else the first at which the host RAM it needs is down to the ladder's floor, when
    that is less than the asked hardware needs."""
    ladder = hardware_ladder(hardware)
    scans = _Lazy(prober, ladder)
    i = _first(len(ladder), lambda i: scans.fits(i))
    if i is not None:
        return _fix(prober, scans.at(i), "more GPUs")
    last = scans[len(ladder) - 1] if ladder else None
    if last is None or last.host_needed is None:
        return None
    floor = host_gb(last.host_needed) * GB
    if here is not None and here.host_needed is not None and host_gb(here.host_needed) * GB <= floor:
        return None  # more GPUs would not lower the host RAM it needs
    i = _first(len(ladder), lambda i: scans.fits(i, floor))
    assert i is not None, "the last count fits with the host RAM it needs"
    return _fix(prober, scans.at(i), "more GPUs")


@cache
def _least_catalog_context() -> int:
    """The least CUDA context of any catalog GPU, in bytes (planner/cost/overheads.py)."""
    return min(context_bytes(f.compute_capability, f.sm_count, f.driver_reserved_bytes)
               for f in gpu_catalog.catalog().values())


def _larger_gpu(prober: Prober, hardware: HardwareSpec, here: Scan | None) -> HardwareSuggestion | None:
    """When the GPU memory is short: the first larger kind at the same count on which a
    candidate fits the GPU."""
    if here is not None and here.host_needed is not None:
        return None  # the GPU is not what is short
    floor = prober.kind_floor(hardware)
    for spec in larger_kinds(hardware):
        if int(prober.request.hardware(spec).gpu.memory_bytes * (1 - prober.request.margin)) < floor:
            continue
        scan = prober.scan(spec)
        if scan is not None and scan.host_needed is not None:
            return _fix(prober, scan, "larger GPU")
    return None


class _Lazy:
    def __init__(self, prober: Prober, specs: list[str]):
        self.prober, self.specs = prober, specs

    def __getitem__(self, i: int) -> Scan | None:
        return self.prober.scan(self.specs[i])

    def fits(self, i: int, host_bytes: int | None = None) -> bool:
        return self.prober.fits(self.specs[i], host_bytes)

    def at(self, i: int) -> Scan:
        """The scan at ``i``, one ``fits`` found a plan on."""
        scan = self[i]
        assert scan is not None, self.specs[i]
        return scan


def _first(n: int, ok) -> int | None:
    """The first of 0..n-1 for which ``ok`` holds, by bisection: whether a plan fits only grows
    with the GPU count (sharding never raises per-GPU memory)."""
    if n == 0 or not ok(n - 1):
        return None
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def hardware_ladder(hardware: HardwareSpec) -> list[str]:
    """More GPUs of the kind: double within a node up to its size, then double the nodes."""
    gpu, n = hardware.gpu, hardware.num_gpus
    spec = gpu.id
    out = []
    per_node = gpu.max_gpus_per_node
    count = n * 2
    while count <= per_node * MAX_NODES:
        out.append(f"{count}x{spec}" if count <= per_node else f"{count // per_node}x{per_node}x{spec}")
        count *= 2
    return out


def larger_kinds(hardware: HardwareSpec) -> list[str]:
    """Catalog kinds with more memory than the asked one, smallest first, at the same shape."""
    current = hardware.gpu.memory_bytes
    bigger = sorted(
        (f for f in gpu_catalog.catalog().values() if f.memory_mib * 2**20 > current),
        key=lambda f: (f.memory_mib, -(f.dense_tflops.get("bf16") or 0)),
    )
    shape = (f"{hardware.nodes}x" if hardware.nodes > 1 else "") + f"{hardware.gpus_per_node}x"
    return [shape + f.id for f in bigger if hardware.gpus_per_node <= f.max_gpus_per_node]


def _reasons(request, outcome: SearchOutcome, here: Scan | None, nearest: list[EstimateResult],
             fixes: list[HardwareSuggestion]) -> list[str]:
    """The memory story first: what a plan needs here, the nearest misses, the fixes."""
    head = f"none of {outcome.considered:,} candidates fits"
    if here is None or not here.probes:
        why = ", ".join(f"{why} ({n:,})" for why, n in outcome.rejected.most_common(3))
        reasons = [f"{head}: none is possible on {request.gpus} with these restrictions; rejected most often: {why}"]
    else:
        reasons = [f"{head}: {_needs(request, here)}"]
    reasons += [nearest_words(r) for r in nearest[:3]]
    reasons += [_fix_words(s) for s in fixes]
    if not fixes:
        reasons.append(f"no larger catalog GPU at this count and no count of this GPU up to {MAX_NODES} nodes "
                       "makes a plan fit with these restrictions")
    return reasons


def _needs(request, here: Scan) -> str:
    """ "needs ≈ X per GPU": the least GPU peak of any candidate here, and the host RAM when that is short."""
    usable, least = here.probes[0].usable, min(p.peak for p in here.probes)
    if here.host_needed is None:
        return (f"needs ≈ {gib(least)} per GPU ({gib(usable)} usable), the least of any candidate "
                f"(micro-batch {here.space.micro_batch_sizes[0]}, the most memory-saving choices allowed)")
    # host RAM in GB, as --host-memory-gb and the assumptions say it
    capacity = f"{here.hardware.host_memory_bytes_per_node / GB:,.0f} GB " + (
        "given" if request.host_memory_gb is not None else "assumed; --host-memory-gb sets it")
    return (f"needs ≈ {gib(least)} per GPU ({gib(usable)} usable) and ≥ {host_capacity_for(here.host_needed) / GB:,.0f} GB of "
            f"host RAM per node ({capacity})")


def nearest_words(r: EstimateResult) -> str:
    """A near miss: its techniques, and how much GPU memory and host RAM it lacks."""
    short = max(0, -r.headroom_bytes)
    host_short = r.host_short_bytes
    what = " and ".join(w for w in (f"GPU {gib(short)}" if short else "",
                                    f"host RAM {host_short / GB:,.0f} GB" if host_short else "") if w)
    return f"nearest: {_plan_words(r)}: {what or 'nothing'} short"


def _plan_words(p: EstimateResult) -> str:
    return f"{summary(p.config, 'compact', ' / ')} / mbs {p.config.micro_batch_size}"


def _fix_words(s: HardwareSuggestion) -> str:
    p = s.plan
    host = f"--host-memory-gb {s.host_memory_gb:g} (host RAM per node)" if s.host_memory_gb else ""
    where = host if s.change == "more host RAM" else f"{s.gpus} ({s.change})" + (f" and {host}" if host else "")
    return (f"with {where} it fits: {_plan_words(p)}, {gib(p.memory['peak'])} per GPU, "
            f"{p.time.tokens_per_second:,.0f} tokens/s")
