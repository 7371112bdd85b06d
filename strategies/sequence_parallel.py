"""Sequence parallelism: none; Ulysses (DeepSpeed's ALST through accelerate's
``parallelism_config``, ``sp_backend: deepspeed``); or ring attention (torch context parallelism
on FSDP2, ``cp_size``), each over ``--sp-size`` ranks.

Either way each rank of a group of ``sp_size`` holds ``seq_len / sp_size`` positions of every
sequence: the configuration's token counts are a rank's share (planner/core/vocabulary.py
``sequence_shards``), which every activation, loss and time row reads; attention's FLOPs per rank
are the whole sequence's over ``sp_size`` (Ulysses: every position for ``heads / sp_size`` heads;
ring: every head for its positions against all, the causal work balanced by head-tail chunks).
- Ulysses: four all-to-alls a layer each way regroup q, k, v and the output (planner/cost/
  sequence.py); their copies are a transient of the attention's forward and backward
  (strategies/checkpointing.py reads ``exchange_bytes``). ZeRO partitions the model states over
  every rank, the sequence-parallel ones included (DeepSpeed's ``seq_data_parallel_group``), so the
  model-state rows are those of the same ZeRO stage without it. DeepSpeed's ``train_batch_size``
  counts every rank's micro-batches (transformers fills "auto" so; the replicas' count dies at its
  ZeRO-3 init).
- Ring: each layer's attention all-gathers the group's keys and values and merges its blocks in
  fp32 (planner/cost/sequence.py ``ring_transient_elements``, ``ring_exchanged_bytes``); FSDP2
  shards the model states over the joint data-parallel x context mesh (accelerate's
  ``dp_shard_cp``), every GPU, as FSDP without it (hybrid sharding: each node's GPUs, replicated
  across nodes, as hybrid sharding without it; the degree within a node, below its GPU count).
  Not runnable on the CPU (DTensor has no sharding rule for the CPU attention kernel): its rows
  are analytic, from torch's ring functions measured on fake tensors
  (benchmarks/ring_attention_transients.py).
A step trains ``micro-batch x accumulation x GPUs / sp_size`` samples (the group's ranks share
each sample).

Sources: accelerate 1.15 ``parallelism_config.py`` (``sp_backend`` deepspeed only, ``cp_backend``
torch only; CP and SP exclusive; CP with FSDP2 or on its own), ``accelerator.py``
``_prepare_deepspeed`` (``UlyssesSPAttentionHF.register_with_transformers``,
``UlyssesSPDataLoaderAdapter``, ``train_batch_size`` over the data-parallel size), ``_prepare_cp``
(``set_rotate_method(cp_comm_strategy)``, default "allgather"), ``big_modeling.py``
``_attach_context_parallel_hooks`` (the mask dropped for ``is_causal``; sliding-window layers
refused), ``utils/dataclasses.py`` ``DeepSpeedSequenceParallelConfig`` (eager and flex attention
refused), docs/source/concept_guides/sequence_parallelism.md (the YAML keys; "tested to work with
DeepSpeed ZeRO stage 2 and 3"); DeepSpeed 0.19 ``runtime/sequence_parallel/ulysses_sp.py``;
transformers 5.24 ``integrations/deepspeed.py`` ``deepspeed_sp_compute_loss`` (each rank's loss over
its own positions, averaged over the group by their valid tokens), ``trainer.py``
``_prepare_context_parallel_inputs`` (SDPA only; shift_labels and position_ids made and sharded with
the inputs); torch 2.13 ``distributed/tensor/experimental/_context_parallel/_attention.py``
(``context_parallel``: head-tail load balancing, the sequence divisible by 2 x cp).
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import LONG_SEQUENCE_TOKENS, Setting
from planner.cost import comms, sequence
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy


class SequenceParallel(StrEnum):
    NONE = "none"
    ULYSSES = "ulysses"
    RING = "ring"


CHOICES: dict[SequenceParallel, Choice] = {
    SequenceParallel.NONE: Choice("every rank holds whole sequences"),
    # (not in a space's searched values: a degree changes the data-parallel replicas, which one
    # space holds fixed; suggest searches a space per degree: planner/engine/degrees.py)
    SequenceParallel.ULYSSES: Choice("DeepSpeed Ulysses (ALST): each sequence split over --sp-size ranks, heads "
                                     "split for attention", complexity=2, searched=False),
    SequenceParallel.RING: Choice("torch ring attention (FSDP2 context parallelism): each sequence split over "
                                  "--sp-size ranks", complexity=2, searched=False),
}

SETTINGS = (
    Setting("sp_size", int, 2, "the sequence-parallel degree (accelerate parallelism_config_sp_size under Ulysses, "
            "cp_size under ring): the ranks one sequence is split over, a divisor of the GPUs (Ulysses: and of the "
            "attention heads)", ge=2, used_at=("ulysses", "ring")),
)

#: The training methods whose trainer's loss under Ulysses is modelled: SFT (transformers'
#: ``deepspeed_sp_compute_loss``); TRL's preference and RL trainers are not yet.
SP_METHODS = ("sft",)


def degrees(m, hardware, seq_len: int, kind: SequenceParallel = SequenceParallel.ULYSSES) -> list[int]:
    """The degrees ``kind`` can split a ``seq_len``-token sequence of ``m`` over on ``hardware``,
    ascending: 2 up to the GPUs of one node (across nodes every layer's exchanges would cross the
    network), each dividing the GPUs and passing ``_check``'s rules of the degree (Ulysses: the
    sequence and the heads, ``ulysses_refusal``; ring: twice the degree divides the sequence)."""
    n = hardware.num_gpus
    return [p for p in range(2, min(hardware.gpus_per_node, n) + 1)
            if n % p == 0 and not _degree_refusals(m, kind, p, seq_len)]


def _degree_refusals(m, kind: SequenceParallel, p: int, seq_len: int) -> list[tuple[str, str]]:
    """The rules of ``kind`` at degree ``p`` on a ``seq_len``-token sequence, as (code, reason)."""
    out = []
    if kind == SequenceParallel.ULYSSES and (why := sequence.ulysses_refusal(m, p)):
        out.append(("sp size and heads", f"{m.family}: {why} (UlyssesSPAttentionHF)"))
    if seq_len % (multiple := _row_multiple(kind, p)):
        if kind == SequenceParallel.ULYSSES:
            out.append(("seq len not a multiple of sp size",
                        f"--seq-len {seq_len:,} is not a multiple of --sp-size {p}: each rank takes an equal share"))
        else:
            out.append(("seq len not a multiple of 2 x sp size",
                        f"--seq-len {seq_len:,} is not a multiple of 2 x --sp-size ({multiple}): ring attention gives "
                        "each rank a head and a tail chunk (torch context_parallel's load balancing)"))
    return out


def _row_multiple(kind, p: int) -> int:
    """Tokens a row split over ``p`` ranks by ``kind`` must be a multiple of: Ulysses ``p`` (each
    rank an equal share: DeepSpeed's ``UlyssesSPDataLoaderAdapter``), ring ``2p`` (head-tail chunks:
    torch's load balancer, TRL's ``pad_to_multiple_of``); 1 without sequence parallelism."""
    return {"ulysses": p, "ring": 2 * p}.get(str(kind), 1)


def pad_multiple(get) -> int:
    """Tokens a padded row of a split sequence is padded to a multiple of (``get``: a field's value
    by name; ``_row_multiple``). planner's launch pads so (planner/launch/data.py ``Padded``);
    planner/core/lengths.py ``shape`` models it."""
    return _row_multiple(get("sequence_parallel") or "none", int(get("sp_size") or 2))


def ring_fills_node(p: int, hardware) -> bool:
    """Whether ring attention over ``p`` ranks under hybrid sharding leaves a node no dp_shard above 1
    beside its replicas, which accelerate refuses (cp with pure data parallelism)."""
    return p >= hardware.gpus_per_node


def _unmodelled(m, method, kind: SequenceParallel = SequenceParallel.ULYSSES) -> list[tuple[str, str]]:
    """The rules no degree or technique changes, as (code, reason): the methods whose loss over
    sequence shards is modelled, no sliding window (Ulysses: a 4D mask it does not pass; ring:
    accelerate refuses non-causal layers). Padded rows are padded to ``pad_multiple``; right
    padding under the causal attention both run (the mask dropped) leaves the real tokens'
    attention as it is, and the padding's labels are -100."""
    name = "Ulysses" if kind == SequenceParallel.ULYSSES else "ring attention"
    out = []
    if str(method) not in SP_METHODS:
        out.append((f"{kind} with this method", f"--method {method} under {name} (its trainer's loss over "
                    "sequence shards) is not modelled yet; plan sft"))
    if m.sliding_window is not None:
        why = ("needs a 4D mask, which Ulysses does not pass: not modelled" if kind == SequenceParallel.ULYSSES
               else "is not plain causal: accelerate refuses it under context parallelism")
        out.append((f"{kind} with a sliding window", f"{m.family}'s sliding-window attention {why}"))
    return out


