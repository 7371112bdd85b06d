"""Generation: how a GRPO plan generates its completions (TRL's GRPOTrainer): transformers'
``generate`` with the training model, vLLM colocated in each training process (awake, or asleep
outside generation) or vLLM as a server on GPUs of its own. ``none`` for every other method.

The search tries the in-process ways for ``--method grpo`` (a server needs GPUs of its own: name
it, with ``--vllm-gpus``). planner/cost/rollout.py holds TRL's and vLLM's facts with sources. Rows
of the ``rollout`` phase (planner/core/ledger.py): the generation's (transformers' KV cache and
sampling; the colocated engine awake) and the scoring forwards' (one decoder layer's tensors and
the fused LM head's, under ``no_grad``); a colocated engine that stays awake holds its share in
every phase. Time: the step's generations (one per step by TRL's default; the generation batch and
num_iterations set how many: strategies/method.py ``generations_per_step``), decode-bound; the
scoring forwards per micro-batch of each generation.
"""

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo, Phase
from planner.core.timing import TimeDraft
from planner.core.trl_recipes import grpo_recipe
from planner.core.vocabulary import Setting
from planner.cost import adapters, params, rollout
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy


class Generation(StrEnum):
    NONE = "none"  # no generation: sft, dpo
    TRANSFORMERS = "transformers"  # model.generate with the training model
    COLOCATE = "vllm-colocate"  # vLLM in each training process, awake throughout
    COLOCATE_SLEEP = "vllm-colocate-sleep"  # ... asleep (level 2) outside generation
    SERVER = "vllm-server"  # trl vllm-serve on GPUs of its own


COLOCATED = (Generation.COLOCATE, Generation.COLOCATE_SLEEP)
VLLM = (*COLOCATED, Generation.SERVER)

#: (the generation rows grow with the micro-batch and the colocated share in steps of 0.05: not convex)
CHOICES: dict[Generation, Choice] = {
    Generation.NONE: Choice("no generation (sft, dpo)"),
    Generation.TRANSFORMERS: Choice("transformers' generate with the training model (a KV cache per row)",
                                    searched=False, convex=False),
    Generation.COLOCATE: Choice("vLLM in each training process, its share of the GPU held throughout",
                                searched=False, complexity=1, convex=False),
    Generation.COLOCATE_SLEEP: Choice("vLLM in each training process, asleep (level 2) outside generation",
                                      searched=False, complexity=2, convex=False),
    Generation.SERVER: Choice("trl vllm-serve on GPUs of its own (--vllm-gpus), weights broadcast each step",
                              searched=False, complexity=2),
}

SETTINGS = (
    Setting("vllm_share", float, 0.0,
            "colocated vLLM's gpu_memory_utilization (a fraction of each GPU); 0: the smallest that holds the whole "
            "generation batch at once, in steps of 0.05", ge=0.0, le=0.95, used_at=tuple(map(str, COLOCATED))),
    Setting("vllm_gpus", int, 1, "GPUs of the vLLM server, beside the training GPUs of --gpus (one engine per "
            "--vllm-tp of them)", ge=1, used_at=(str(Generation.SERVER),)),
    Setting("vllm_tp", int, 0, "vLLM's tensor parallelism (vllm_tensor_parallel_size, trl vllm-serve's "
            "--tensor_parallel_size); 0: the smallest power of two whose weight shard takes at most a quarter of a "
            "training GPU (half of a server's)", ge=0, le=64, used_at=tuple(map(str, VLLM))),
)

#: The rollout phase's moments: pushing the weights to vLLM, generating, and scoring the
#: completions (planner.core.ledger.resident).
SYNCING = "pushing the weights to vLLM"
GENERATING = "generating the completions"
SCORING = "scoring the completions (no_grad forwards)"


def _grpo(ctx: PlanContext) -> bool:
    from planner.strategies.method import grpo  # (method imports this module's names)

    return grpo(ctx.config)


