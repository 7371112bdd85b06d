"""Sequence- and tensor-parallel degrees: the requests whose spaces suggest searches as one.

A degree ``p`` of sequence (or tensor) parallelism makes a data-parallel replica of ``p`` GPUs,
and a search
space holds its replicas fixed (its micro-batch sizes and accumulation follow from them), so each
layout (a realisation and its degree) is a space of its own; suggest searches them all and ranks
their plans as one (planner/engine/search.py ``merged``). Which:

- a request that names one degree (``--sequence-parallel ulysses --sp-size P``, or ``ring``) or no
  sequence parallelism: its own space (several values named with ``--sp-size``: one each), except
  that a long sequence (``LONG_SEQUENCE_TOKENS`` or more) with sequence parallelism left
  unnamed also searches every layout;
- ``--sequence-parallel ulysses`` (or ``ring``) without ``--sp-size``: its every degree, at any length.

The degrees: those of one node each realisation's rules allow (strategies/sequence_parallel.py
``degrees``), for requests whose methods it can take (``sequence_searchable``), with its engine's
shardings among the request's (Ulysses: the ZeRO stages; ring: FSDP2's full, grad-op and, across
nodes, hybrid sharding). Every space trains the same global batch, the request's, else the default
of the space without sequence parallelism (a multiple of the GPUs, so of every degree's replicas):
their plans' tokens/s are comparable.

Below ``LONG_SEQUENCE_TOKENS`` no degree is searched unasked: a rank of a degree does the same
matmuls and attention per step as one without it and adds the exchanges, so a degree pays only
where memory forces a slower plan without it, which long sequences do (at 32,768 tokens the 8B's
fastest plan on 8xH100-80 without it recomputes every layer; with Ulysses over 4 GPUs none), and
the common answer keeps its time budget (benchmarks/suggest_walltime.py).
"""

from collections.abc import Callable

from planner.catalog.models import resolve_model
from planner.core.errors import PlannerInputError
from planner.core.numerics import NumericsPolicy
from planner.core.vocabulary import LONG_SEQUENCE_TOKENS
from planner.cost import params, tensor
from planner.engine.ranking import Candidate, allowed_levels
from planner.engine.search import SearchOutcome
from planner.engine.space import SearchSpace
from planner.schema.suggest import SuggestRequest
from planner.strategies.checkpoint_offload import CheckpointOffload
from planner.strategies.sequence_parallel import SequenceParallel, degrees, ring_fills_node, sequence_searchable
from planner.strategies.sharding import ZERO, Sharding, hybrid_possible
from planner.strategies.tensor_parallel import ALLOWED, TensorParallel
from planner.strategies.tiled_mlp import TiledMlp

SpaceOf = Callable[[SuggestRequest], SearchSpace]

#: Each realisation's shardings: Ulysses runs through DeepSpeed, ring attention on FSDP2.
SHARDINGS = {SequenceParallel.ULYSSES: tuple(ZERO),
             SequenceParallel.RING: (str(Sharding.FSDP), str(Sharding.FSDP_GRAD_OP), str(Sharding.FSDP_HYBRID))}
KINDS = (SequenceParallel.ULYSSES, SequenceParallel.RING)


def sequence_requests(request: SuggestRequest, space_of: SpaceOf) -> list[SuggestRequest]:
    """``request`` (its seq_len resolved) as the requests suggest searches, the one without
    sequence parallelism first where it is allowed; ``[request]`` where no degree is searched.
    ``space_of``: a request's search space. A long sequence also searches the long-context levers
    the request leaves unnamed, in each request where they can run (``_with_levers``). Then the
    tensor-parallel layouts (``_tensor_layouts``); where ``--tensor-parallel transformers`` is named
    without a degree, its degrees are the layouts and the request itself is searched only as the
    none it also names."""
    unnamed = [f for f in LEVERS if not getattr(request, f)]
    tensor = _tensor_layouts(request, space_of)
    named = {str(v) for v in request.tensor_parallel}
    base = _layouts(request, space_of)
    if request.tp_size is None and "transformers" in named:  # (its degrees are the layouts: the request's none, if named)
        none = [TensorParallel.NONE]
        base = [r.model_copy(update={"tensor_parallel": none}) for r in base] if "none" in named else []
        if not base and not tensor:
            raise PlannerInputError(f"--tensor-parallel transformers: no degree on {request.gpus}: a degree divides a "
                                    "node's GPUs and the model's heads, below the GPU count (FSDP shards over the rest)",
                                    hint="Plan it on several GPUs, or leave --tensor-parallel out.")
    return [_with_levers(r, unnamed) for r in base] + tensor