def sequence_searchable(m, methods, kind: SequenceParallel = SequenceParallel.ULYSSES) -> bool:
    """Whether plans of ``m`` under the training ``methods`` can take ``kind`` at all
    (``_unmodelled`` refuses none of them)."""
    return not any(_unmodelled(m, x, kind) for x in methods)


def _check(ctx: PlanContext, out: Check) -> None:
    cfg, m = ctx.config, ctx.model
    kind = cfg.sequence_parallel
    if kind == SequenceParallel.NONE:
        return
    p, n = cfg.sp_size, ctx.world_size
    if kind == SequenceParallel.ULYSSES and ctx.engine != Engine.DEEPSPEED:
        out.reject("ulysses without zero", "Ulysses sequence parallelism runs through DeepSpeed (accelerate's only "
                   "sp_backend): use --sharding zero1, zero2 or zero3, or --sequence-parallel ring with fsdp")
    if kind == SequenceParallel.RING:
        if not ctx.fsdp2:
            out.reject("ring without fsdp2", "ring attention (torch context parallelism) runs on FSDP2 in accelerate: "
                       "use --sharding fsdp or fsdp-grad-op (fsdp_version 2), or --sequence-parallel ulysses with ZeRO")
        elif cfg.sharding == "fsdp-hybrid" and ring_fills_node(p, ctx.hardware):
            out.reject("ring over a node under fsdp-hybrid", f"--sp-size {p} fills each node, leaving hybrid sharding "
                       "no dp_shard_size above 1 beside its replicas, which accelerate refuses (tp/cp with pure data "
                       "parallelism): a smaller --sp-size, or --sharding fsdp")
    if n % p:
        out.reject("sp size does not divide the gpus", f"--sp-size {p} does not divide the {n} GPU(s)")
    for code, reason in _degree_refusals(m, kind, p, cfg.seq_len):
        out.reject(code, reason)
    if cfg.attention != "sdpa":
        out.reject(f"{kind} with eager attention", "Ulysses passes position ids, not a 4D mask: accelerate refuses "
                   "eager attention (DeepSpeedSequenceParallelConfig); use --attention sdpa"
                   if kind == SequenceParallel.ULYSSES else
                   "ring attention replaces SDPA's kernels: the Trainer refuses any other attention; use --attention sdpa")
    for code, reason in _unmodelled(m, cfg.method, kind):
        out.reject(code, reason, unmodelled=True)
    if p > ctx.hardware.gpus_per_node:
        out.warnings.append(f"--sp-size {p} spans nodes: every layer's exchanges cross the network")