def rows_per_generation(ctx: PlanContext) -> int:
    """Rows each training process generates at once: its share of the generation batch
    (``method.generation_batch``; TRL's per_device_train_batch_size x steps_per_generation)."""
    from planner.strategies.method import generation_batch

    return generation_batch(ctx.config, ctx.layout.data_parallel) // ctx.layout.data_parallel


def prompt_len(ctx: PlanContext) -> int:
    """Tokens of a row's prompt: the row's length less the completion's."""
    return max(0, ctx.config.seq_len - ctx.config.completion_len)


def engine_weight_bytes(ctx: PlanContext) -> int:
    """vLLM's copy of the weights: 16-bit, or bitsandbytes 4-bit when the policy's base is
    (TRL passes ``quantization="bitsandbytes"`` for a model of ``Linear4bit`` modules). Unit: bytes."""
    spec, m = ctx.layout.adapter, ctx.model
    if spec is not None and spec.nf4:
        return adapters.qlora_weight_bytes(m, True)
    return params.total_parameters(m) * 2


def engine_tp(ctx: PlanContext) -> int:
    """The engine's tensor parallelism: ``--vllm-tp``, or planner's rule (``rollout.tensor_parallel``):
    the smallest split whose weight shard takes at most a quarter of a training GPU (colocated;
    within the training processes of one machine) or half of a server GPU (within its GPUs)."""
    if ctx.config.vllm_tp:
        return ctx.config.vllm_tp
    server = ctx.config.generation == Generation.SERVER
    most = ctx.config.vllm_gpus if server else min(ctx.hardware.gpus_per_node, ctx.layout.data_parallel)
    share = rollout.SERVER_WEIGHT_SHARE if server else rollout.COLOCATED_WEIGHT_SHARE
    return rollout.tensor_parallel(engine_weight_bytes(ctx), ctx.hardware.gpu.memory_bytes, max(1, most), share,
                                   ctx.model)


