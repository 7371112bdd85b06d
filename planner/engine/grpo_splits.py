"""GRPO on one machine: colocated generation weighed against a vLLM server on some of its GPUs.

When a GRPO request leaves its generation to planner, ``suggest`` also plans a server on k of the
machine's N GPUs (``SERVER_GPUS``) with training on the other N - k (``server_splits``). A split is
searched only when it could beat the colocated answer: every plan of a split waits, each step, for
a generation that no training choice shortens (the server's engines, weights and batch are the
split's) and runs the step's matmuls, so a step's tokens over those seconds bound the split's
tokens/s from above (``speed_bound``; tests/test_grpo_plans.py holds every plan of a split below
it). A split whose bound does not exceed the colocated speed is reported with its bound,
unsearched: the answer is the one a search of every split gives.
"""

from collections.abc import Callable
from dataclasses import dataclass

from planner.catalog.models import resolve_model
from planner.core.errors import PlannerInputError
from planner.engine.space import SearchSpace
from planner.schema.suggest import SuggestRequest
from planner.strategies import PlanContext
from planner.strategies.generation import Generation, step_generation_seconds

#: vLLM servers suggest weighs against colocated generation: GPUs of one machine (TRL's
#: ``trl vllm-serve --data_parallel_size``), at most half of it.
SERVER_GPUS = (1, 2, 4)


@dataclass(frozen=True)
class Split:
    """A server on ``server_gpus`` GPUs, training on the rest (``request``), with the most tokens/s
    any of its plans can reach (``bound``; None: its space has no candidate)."""

    server_gpus: int
    request: SuggestRequest
    bound: float | None

    @property
    def words(self) -> str:
        return f"a vLLM server on {self.server_gpus}, training on {self.request.hardware().num_gpus}"


def server_splits(request: SuggestRequest, space_of: Callable[[SuggestRequest], SearchSpace]) -> list[Split]:
    """For a GRPO request that leaves the generation to planner, on one machine of N >= 2 GPUs
    named as ``NxGPU``: a split per server size k (``SERVER_GPUS``, k <= N / 2) that trains on
    N - k GPUs with ``vllm-server`` on k, with its bound. ``space_of``: a request's search space
    (its seq_len resolved)."""
    if [str(m) for m in request.method] != ["grpo"] or request.generation:
        return []
    count, _, gpu = request.gpus.partition("x")
    if not count.isdigit() or "x" in gpu or int(count) < 2:
        return []
    n = int(count)
    out = []
    for k in SERVER_GPUS:
        if 2 * k <= n:
            split = request.model_copy(update={"gpus": f"{n - k}x{gpu}", "generation": [Generation.SERVER],
                                               "vllm_gpus": k})
            out.append(Split(k, split, speed_bound(split, space_of)))
    return out


def speed_bound(request: SuggestRequest, space_of: Callable[[SuggestRequest], SearchSpace]) -> float | None:
    """The most tokens/s a plan of the server split ``request`` can reach: the samples' tokens of
    a step over the least seconds a step takes, its generations (``generation.step_generation_seconds``:
    prefill, decode and the weight broadcast, serial in the step) and the matmuls no plan skips (the
    forward, the backward's input gradients, and the backward's weight gradients unless an adapter
    trains: ``training_floor_seconds``). What a candidate could change of either is tried: each adapter
    and precision of the space (4-bit engine weights under QLoRA; fp8's faster matmuls) and each
    micro-batch size (the prefill's rate, the kernels' saturation); the largest quotient is the bound.
    Unit: tokens/s. None: no space."""
    try:
        space = space_of(request)
    except PlannerInputError:
        return None
    model, hardware = resolve_model(request.model), request.hardware()
    first = space.combo(0)
    best = 0.0
    for adapter in space.choices.get("adapter", (first.get("adapter"),)):
        for precision in space.choices.get("precision", (first.get("precision"),)):
            techniques = first | {k: type(first[k])(v) for k, v in (("adapter", adapter), ("precision", precision))
                                  if k in first}
            for mbs in space.micro_batch_sizes:
                ctx = PlanContext(model, hardware, space.config(techniques, mbs))
                seconds = step_generation_seconds(ctx)[0] + training_floor_seconds(ctx)
                tokens = ctx.config.real_tokens_per_micro_batch * ctx.config.grad_accum * ctx.layout.data_parallel
                best = max(best, tokens / seconds)
    return best or None


def training_floor_seconds(ctx: PlanContext) -> float:
    """Seconds of a step's matmuls that every plan of ``ctx``'s adapter, precision and micro-batch
    runs, serial in its step: per micro-batch the forward's and the backward's
    (``precision.matmul_seconds``, the precision strategy's rows) and the scoring forwards' matmuls
    (``method.scoring_forwards`` per micro-batch of each generation: over ``num_iterations``; each
    at least a forward's). Recomputation, attention, communication only add. Unit: seconds."""
    from planner.strategies.method import scoring_forwards
    from planner.strategies.precision import matmul_seconds

    fwd, bwd = matmul_seconds(ctx)
    cfg = ctx.config
    return cfg.grad_accum * (fwd + bwd + fwd * scoring_forwards(ctx) / cfg.num_iterations)


def reasons_line(colocated: tuple[int, float | None], splits: list[Split], speeds: list[float | None]) -> str:
    """Every way of generating, fastest first: colocated (its GPUs, its speed) and each split, at its
    searched speed, or at most its bound where it was not searched (``speeds`` None and a bound)."""
    n, speed = colocated
    rows: list[tuple[int, float, str]] = [  # (searched 0, bounded 1, nothing fits 2; tokens/s; words)
        (0, speed, f"generating in the training processes on all {n} GPUs {speed:,.0f} tokens/s") if speed
        else (2, 0.0, f"generating in the training processes on all {n} GPUs: nothing fits")]
    for split, s in zip(splits, speeds, strict=True):
        if s is not None:
            rows.append((0, s, f"{split.words} {s:,.0f} tokens/s"))
        elif split.bound is not None and not worth_searching(speed, split):
            rows.append((1, split.bound, f"{split.words}: at most {split.bound:,.0f} tokens/s "
                                         "(its generation and matmuls alone)"))
        else:
            rows.append((2, 0.0, f"{split.words}: nothing fits"))
    return "GRPO's generation, fastest first: " + "; ".join(w for _, _, w in sorted(rows, key=lambda r: (r[0], -r[1])))


def worth_searching(colocated: float | None, split: Split) -> bool:
    """Whether ``split`` is searched: it has candidates, and its bound exceeds the colocated speed
    (or nothing colocated fits)."""
    return split.bound is not None and (colocated is None or split.bound > colocated)