def exchange_words(ctx: PlanContext) -> str:
    """What ``exchange_bytes`` holds, in a ledger's words."""
    if ctx.config.sequence_parallel == SequenceParallel.RING:
        return "ring attention's gathered keys and values and fp32 merge"
    return "Ulysses' all-to-all copies of q, k and v"


def exchange_bytes(ctx: PlanContext, backward: bool = False) -> float:
    """Bytes per local token one layer's attention holds for the sequence split's exchange beyond
    its tensors without it, at its forward's or ``backward``'s largest instant, in the compute
    dtype: Ulysses' all-to-all copies (planner/cost/sequence.py ``exchange_transient_elements``,
    the same both ways) or ring attention's gathered keys and values and fp32 merge
    (``ring_transient_elements``); 0 without sequence parallelism."""
    p = ctx.config.sequence_shards
    if p == 1:
        return 0.0
    if ctx.config.sequence_parallel == SequenceParallel.RING:
        return sequence.ring_transient_elements(ctx.model, p, backward) * ctx.layout.dtypes.compute
    return sequence.exchange_transient_elements(ctx.model, p) * ctx.layout.dtypes.compute


def exchange_seconds(ctx: PlanContext, backward: bool = False) -> float:
    """One pass's exchanges over every layer, not overlapped with compute (an upper reading: the
    attention waits for its inputs), over the link the group spans (consecutive ranks: one node
    where ``p`` fits in it). Unit: seconds per micro-batch.
    - Ulysses, either way: q, k, v in and the output back (backward: their gradients), each rank
      sending all but its ``1/p`` of each (four all-to-alls).
    - Ring: forward the k/v all-gather; ``backward`` the gather again and ``p`` sends of the fp32
      k/v gradients (``ring_exchanged_bytes``; torch issues them asynchronously and waits a step
      later, so part of them hides behind the blocks' kernels: not credited)."""
    p = ctx.config.sequence_shards
    if p == 1:
        return 0.0
    m = ctx.model
    over = rates.link(ctx, p > ctx.hardware.gpus_per_node)
    if ctx.config.sequence_parallel == SequenceParallel.RING:
        forward, back = sequence.ring_exchanged_bytes(m, p, ctx.layout.dtypes.compute)
        n_bytes, calls = (back, 1 + p) if backward else (forward, 1)
        return m.num_layers * rates.collective_seconds(n_bytes * rates.tokens(ctx), over, calls)
    elements = sum(sequence.exchanged_elements(m, p))
    message = elements * ctx.layout.dtypes.compute * rates.tokens(ctx)
    return m.num_layers * rates.collective_seconds(comms.all_to_all_bytes(message, p), over, 4)