def _layouts(request: SuggestRequest, space_of: SpaceOf) -> list[SuggestRequest]:
    """``sequence_requests`` before the levers: a request per sequence-parallel layout searched."""
    named = {str(v) for v in request.sequence_parallel}
    unnamed = not named and request.seq_len is not None and request.seq_len >= LONG_SEQUENCE_TOKENS
    if request.sp_size is not None or not (unnamed or named - {"none"}):
        return _each_named(request, space_of)
    model, hardware = resolve_model(request.model), request.hardware()
    layouts = []
    for kind in KINDS:
        if not unnamed and str(kind) not in named:
            continue
        shardings = [s for s in (request.sharding or SHARDINGS[kind]) if str(s) in SHARDINGS[kind]
                     and (str(s) != Sharding.FSDP_HYBRID or hybrid_possible(hardware))]
        if kind == SequenceParallel.RING and request.fsdp_version == 1:
            shardings = []
        if shardings and sequence_searchable(model, request.method, kind):
            hybrid_only = all(str(s) == Sharding.FSDP_HYBRID for s in shardings)
            layouts += [(kind, p, shardings) for p in degrees(model, hardware, request.seq_len or 0, kind)
                        if not (hybrid_only and ring_fills_node(p, hardware))]
    if not layouts:
        return [request]  # (named: the strategy's rules refuse it with their reasons)
    base = [request.model_copy(update={"sequence_parallel": [SequenceParallel.NONE]})] if "none" in named or unnamed else []
    gbs = request.global_batch_size or _none_space(request, space_of).global_batch_size
    return base + [request.model_copy(update={"sequence_parallel": [kind], "sp_size": p, "sharding": shardings,
                                              "global_batch_size": gbs}) for kind, p, shardings in layouts]


#: The long-context levers a long request searches unasked, each with every value.
LEVERS = {"checkpoint_offload": tuple(CheckpointOffload), "tiled_mlp": tuple(TiledMlp)}


def _tensor_layouts(request: SuggestRequest, space_of: SpaceOf) -> list[SuggestRequest]:
    """The tensor-parallel layouts searched beside ``request``'s own (strategies/tensor_parallel.py):
    each degree of a node that splits the model's heads and leaves FSDP ranks to shard over
    (``tp_degrees``), FSDP2's full and (across nodes) hybrid sharding among the request's, the
    request's global batch (else that of its space without tensor parallelism). Searched unasked
    across nodes for a model whose 16-bit weights exceed one GPU (``tp_unasked``); named
    (``--tensor-parallel transformers``): its degree (``--tp-size``) or every one; none where the
    request names none, or sequence parallelism (not modelled together)."""
    named = {str(v) for v in request.tensor_parallel}
    if request.tp_size is not None:  # (the request names its degree: it is its own layout)
        return []
    hardware, model = request.hardware(), resolve_model(request.model)
    wanted = "transformers" in named or (not named and tp_unasked(model, hardware))
    if not wanted or request.sequence_parallel and set(map(str, request.sequence_parallel)) != {"none"}:
        return []
    allowed = ALLOWED["sharding"]
    shardings = [s for s in (request.sharding or allowed) if str(s) in allowed
                 and (str(s) != Sharding.FSDP_HYBRID or hybrid_possible(hardware))]
    if not shardings or request.fsdp_version == 1:
        return []
    sizes = tp_degrees(model, hardware)
    if not sizes:
        return []
    gbs = request.global_batch_size or _none_space(request, space_of).global_batch_size
    return [request.model_copy(update={"tensor_parallel": [TensorParallel.TRANSFORMERS], "tp_size": t,
                                       "sharding": shardings, "global_batch_size": gbs}) for t in sizes]


def tp_unasked(m, hardware) -> bool:
    """Whether suggest searches tensor parallelism unasked: across nodes, for a model whose 16-bit
    weights exceed one GPU's memory (Llama-70B and larger on 80 GB GPUs). There a group of a node's
    GPUs divides each GPU's share of FSDP's traffic over the network by its degree, and a layer's
    activations too; a smaller model keeps the common answer's time (benchmarks/suggest_walltime.py)."""
    return hardware.nodes > 1 and 2 * params.total_parameters(m) > hardware.gpu.memory_bytes


