"""Tiled MLP: none, or tiled (DeepSpeed's ``TiledMLP``: each decoder layer's MLP run over tiles of
the sequence, recomputed in backward, so no layer keeps its intermediates).

At long sequences a layer's MLP intermediates (gate, up, their product: several times the
intermediate width per token) are what its backward holds most of, recomputed or kept.
``TiledMLP.apply(fn, mlp, x, shards, params)`` (deepspeed/runtime/sequence_parallel/ulysses_sp.py)
saves only the MLP's input ``x``; its forward runs ``fn`` on each of ``shards`` tiles of the
sequence under ``no_grad`` and concatenates the outputs; its backward allocates ``x``'s gradient,
then per tile runs ``fn`` again with autograd and backward on that tile, writing into the tile's
slice of the gradient. So the MLP's intermediates and their gradients exist for one tile at a time
(``activations.tiled_mlp_tile_tokens``: DeepSpeed's recipe ``ceil(seqlen / hidden)`` tiles, about
``hidden`` tokens each), at the price of a third forward of each MLP under full checkpointing (a
second without). DeepSpeed marks the MLP's weights ``ds_grad_is_ready`` only at the last tile, so
ZeRO reduces their gradients once, accumulated over the tiles in the parameters' ``.grad``; DDP's
and FSDP's gradient hooks have no such switch (its docstring: "DDP, FSDP will need something
similar"): refused there.

No configuration key of DeepSpeed, accelerate or the Trainer turns it on (the Hugging Face blog,
"Ulysses Sequence Parallelism", 2026-03: "aren't yet available as flags in the HF tool
ecosphere"; ArcticTraining's ``tiled_mlp_compute``): runtime.json names it and the planner
launch patches each decoder layer's MLP (planner/runtime/tiled_mlp.py), as DeepSpeed's tutorial
patches ``LlamaMLP.forward``. Sources: DeepSpeed 0.19 ``ulysses_sp.py`` (``TiledMLP``),
``docs/_tutorials/ulysses-alst-sequence-parallelism.md`` (Tiled MLP computation); published:
ArcticTraining projects/sequence-parallelism (Llama-3.1-8B on 8 x H100, Ulysses 8, ZeRO-3 with
the optimizer on the CPU: 1.1M tokens without it, 1.2M with it; benchmarks/sequence_world.py).
"""

from enum import StrEnum

from planner.core.emitted import EmitDraft
from planner.core.job import JobFiles, Reading
from planner.core.ledger import LedgerDraft, PagedInfo
from planner.core.timing import TimeDraft, Window
from planner.core.vocabulary import LONG_SEQUENCE_TOKENS
from planner.cost import activations, params
from planner.cost.activations import tiled_mlp_tiles  # noqa: F401  (the runtime's tile count: planner/runtime/tiled_mlp.py)
from planner.strategies import rates
from planner.strategies.base import Check, Choice, Engine, PlanContext, Strategy, unsaid_default
from planner.strategies.checkpointing import Checkpointing


class TiledMlp(StrEnum):
    NONE = "none"
    TILED = "tiled"


CHOICES: dict[TiledMlp, Choice] = {
    TiledMlp.NONE: Choice("each MLP over the whole sequence"),
    # (searched where sequences are long: planner/engine/degrees.py)
    TiledMlp.TILED: Choice("DeepSpeed's TiledMLP: each MLP over tiles of the sequence, recomputed in backward",
                           complexity=1, searched=False, runtime_only=True),
}