#: Each realisation's time rows: (forward label, backward label, note).
TIME_WORDS = {
    SequenceParallel.ULYSSES: ("Ulysses all-to-alls (forward)", "Ulysses all-to-alls (backward",
                               "q, k, v and the output of every layer; the attention waits for them"),
    SequenceParallel.RING: ("ring attention's k/v all-gather (forward)", "ring attention's k/v gather and fp32 "
                            "gradient sends (backward", "every layer's keys and values from the group's ranks"),
}


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    forward = exchange_seconds(ctx)
    if not forward:
        return
    recompute = ctx.config.checkpointing == "full"
    first, second, note = TIME_WORDS[ctx.config.sequence_parallel]
    draft.compute("communication", first, forward, Window.FORWARD, note=note)
    draft.compute("communication", second + (" and recompute)" if recompute else ")"),
                  exchange_seconds(ctx, backward=True) + (forward if recompute else 0.0), Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """accelerate's ``parallelism_config`` block, which ``accelerate launch`` turns into the
    environment its Accelerator reads (the replicas as dp_shard_size, the degree as sp_size or
    cp_size); the Trainer then shards each batch and computes the loss over the shards.
    - Ulysses: its documented DeepSpeed form; DeepSpeed's ``train_batch_size`` is left to the
      Trainer (below).
    - Ring: torch's backend with the "allgather" strategy planner models, named (accelerate's
      default today); FSDP2 then shards over the joint dp_shard x cp mesh."""
    cfg = ctx.config
    p = cfg.sequence_shards
    if p == 1:
        return
    # (hybrid sharding: replicas across nodes, each node's GPUs sharded over dp_shard x the degree)
    replicas = ctx.hardware.nodes if cfg.sharding == "fsdp-hybrid" else 1
    block = {"parallelism_config_dp_replicate_size": replicas,
             "parallelism_config_dp_shard_size": ctx.world_size // replicas // p}
    if cfg.batching != "packed":
        m = pad_multiple(lambda name: getattr(cfg, name, None))
        files.notes.append(f"padded rows under {cfg.sequence_parallel} x{p}: planner's launch pads each micro-batch's rows "
                           f"to a multiple of {m} tokens (with their position ids); a TRL script of your own needs "
                           f"SFTConfig(pad_to_multiple_of={m})")
    if cfg.sequence_parallel == SequenceParallel.RING:
        files.accelerate["parallelism_config"] = block | {
            "parallelism_config_cp_size": p,
            "parallelism_config_cp_backend": "torch",
            "parallelism_config_cp_comm_strategy": "allgather",
        }
        files.notes.append(f"ring attention (torch context parallelism) over {p} GPUs: accelerate's launcher reads the "
                           "parallelism_config block and the Trainer shards each batch, labels and position ids; its "
                           "rows are analytic (it does not run on the CPU), so watch the first steps' memory")
        return
    files.accelerate["parallelism_config"] = block | {
        "parallelism_config_sp_size": p,
        "parallelism_config_sp_backend": "deepspeed",
        "parallelism_config_sp_seq_length_is_variable": True,
        "parallelism_config_sp_attn_implementation": str(cfg.attention),
    }
    # "auto": the Trainer fills it with every rank's micro-batches, the count transformers' ZeRO-3
    # init checks the file against (before the sequence-parallel groups exist); the replicas'
    # count dies there (tests/test_launch_live.py zero3-ulysses hit it)
    files.deepspeed_config()["train_batch_size"] = "auto"
    files.notes.append(f"Ulysses sequence parallelism over {p} GPUs: accelerate's launcher reads the parallelism_config "
                       "block, the Trainer shards each batch, and planner's launch gives every row its position ids; "
                       "run live on the CPU only so far (micro-batches of one row), so watch the first steps' memory")


def _read(job: JobFiles, r: Reading) -> None:
    """accelerate's ``parallelism_config``: ``parallelism_config_sp_size`` (its only sp_backend is
    DeepSpeed's Ulysses) or ``parallelism_config_cp_size`` (torch's ring attention; its
    ``cp_comm_strategy`` "alltoall" is not modelled); tp sizes are planner/check/job_files.py's."""
    if not job.accelerate_where:
        return
    found_block = job.accelerate.get("parallelism_config")
    block: dict = found_block if isinstance(found_block, dict) else {}
    where = f"{job.accelerate_where}: parallelism_config"
    sizes = {key: r.typed(block, f"parallelism_config_{key}_size", (int,), where) for key in ("sp", "cp")}
    found = [(key, size) for key, size in sizes.items() if size is not None and size > 1]
    if not found:
        r.set("sequence_parallel", SequenceParallel.NONE, f"{where}: no sp_size or cp_size above 1")
        return
    if len(found) > 1:
        r.problems.append(f"{where}: sp_size and cp_size both above 1; accelerate refuses that (context and sequence "
                          "parallelism are exclusive): keep one")
        return
    key, size = found[0]
    if key == "sp":
        r.set("sequence_parallel", SequenceParallel.ULYSSES, f"{where}: sp_size {size} (sp_backend deepspeed)")
    else:
        strategy = block.get("parallelism_config_cp_comm_strategy", "allgather")
        if strategy != "allgather":
            r.problems.append(f"{where}: parallelism_config_cp_comm_strategy {strategy!r}: planner models ring attention's "
                              "default 'allgather' strategy only, so it cannot give this job a verdict")
            return
        r.set("sequence_parallel", SequenceParallel.RING, f"{where}: cp_size {size} (cp_backend torch, allgather)")
    r.set("sp_size", size, f"{where}: parallelism_config_{key}_size")


def describe(get) -> str:
    """'' without sequence parallelism (it goes without saying), else "ulysses x8" or "ring x8"."""
    value = get("sequence_parallel")
    return "" if value in (None, SequenceParallel.NONE) else f"{value} x{get('sp_size')}"


STRATEGY = Strategy(
    "sequence_parallel", SequenceParallel, SequenceParallel.NONE, order=10, short="sp",
    help="sequence parallelism: none, ulysses (DeepSpeed ALST: each sequence split over --sp-size GPUs, "
         "attention heads split for the attention) or ring (torch context parallelism on FSDP2: keys and values "
         "gathered for the attention); searched at long sequences",
    check=_check, time=_time, emit=_emit, read=_read, settings=SETTINGS, describe=describe, records=CHOICES,
    searched_from=f"from {LONG_SEQUENCE_TOKENS:,} tokens",
)
