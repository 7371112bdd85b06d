"""When host RAM decides the numerics: the host RAM at which an exact plan fits, and that plan.

The default host RAM is a guess (2x GPU memory, planner/catalog/gpus.py), yet with too little of
it the exact plans that offload (ZeRO-3 with CPU-offloaded optimizer, FSDP's CPU offload) cannot
run and an approximation wins (8-bit states, bf16-pure). ``suggest`` then says what would change
the answer: "the fastest exact plan fits with >= N GB host RAM per node (--host-memory-gb N)".
The probes are nothing-fits' (planner/engine/nothing_fits.py ``Prober``) over the request's exact
values only, whose host side answers every host size at once. The plan is the one suggest would
rank first with host RAM enough for every exact candidate that fits the GPU; N is the first
common server size whose usable share (planner/cost/overheads.py ``usable_host_bytes``) holds
that plan's host peak. The least size at which any exact plan fits is said beside it: the plan
that needs least host RAM is often far slower (fp32 under ZeRO-1 for an 8B on one A100-40).
"""

from planner.core.specs import ModelSpec
from planner.engine.nothing_fits import Prober, host_gb
from planner.schema.suggest import HostOption, SuggestRequest
from planner.strategies import TECHNIQUES, summary


def exact_only(request: SuggestRequest) -> SuggestRequest | None:
    """``request`` with every technique narrowed to its exact values (None: one has none left)."""
    update = {}
    for s in TECHNIQUES:
        if s.numerics:
            given = getattr(request, s.field) or s.searched or s.choices
            update[s.field] = [v for v in given if v not in s.numerics]
            if not update[s.field]:
                return None
    return request.model_copy(update=update)


def exact_host_option(request: SuggestRequest, model: ModelSpec) -> HostOption | None:
    """The host RAM per node at which an exact plan fits, and the plan suggest would rank first
    with as much as the exact candidates need; None when one fits with the host RAM asked (or
    assumed), or none fits the GPU at any."""
    exact = exact_only(request)
    if exact is None:
        return None
    prober = Prober(exact, model)
    if prober.fits(request.gpus):
        return None
    scan = prober.scan(request.gpus)
    if scan is None or scan.host_needed is None:
        return None
    ample = host_gb(max(p.host for p in scan.probes if p.gpu_fits))
    plan = prober.plan(scan, ample)
    return HostOption(host_memory_gb=host_gb(plan.host_memory["peak"]), least_host_memory_gb=host_gb(scan.host_needed),
                      tokens_per_second=plan.time.tokens_per_second,
                      peak_bytes=plan.memory["peak"], host_peak_bytes=plan.host_memory["peak"],
                      summary=summary(plan.config))
