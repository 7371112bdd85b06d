"""Sequence-parallel degrees: the requests whose spaces suggest searches as one.

A degree ``p`` of Ulysses makes a data-parallel replica of ``p`` GPUs, and a search space holds its
replicas fixed (its micro-batch sizes and accumulation follow from them), so each degree is a space
of its own; suggest searches them all and ranks their plans as one (planner/engine/search.py
``merged``). Which:

- a request that names a degree (``--sequence-parallel ulysses --sp-size P``) or no Ulysses: its
  own space, except that a long sequence (``SEQUENCE_SEARCH_MIN_TOKENS`` or more) with sequence
  parallelism left unnamed also searches every degree;
- ``--sequence-parallel ulysses`` without ``--sp-size``: every degree, at any length.

The degrees: those of one node Ulysses' rules allow (strategies/sequence_parallel.py ``degrees``),
for requests whose methods and batching it can take (``sequence_searchable``), with the ZeRO
stages among the request's sharding (Ulysses runs through DeepSpeed). Every space trains the same
global batch, the request's, else the default of the space without sequence parallelism (a
multiple of the GPUs, so of every degree's replicas): their plans' tokens/s are comparable.

Below ``SEQUENCE_SEARCH_MIN_TOKENS`` no degree is searched unasked: a rank of a degree does the same
matmuls and attention per step as one without it and adds the all-to-alls, so a degree pays only
where memory forces a slower plan without it, which long sequences do (at 32,768 tokens the 8B's
fastest plan on 8xH100-80 without it recomputes every layer; with Ulysses over 4 GPUs none), and
the common answer keeps its time budget (benchmarks/suggest_walltime.py).
"""

from collections.abc import Callable

from planner.catalog.models import resolve_model
from planner.core.errors import PlannerInputError
from planner.core.numerics import NumericsPolicy
from planner.engine.ranking import Candidate, allowed_levels
from planner.engine.search import SearchOutcome
from planner.engine.space import SearchSpace
from planner.schema.suggest import SuggestRequest
from planner.strategies.sequence_parallel import SequenceParallel, degrees, sequence_searchable
from planner.strategies.sharding import ZERO

SpaceOf = Callable[[SuggestRequest], SearchSpace]

#: The sequence length from which suggest searches Ulysses' degrees unasked (tokens).
SEQUENCE_SEARCH_MIN_TOKENS = 16_384


def sequence_requests(request: SuggestRequest, space_of: SpaceOf) -> list[SuggestRequest]:
    """``request`` (its seq_len resolved) as the requests suggest searches, the one without
    sequence parallelism first where it is allowed; ``[request]`` where no degree is searched.
    ``space_of``: a request's search space."""
    named = {str(v) for v in request.sequence_parallel}
    asked = "ulysses" in named and request.sp_size is None
    unnamed = not named and request.seq_len is not None and request.seq_len >= SEQUENCE_SEARCH_MIN_TOKENS
    if not (asked or unnamed):
        return _each_named(request, space_of)
    model, hardware = resolve_model(request.model), request.hardware()
    zero = [s for s in (request.sharding or ZERO) if str(s) in ZERO]
    found = degrees(model, hardware, request.seq_len or 0)
    if not zero or not found or not sequence_searchable(model, request.method, request.batching_used):
        return [request]  # (named: the strategy's rules refuse it with their reasons)
    base = [request.model_copy(update={"sequence_parallel": [SequenceParallel.NONE]})] if "none" in named or unnamed else []
    gbs = request.global_batch_size or _none_space(request, space_of).global_batch_size
    return base + [request.model_copy(update={"sequence_parallel": [SequenceParallel.ULYSSES], "sp_size": p,
                                              "sharding": zero, "global_batch_size": gbs}) for p in found]


def _each_named(request: SuggestRequest, space_of: SpaceOf) -> list[SuggestRequest]:
    """A request naming none and one degree of Ulysses: a request of each (one space holds one
    degree), the same global batch in both."""
    if {str(v) for v in request.sequence_parallel} != {"none", "ulysses"}:
        return [request]
    gbs = request.global_batch_size or _none_space(request, space_of).global_batch_size
    return [request.model_copy(update={"sequence_parallel": [v], "global_batch_size": gbs})
            for v in (SequenceParallel.NONE, SequenceParallel.ULYSSES)]


def _none_space(request: SuggestRequest, space_of: SpaceOf) -> SearchSpace:
    """The space without sequence parallelism whose default global batch every space trains (any
    named micro-batch left out: a degree's replicas may divide it where all the GPUs do not)."""
    return space_of(request.model_copy(update={"sequence_parallel": [SequenceParallel.NONE], "sp_size": None,
                                               "micro_batch_size": []}))


def searchable(requests: list[SuggestRequest],
               space_of: SpaceOf) -> tuple[list[tuple[SuggestRequest, SearchSpace]], list[str]]:
    """Each request with its space, and the layouts (``layout_words``) whose space the request's
    flags rule out (a named micro-batch that does not divide its replicas' share), each with the
    first reason: left out of the search, said in ``degrees_line``; when every one is, the first's
    error is raised."""
    out, left, first = [], [], None
    for r in requests:
        try:
            out.append((r, space_of(r)))
        except PlannerInputError as e:
            first = first or e
            left.append(f"{layout_words((r.sp_size or 1) if 'ulysses' in r.sequence_parallel else 1)}: {e.problems[0]}")
    if not out and first is not None:
        raise first
    return out, left if len(requests) > 1 else []


def layout_words(p: int) -> str:
    """A layout as the tables say it: ``ulysses xP``, or ``none``."""
    return f"ulysses x{p}" if p > 1 else "none"


def degrees_line(outcome: SearchOutcome, cands: list[Candidate], policy: NumericsPolicy,
                 left: list[str]) -> list[str]:
    """Where several layouts were searched: each one's fastest fitting plan of the numerics
    ``policy`` offers (planner/engine/ranking.py ``allowed_levels``; ``cands``: the outcome's
    fitting records as the ranking saw them, fastest first), or that none fits; those ``left`` out,
    with why; and the flag that leaves sequence parallelism out."""
    if not outcome.others and not left:
        return []
    allowed = allowed_levels(cands, policy)
    best: dict[int, float] = {}
    for c in cands:  # (fastest first)
        if c.numerics in allowed:
            best.setdefault(c.item.space, c.tokens_per_second)
    rows = []
    for i, space in enumerate(outcome.spaces):
        p = int(space.settings.get("sp_size", 1)) if "ulysses" in space.choices.get("sequence_parallel", ()) else 1
        words = layout_words(p)
        rows.append((best.get(i, 0.0), f"{words} {best[i]:,.0f}" if i in best else f"{words}: nothing fits"))
    text = ", ".join([w for _, w in sorted(rows, key=lambda r: -r[0])] + [f"not searched: {w}" for w in left])
    return [f"sequence parallelism, each layout's fastest tokens/s: {text} (--sequence-parallel none: without it)"]