def engine_rows(ctx: PlanContext) -> int:
    """Rows one engine generates at once: its GPUs' shares of the generation batch (colocated:
    the tensor-parallel group's processes gather their prompts; TRL's ``max_num_seqs``
    per_device x tp x steps_per_generation); a server's engines share the whole batch."""
    if ctx.config.generation == Generation.SERVER:
        engines = max(1, ctx.config.vllm_gpus // engine_tp(ctx))
        return -(-rows_per_generation(ctx) * ctx.layout.data_parallel // engines)
    return rows_per_generation(ctx) * engine_tp(ctx)


def engine_fixed(ctx: PlanContext, max_num_seqs: int) -> int:
    """A vLLM engine's bytes per GPU before its KV cache (``rollout.engine_fixed_bytes``, the
    weights its tensor parallelism shards)."""
    return rollout.engine_fixed_bytes(-(-engine_weight_bytes(ctx) // engine_tp(ctx)), ctx.model, max_num_seqs, 2)


def colocated_share(ctx: PlanContext) -> float:
    """The colocated engine's ``gpu_memory_utilization``: ``--vllm-share``, or the smallest that
    holds every row of its generation batch at once (``rollout.share_for``), at least 0.05."""
    if ctx.config.vllm_share:
        return ctx.config.vllm_share
    rows, tp = engine_rows(ctx), engine_tp(ctx)
    return max(0.05, rollout.share_for(engine_fixed(ctx, rows), rows, ctx.config.seq_len, ctx.model, 2,
                                       ctx.hardware.gpu.memory_bytes, tp=tp))


def engine_concurrency(ctx: PlanContext, share: float) -> int:
    """Sequences an engine of ``share`` of each of its GPUs decodes at once
    (``rollout.concurrent_rows``), of its ``engine_rows``."""
    rows = engine_rows(ctx)
    budget = int(share * ctx.hardware.gpu.memory_bytes)
    tokens = rollout.kv_capacity_tokens(budget, engine_fixed(ctx, rows), ctx.model, 2, engine_tp(ctx))
    return rollout.concurrent_rows(tokens, ctx.config.seq_len, rows)


def _check(ctx: PlanContext, out: Check) -> None:
    g, cfg = ctx.config.generation, ctx.config
    if _grpo(ctx) != (g != Generation.NONE):
        if g == Generation.NONE:
            out.reject("grpo without generation", "grpo generates its completions: --generation transformers, "
                       "vllm-colocate, vllm-colocate-sleep or vllm-server")
        else:
            out.reject("generation without grpo", f"--generation {g} generates completions for GRPO only: "
                       "--method grpo, or --generation none")
        return
    # (the rows per generation are the per-GPU share of the generation batch, the same at every
    # micro-batch of a search's space: these answers hold for every size the check cache serves them to)
    if g not in VLLM:
        return
    if ctx.engine == Engine.FSDP and ctx.layout.adapter is not None:
        out.reject("vllm with an fsdp adapter", f"{g} with an adapter under FSDP: merging the adapter into sharded "
                   "weights for the push to vLLM is not modelled (TRL marks it untested); use ZeRO-3, or "
                   "--generation transformers", unmodelled=True)
        return
    tp = engine_tp(ctx)
    gpus = cfg.vllm_gpus if g == Generation.SERVER else ctx.layout.data_parallel
    if not rollout.tp_divides(ctx.model, tp) or gpus % tp or (g != Generation.SERVER and tp > ctx.hardware.gpus_per_node):
        out.reject("vllm tp", f"vLLM's tensor parallelism {tp} must divide the {ctx.model.num_heads} attention heads "
                   f"(and the KV heads, or they it) and its {gpus} GPUs, within one machine: another --vllm-tp")
        return
    if g in COLOCATED:
        share = colocated_share(ctx)
        if share > 0.95 or engine_concurrency(ctx, share) < 1:
            out.reject("vllm share too small", f"a vLLM share of {share:.2f} of the {ctx.hardware.gpu.name} cannot hold "
                       f"its weights (over {tp} GPU(s)), workspace and one sequence of {cfg.seq_len:,} tokens: a larger "
                       "--vllm-share or --vllm-tp, a shorter --seq-len, or --generation vllm-server")
    elif engine_concurrency(ctx, rollout.SERVER_SHARE_DEFAULT) < 1:
        out.reject("vllm server too small", f"trl vllm-serve over {tp} {ctx.hardware.gpu.name} (gpu_memory_utilization "
                   f"{rollout.SERVER_SHARE_DEFAULT}) cannot hold the weights and one sequence of {cfg.seq_len:,} "
                   "tokens: more --vllm-gpus, or a larger --vllm-tp")


def _apply(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """The generation engine's memory on each training GPU (``rollout`` phase unless it stays
    awake); transformers' KV cache and sampling at the end of decoding."""
    g = ctx.config.generation
    if g == Generation.NONE or g == Generation.SERVER:
        return
    m, rows, roll = ctx.model, rows_per_generation(ctx), frozenset({Phase.ROLLOUT})
    _partitioned_gathers(ctx, ledger)
    if g == Generation.TRANSFORMERS:
        c = ctx.layout.dtypes.compute
        ledger.add("activations", "generation: KV cache of the generation batch (transformers)",
                   rollout.transformers_kv_bytes(m, rows, ctx.config.seq_len, c), 1, phases=roll, moment=GENERATING,
                   note=f"{rows} rows x {ctx.config.seq_len:,} tokens, every layer's keys and values")
        ledger.add("activations", "generation: the last position's fp32 logits, scores and probabilities",
                   rollout.sampling_bytes(m, rows), 1, phases=roll, moment=GENERATING)
        return
    share = colocated_share(ctx)
    budget = int(share * ctx.hardware.gpu.memory_bytes)
    if g == Generation.COLOCATE:
        ledger.add("generation_engine", "vLLM engine (colocated): weights, KV cache, CUDA graphs",
                   rollout.engine_bytes(share, ctx.hardware.gpu.memory_bytes), 1,
                   note=f"gpu_memory_utilization {share:.2f} and the graphs beyond it, held in every phase")
        return
    ledger.add("generation_engine", "vLLM engine asleep: its CUDA graphs", rollout.CUDA_GRAPH_BYTES, 1,
               note="sleep level 2: weights and KV cache discarded outside generation")
    ledger.add("generation_engine", "vLLM engine awake: weights, KV cache", budget, 1,
               phases=roll, moment=GENERATING, note=f"gpu_memory_utilization {share:.2f}")


def _partitioned_gathers(ctx: PlanContext, ledger: LedgerDraft) -> None:
    """What the rollout gathers of a partitioned model. transformers' generation: under ZeRO-3
    every parameter for the whole generation (TRL's ``ds3_gather_for_generation``, default true:
    ``unwrap_model_for_generation``); under FSDP2 what each decode step's forward gathers
    (``summon_full_params`` is a no-op for FSDP2: its hooks gather unit by unit). The push to vLLM:
    one parameter at a time (ZeRO-3 ``GatheredParameters``; FSDP2 ``full_tensor``), or under
    ZeRO-3 with an adapter every parameter at once to merge it (``VLLMGeneration._iter_named_params``),
    beside the engine's weights where it sleeps (woken for the push)."""
    from planner.strategies.sharding import Sharding, forward_gathered, sharded_parameters

    g, m, lay, roll = ctx.config.generation, ctx.model, ctx.layout, frozenset({Phase.ROLLOUT})
    if not sharded_parameters(ctx) or lay.data_parallel == 1:
        return
    every, zero3 = params.total_parameters(m), ctx.config.sharding == Sharding.ZERO3
    if g == Generation.TRANSFORMERS:
        ledger.add("gathered_parameters", "generation: every parameter gathered (ZeRO-3)" if zero3
                   else "generation: each step's forward gathers (FSDP2)", every if zero3 else forward_gathered(ctx),
                   lay.gathered_bytes, phases=roll, moment=GENERATING,
                   note="ds3_gather_for_generation (GRPOConfig's default)" if zero3 else "unit by unit, every step")
        return
    merge = zero3 and lay.adapter is not None
    ledger.add("gathered_parameters", "the push to vLLM: " + ("every parameter gathered to merge the adapter" if merge
                                                              else "the largest parameter gathered"),
               every if merge else m.vocab_size * m.hidden_size, lay.gathered_bytes, phases=roll, moment=SYNCING)
    if g == Generation.COLOCATE_SLEEP:
        ledger.add("generation_engine", "vLLM engine's weights, woken for the push",
                   -(-engine_weight_bytes(ctx) // engine_tp(ctx)), 1, phases=roll, moment=SYNCING)


def generation_seconds(ctx: PlanContext) -> tuple[float, str]:
    """Seconds of one generation of the step's completions (prefill, decode, the weights moved to
    the engine) as the training GPUs wait for it, and how it was reckoned."""
    g, cfg, m = ctx.config.generation, ctx.config, ctx.model
    # (decoding at vLLM's measured fraction of the datasheet bandwidth: transformers' at best as fast)
    flops = rates.matmul_rate(ctx, "bf16")
    bw = ctx.hardware.gpu.memory_bandwidth_bytes_per_s * rollout.DECODE_BANDWIDTH_EFFICIENCY
    n, prompt, completion = params.total_parameters(m), prompt_len(ctx), cfg.completion_len
    rows = rows_per_generation(ctx)
    if g == Generation.TRANSFORMERS:
        from planner.cost.overheads import layer_forward_dispatch_seconds

        c, spec = ctx.layout.dtypes.compute, ctx.layout.adapter
        weights = n * c
        if spec is not None and spec.nf4:  # each step dequantizes every NF4 weight: write and read it again
            quantized = sum(t.numel for t in adapters.layer_quantized(m)) * m.num_layers
            weights = engine_weight_bytes(ctx) + 2 * c * quantized
        host = m.num_layers * layer_forward_dispatch_seconds(ctx.layout.fused_attention)
        seconds = rollout.prefill_seconds(n, rows, prompt, flops) + rollout.decode_seconds(
            weights, m, rows, rows, prompt, completion, c, bw, flops, n, per_step_seconds=host,
            kv_passes=rollout.KV_PASSES["transformers"])
        return seconds, (f"{rows} rows at once, {completion} decode steps, each launching every kernel and "
                         "copying the KV cache")
    weights, tp, rows = engine_weight_bytes(ctx), engine_tp(ctx), engine_rows(ctx)
    split = f" over {tp} GPUs" if tp > 1 else ""
    if g == Generation.SERVER:
        live = engine_concurrency(ctx, rollout.SERVER_SHARE_DEFAULT)
        sync = weights / ctx.hardware.gpu.gpu_link_bytes_per_s
        how = f"{rows} rows per server engine{split}, {live} at once; weights broadcast over NCCL"
    else:
        live = engine_concurrency(ctx, colocated_share(ctx))
        sync = 2 * weights / tp / bw
        how = f"{rows} rows{split}, {live} at once; weights copied into the engine"
    seconds = rollout.prefill_seconds(n, rows, prompt, flops * tp) + rollout.decode_seconds(
        -(-weights // tp), m, rows, live, prompt, completion, 2, bw, flops, n, kv_passes=rollout.KV_PASSES["vllm"], tp=tp)
    return seconds + sync, how


def step_generation_seconds(ctx: PlanContext) -> tuple[float, str]:
    """Seconds of generation per optimizer step: one generation's (``generation_seconds``) times the
    generations per step (``method.generations_per_step``: one per step by TRL's default, fewer with
    a larger generation batch or num_iterations), and how it was reckoned."""
    from planner.strategies.method import generations_per_step

    seconds, how = generation_seconds(ctx)
    per_step = generations_per_step(ctx)
    if per_step != 1:
        how += f"; {per_step:g} generations per step" if per_step > 1 else f"; one generation every {1 / per_step:g} steps"
    return seconds * per_step, how


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """The step's generations, serial (the training GPUs wait for them)."""
    if ctx.config.generation == Generation.NONE:
        return
    seconds, how = step_generation_seconds(ctx)
    draft.serial("generation", f"generation ({ctx.config.generation})", seconds, note=how)
    from planner.strategies.sharding import Sharding, model_gather_seconds

    if gather := model_gather_seconds(ctx):
        # every decode step's forward gathers the FSDP2 units again; ZeRO-3 gathers once for
        # transformers' generation; the push to vLLM gathers once
        from planner.strategies.method import generations_per_step

        each_step = ctx.config.generation == Generation.TRANSFORMERS and ctx.config.sharding != Sharding.ZERO3
        times = ctx.config.completion_len if each_step else 1
        draft.serial("communication", "all-gather of the partitioned model for generation",
                     times * gather * generations_per_step(ctx),
                     note="each decode step's forward (FSDP2)" if times > 1 else "once per generation")


#: GRPOConfig keys of the generation (TRL 1.16).
EMITTED = ("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_tensor_parallel_size")


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    g = ctx.config.generation
    if g == Generation.NONE:
        return
    args = files.training_args
    args["use_vllm"] = g in VLLM
    if g in VLLM:
        args["vllm_mode"] = "server" if g == Generation.SERVER else "colocate"
    if g in COLOCATED:
        args["vllm_gpu_memory_utilization"] = round(colocated_share(ctx), 4)
        args["vllm_enable_sleep_mode"] = g == Generation.COLOCATE_SLEEP
        args["vllm_tensor_parallel_size"] = engine_tp(ctx)
        files.extras.add("vllm")


def _read(job: JobFiles, r: Reading) -> None:
    """A GRPOConfig recipe's generation: ``use_vllm``, ``vllm_mode``, the share and sleep mode."""
    d, where = job.training_args, job.training_args_where
    if not where:
        return
    if not grpo_recipe(d):
        r.set("generation", Generation.NONE, f"{where}: no GRPOConfig key: no generation")
        return
    if "vllm_device" in d:
        r.warnings.append(f"{where}: vllm_device is a key of TRL 0.16 and older (vLLM on a GPU of its own, beside the "
                          "training processes); the TRL of today runs this recipe with vLLM colocated on each training "
                          "GPU (vllm_mode's default): planned so")
    vllm = r.typed(d, "use_vllm", (bool,), where)
    if not vllm:
        r.set("generation", Generation.TRANSFORMERS, f"{where}: use_vllm false (GRPOConfig's default): "
              "transformers' generate")
        return
    mode = d.get("vllm_mode", "colocate")
    said = f"vllm_mode {mode}" if "vllm_mode" in d else "no vllm_mode (GRPOConfig's default, colocate)"
    if mode not in ("colocate", "server"):
        r.problems.append(f"{where}: vllm_mode {mode!r}: GRPOConfig takes colocate or server")
        return
    if mode == "server":
        r.set("generation", Generation.SERVER, f"{where}: vllm_mode server")
        return
    sleep = r.typed(d, "vllm_enable_sleep_mode", (bool,), where)
    r.set("generation", Generation.COLOCATE_SLEEP if sleep else Generation.COLOCATE,
          f"{where}: use_vllm, {said}" + (", vllm_enable_sleep_mode" if sleep else ""))
    tp = r.typed(d, "vllm_tensor_parallel_size", (int,), where)
    r.set("vllm_tp", tp if tp is not None else 1, f"{where}: vllm_tensor_parallel_size" if tp is not None
          else f"{where}: no vllm_tensor_parallel_size (GRPOConfig's default, 1)")
    share = r.typed(d, "vllm_gpu_memory_utilization", (int, float), where)
    r.set("vllm_share", float(share) if share is not None else rollout.COLOCATE_SHARE_DEFAULT,
          f"{where}: vllm_gpu_memory_utilization" if share is not None
          else f"{where}: no vllm_gpu_memory_utilization (GRPOConfig's default, {rollout.COLOCATE_SHARE_DEFAULT})")


def pin(ctx: PlanContext) -> dict:
    """A vLLM plan states its tensor parallelism (``engine_tp``) and a colocated one its share
    (``colocated_share``) where the request left them to planner."""
    out: dict = {}
    if ctx.config.generation in VLLM and not ctx.config.vllm_tp:
        out["vllm_tp"] = engine_tp(ctx)
    if ctx.config.generation in COLOCATED and not ctx.config.vllm_share:
        out["vllm_share"] = colocated_share(ctx)
    return out


def searched_for(fixed: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The generations a search tries: the in-process ones for a GRPO request (a server needs GPUs
    the request did not count), none otherwise."""
    if "grpo" in fixed.get("method", ()):
        return tuple(map(str, (Generation.TRANSFORMERS, *COLOCATED)))
    return None


def describe(get) -> str:
    g = get("generation")
    if g in (None, Generation.NONE):
        return ""
    if g in COLOCATED and get("vllm_share"):
        return f"{g} {get('vllm_share'):.2f}"
    if g == Generation.SERVER:
        return f"{g} x{get('vllm_gpus')}"
    return str(g)


STRATEGY = Strategy(
    "generation", Generation, Generation.NONE, order=9, short="gen",
    help="GRPO's generation: transformers, vllm-colocate, vllm-colocate-sleep or vllm-server (none for sft, dpo)",
    check=_check, apply=_apply, time=_time, emit=_emit, read=_read, settings=SETTINGS, describe=describe,
    records=CHOICES, searched_for=searched_for, pin=pin,
)
