"""The reference for the traced probe: the same step on real CPU tensors, measured by the allocator.

A tracker that follows tensors (MemTracker) holds references to their storages, which changes
what the autograd engine may do in place; torch's profiler instead records every allocation and
free of the CPU allocator without touching a tensor. The cumulative sum of those events over the
last iteration gives each phase's peak above the bytes alive when the iteration starts, which the
fake trace must reproduce (tests/test_traced.py). Small models only: this computes for real.
"""

import contextlib


def real_phase_increments(req) -> dict[str, int]:
    """Each phase's peak allocation above the iteration's start, bytes (real CPU tensors, no tracker)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from planner import runtime
    from planner.runtime.model import build_config, build_model
    from planner.runtime.optimizer import build as build_optimizer
    from planner.runtime.precision import autocast_on

    c = req.config
    if c.loss == "chunked":
        raise ValueError("the chunked loss's fp32-accumulating addmm has no CPU kernel: trace it with fake tensors")
    cfg = build_config(req.config_json, req.layers)
    model = build_model(cfg, c)
    runtime.prepare(model, c, runtime.Site.TRACED)
    optimizer = build_optimizer(c.optimizer, model, cfg, fused=True, fake=True)
    ids = torch.randint(0, cfg.vocab_size, (c.micro_batch_size, c.seq_len))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_on(c))

    def step(mark):
        with mark("forward"), autocast:
            loss = model(input_ids=ids, labels=ids).loss
        with mark("backward"):
            loss.backward()
            del loss
        with mark("step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(req.iterations - 1):
        step(lambda name: contextlib.nullcontext())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(record_function)
    events = prof.profiler.kineto_results.events()
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in ("forward", "backward", "step")}
    allocs = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    peaks = dict.fromkeys(spans, 0)
    live = 0
    for t, nbytes in allocs:
        live += nbytes
        for phase, (start, end) in spans.items():
            if start <= t <= end and live > peaks[phase]:
                peaks[phase] = live
    return peaks