def tp_degrees(m, hardware) -> list[int]:
    """The tensor-parallel degrees of ``m`` on ``hardware``: 2 up to a node's GPUs, each dividing
    them and the model's heads (``tensor.tp_refusal``), below the GPUs (FSDP shards over the rest)."""
    return [t for t in range(2, hardware.gpus_per_node + 1)
            if hardware.gpus_per_node % t == 0 and t < hardware.num_gpus and tensor.tp_refusal(m, t) is None]


def _with_levers(request: SuggestRequest, unnamed: list[str]) -> SuggestRequest:
    """From ``LONG_SEQUENCE_TOKENS`` tokens, each of the ``unnamed`` levers searched with both
    values: activation-checkpoint offload (host RAM for the checkpointed inputs only pays where the
    GPU cannot hold them, which long sequences make likely; the rules refuse it but under full
    checkpointing) and the tiled MLP (a third MLP forward for a layer's intermediates), the latter
    only where the request's shardings hold a ZeRO stage or none (it runs there alone: a layout of
    FSDP alone, ring attention's, searches none of it). The combinations they add are those the
    rules pass."""
    if request.seq_len is None or request.seq_len < LONG_SEQUENCE_TOKENS:
        return request
    tiles = not request.sharding or any(str(s) in ZERO or str(s) == Sharding.NONE for s in request.sharding)
    return request.model_copy(update={f: list(LEVERS[f]) for f in unnamed if f != "tiled_mlp" or tiles})


def _each_named(request: SuggestRequest, space_of: SpaceOf) -> list[SuggestRequest]:
    """A request naming several values with one degree (``--sequence-parallel none,ulysses,ring
    --sp-size P``): a request of each (one space holds one layout), the same global batch in all."""
    named = list(dict.fromkeys(request.sequence_parallel))
    if len(named) < 2:
        return [request]
    gbs = request.global_batch_size or _none_space(request, space_of).global_batch_size
    return [request.model_copy(update={"sequence_parallel": [v], "global_batch_size": gbs}) for v in named]


def _none_space(request: SuggestRequest, space_of: SpaceOf) -> SearchSpace:
    """The space without sequence parallelism whose default global batch every space trains (any
    named micro-batch left out: a degree's replicas may divide it where all the GPUs do not)."""
    return space_of(request.model_copy(update={"sequence_parallel": [SequenceParallel.NONE], "sp_size": None,
                                               "tensor_parallel": [TensorParallel.NONE], "tp_size": None,
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
            left.append(f"{layout_words(_request_layout(r))}: {e.problems[0]}")
    if not out and first is not None:
        raise first
    return out, left if len(requests) > 1 else []


def _layout(values, sp_size: int | None, tensor_values=(), tp_size: int | None = None) -> tuple[str, int]:
    """The layout of a space or request of one ``sequence_parallel`` value (and one
    ``tensor_parallel`` value): (realisation, degree); tensor parallelism's realisation is "tp"."""
    if str(next(iter(tensor_values), "none")) != "none":
        return "tp", tp_size or 2
    kind = str(next(iter(values), "none"))
    return (kind, sp_size or 2) if kind != "none" else ("none", 1)


def _request_layout(r: SuggestRequest) -> tuple[str, int]:
    return _layout(r.sequence_parallel, r.sp_size, r.tensor_parallel, r.tp_size)


def _space_layout(space: SearchSpace) -> tuple[str, int]:
    return _layout(space.choices.get("sequence_parallel", ()), space.settings.get("sp_size"),
                   space.choices.get("tensor_parallel", ()), space.settings.get("tp_size"))


def layout_words(layout: tuple[str, int]) -> str:
    """A layout as the tables say it: ``ulysses xP``, ``ring xP``, ``tp xT``, or ``none``."""
    kind, p = layout
    return f"{kind} x{p}" if kind != "none" and p > 1 else "none"


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
        words = layout_words(_space_layout(space))
        rows.append((best.get(i, 0.0), f"{words} {best[i]:,.0f}" if i in best else f"{words}: nothing fits"))
    text = ", ".join([w for _, w in sorted(rows, key=lambda r: -r[0])] + [f"not searched: {w}" for w in left])
    tp = any(_space_layout(s)[0] == "tp" for s in outcome.spaces)
    sp = any(_space_layout(s)[0] not in ("tp", "none") for s in outcome.spaces)
    what = " and ".join(w for w, on in (("sequence", sp), ("tensor", tp)) if on) or "sequence"
    flags = " ".join(f for f, on in (("--sequence-parallel none", sp), ("--tensor-parallel none", tp)) if on)
    return [f"{what} parallelism, each layout's fastest tokens/s: {text} ({flags or '--sequence-parallel none'}: "
            "without it)"]