def _check(ctx: PlanContext, out: Check) -> None:
    """The first reason only (a search enumerates this beside the sharding and prunes a refusal
    that read no other field)."""
    if ctx.config.tiled_mlp != TiledMlp.TILED:
        return
    m, c = ctx.model, ctx.config
    if ctx.engine != Engine.DEEPSPEED and c.sharding != "none":
        out.reject("tiled MLP without DeepSpeed", "DeepSpeed's TiledMLP defers the MLP's gradients with DeepSpeed's "
                   "own flag (ds_grad_is_ready); DDP's and FSDP's gradient hooks would fire on every tile: use a "
                   "zero stage, or one GPU without sharding")
    elif m.is_moe:
        out.reject("tiled MLP of a MoE model", "tiling routed experts is not modelled: use --tiled-mlp none")
    elif m.residual_dropout > 0:  # (GPT-2's resid_pdrop and StarCoder2's residual_dropout act inside the MLP)
        out.reject("tiled MLP with dropout in the MLP", f"{m.family}'s MLP drops out its output: TiledMLP's backward "
                   "recomputes each tile, drawing another mask than the forward's, so its gradients would not be "
                   "the loss's: use --tiled-mlp none")
    elif ctx.layout.autocast:
        out.reject("tiled MLP under autocast", "TiledMLP's backward recomputes each tile after the forward's autocast "
                   "has ended: over fp32 weights its matmuls run in fp32, slower many times over and not the "
                   "forward's numerics: use --precision bf16-pure, or a zero stage (DeepSpeed's bf16 has no autocast)")
    elif ctx.layout.adapter is not None:
        out.reject("tiled MLP with an adapter", "an adapter's tensors inside the tiled MLP are not modelled: use "
                   "--tiled-mlp none")
    elif c.checkpointing == Checkpointing.SELECTIVE:
        out.reject("tiled MLP with selective checkpointing", "the per-op policy over a tiled MLP is not modelled: "
                   "use --checkpointing full or none")
    elif c.precision == "fp8-mixed":
        out.reject("tiled MLP with fp8", "fp8 matmuls inside the tiled MLP are not modelled: use --tiled-mlp none")
    elif c.method != "sft":
        out.reject("tiled MLP beyond sft", f"--method {c.method} with a tiled MLP is not modelled: use --tiled-mlp none")


def _time(ctx: PlanContext, ledger: LedgerDraft, paged: PagedInfo | None, draft: TimeDraft) -> None:
    """(Its memory rows are the checkpointing strategy's, tiled there: strategies/checkpointing.py
    ``tiled``.) Each MLP's forward once more in backward (its matmuls, 2 FLOPs per weight per token, and
    its elementwise ops): the tiles' recompute; the tiles themselves are ~hidden tokens long,
    large enough to keep the matmuls efficient (not modelled as slower)."""
    if ctx.config.tiled_mlp != TiledMlp.TILED:
        return
    m, dt = ctx.model, ctx.layout.dtypes
    mlp = tuple(t for t in params.layer_matmuls(m) if t.name.startswith("mlp."))
    seconds = (rates.layer_matmul_forward_seconds(ctx, mlp)
               + rates.elementwise_forward_seconds(ctx, activations.total(tuple(activations.mlp_intermediates(m, dt)))))
    draft.compute("recompute", "tiled MLP: each MLP's forward again, tile by tile", seconds, Window.BACKWARD)


def _emit(ctx: PlanContext, files: EmitDraft) -> None:
    """runtime.json's ``tiled_mlp``; DeepSpeed installed (its ``TiledMLP``), with or without ZeRO."""
    if ctx.config.tiled_mlp == TiledMlp.TILED:
        files.runtime["tiled_mlp"] = str(TiledMlp.TILED)
        files.extras.add("deepspeed")


def _read(job: JobFiles, r: Reading) -> None:
    """runtime.json's ``tiled_mlp``, the only file that says it (the planner launch applies it);
    untiled where a job's files say how it runs and no runtime.json tiles it (no library's key
    can: a user's own script tiles only if its code does, which check cannot see)."""
    if job.runtime_where:
        value = job.runtime.get("tiled_mlp", str(TiledMlp.NONE))
        if value not in set(TiledMlp):
            r.problems.append(f"{job.runtime_where}: tiled_mlp {value!r}: one of {', '.join(TiledMlp)}"[:300])
            return
        r.set("tiled_mlp", TiledMlp(value), f"{job.runtime_where}: tiled_mlp {value}")
        return
    said = job.training_args_where or job.accelerate_where or job.deepspeed_where
    if said:
        r.set("tiled_mlp", TiledMlp.NONE, f"{said}: no runtime.json tiles the MLP (no library key can)")


def _savers(c, hardware) -> list[tuple[str, dict]]:
    """Tiling the MLPs (the callers keep it only where the rules pass it and the peak falls)."""
    if c.tiled_mlp != TiledMlp.NONE:
        return []
    return [("tiled-mlp none -> tiled (DeepSpeed's TiledMLP; the planner launch applies it)", {"tiled_mlp": TiledMlp.TILED})]


STRATEGY = Strategy(
    "tiled_mlp", TiledMlp, TiledMlp.NONE, order=12, short="mlp",
    help="tiled MLP: none, or tiled (DeepSpeed's TiledMLP: each MLP over tiles of the sequence, recomputed in "
         "backward; zero stages or one GPU; applied by the planner launch); searched at long sequences",
    check=_check, time=_time, emit=_emit, read=_read, records=CHOICES, savers=_savers,
    describe=unsaid_default("tiled_mlp", TiledMlp.NONE),
    runtime="planner.runtime.tiled_mlp", searched_from=f"from {LONG_SEQUENCE_TOKENS:,} tokens",
)
