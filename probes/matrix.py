"""The traced cross-validation matrix, in one place: its factors, the benchmark's two parts
(benchmarks/traced_matrix.py) and the covering subset CI runs (tests/test_traced.py).

Factors: every catalog family (one model each; vocabularies 32k to 256k) x precision (bf16-mixed,
bf16-pure, fp16-mixed, fp8-mixed) x checkpointing x attention x shape (micro-batch x sequence, up
to 8 and 8192) x loss x sharding (none on one rank; DDP, FSDP2 and fsdp-grad-op at 2 and 8 ranks:
one rank traced, FSDP2 under a fake process group; DDP is traced as one rank without sharding) x
tensor degree (1, or 2 and 4 of FSDP2's 8 ranks: transformers' tensor-parallel plan and its own
FSDP2 units on a two-dimensional mesh, probes/model_setup.py ``distributed_model``).

- ``layer_matrix``: every family x precision x checkpointing x attention x shape (sharding none,
  standard loss), traced at two depths: one decoder layer's activations (their difference) and
  the step at the deeper one. Sharding and loss do not change what a layer saves.
- ``step_matrix``: a covering array of strength 3 over all the factors (every triple of values of
  any three factors at least once), each cell compared at the model's full depth
  (``depths``): traced at full depth up to ``FULL_DEPTH_PARAMETERS``, else at 2, 3 and 4 layers,
  extrapolated along the line through 3 and 4 with 2 as the linearity check.
- ``covering_subset``: the strength-2 covering array the full test suite traces at ``CI_DEPTH``
  layers; ``quick_subset``: CI's, strength 2 over the factors that decide a layer's activations.

Covering arrays are greedy: each row added covers the most value tuples not yet covered, ties to
the first in enumeration order, so the same rows come out on every run.

Cells left out (``allowed``): those the planner itself refuses (its strategies' checks,
planner.engine.estimate.check_config, on H100s), since the planner never offers them (tensor
parallelism: the families transformers has a plan for, FSDP2, bf16, none or full checkpointing,
the standard loss): Gemma-2 has
no SDPA path; GPT-2's learned positions stop at 1024 tokens; a MoE under autocast over fp32
parameters (a mixed precision without FSDP) would run its grouped_mm experts in fp32
(strategies/precision.py ``moe_autocast_reason``; the trace's meta kernel refuses it outright).
"""

import functools
import itertools
from collections.abc import Iterator

FAMILIES = {  # family -> the model traced for it
    "llama": "meta-llama/Llama-3.2-1B", "qwen2": "Qwen/Qwen2.5-0.5B", "qwen3": "Qwen/Qwen3-0.6B",
    "mistral": "mistralai/Mistral-7B-v0.3", "mixtral": "mistralai/Mixtral-8x7B-v0.1",
    "gemma2": "google/gemma-2-2b", "phi3": "microsoft/Phi-3-mini-4k-instruct", "gpt2": "openai-community/gpt2",
}
ARCHS = tuple(FAMILIES.values())
SHARDINGS = (("none", 1), ("ddp", 2), ("ddp", 8), ("fsdp", 2), ("fsdp", 8), ("fsdp-grad-op", 2), ("fsdp-grad-op", 8))
FACTORS: dict[str, tuple] = {
    "model": ARCHS,
    "precision": ("bf16-mixed", "bf16-pure", "fp16-mixed", "fp8-mixed"),
    "checkpointing": ("none", "selective", "full"),
    "attention": ("sdpa", "eager"),
    "shape": ((1, 8192), (8, 1024)),  # micro-batch x sequence
    "loss": ("standard", "chunked"),
    "sharding": SHARDINGS,
    "tensor": (1, 2, 4),
}
LAYER_FACTORS = ("model", "precision", "checkpointing", "attention", "shape")
#: Depths of a layer-matrix cell: one layer = (deep - shallow) / 2. Not depth 1: Gemma-2 alternates
#: sliding and global attention, so its second mask kind (kept by checkpointing) first exists at 2.
LAYER_DEPTHS = (2, 4)
#: Models up to this many parameters are traced at full depth in the step matrix.
FULL_DEPTH_PARAMETERS = 2_700_000_000
EXTRAPOLATION_DEPTHS = (2, 3, 4)
CI_DEPTH = 2
#: The GPU the planner's checks are asked about (it supports every precision in FACTORS).
CHECK_GPU = "H100-80"


@functools.cache
def _refused(model: str, sharding: str, ranks: int, precision: str, attention: str, seq_len: int,
             tensor: int = 1, checkpointing: str = "none", loss: str = "standard") -> tuple[str, ...]:
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.engine.estimate import check_config
    from planner.strategies import PlanContext, TrainingConfig

    config = TrainingConfig(precision=precision, attention=attention, seq_len=seq_len, sharding=sharding,
                            checkpointing=checkpointing, loss=loss, **_tensor_fields(tensor))
    return tuple(check_config(PlanContext(resolve_model(model), parse_gpus(f"{ranks}x{CHECK_GPU}"), config)).infeasible)


def _tensor_fields(t: int) -> dict:
    return {"tensor_parallel": "transformers", "tp_size": t} if t > 1 else {}


def allowed(row: dict) -> bool:
    """Whether the planner offers the row's configuration (only the factors its checks read;
    checkpointing and loss only beside a tensor degree, whose rules read them)."""
    sharding, ranks = row.get("sharding", ("none", 1))
    t = row.get("tensor", 1)
    split = (t, row["checkpointing"], row["loss"]) if t > 1 else ()
    return not _refused(row["model"], sharding, ranks, row["precision"], row["attention"], row["shape"][1], *split)


def _product(names) -> list[dict]:
    rows = (dict(zip(names, values, strict=True)) for values in itertools.product(*(FACTORS[n] for n in names)))
    return [r for r in rows if allowed(r)]


def layer_matrix() -> list[dict]:
    """Every allowed combination of the factors that change what a layer saves (sharding none,
    standard loss)."""
    return [r | {"loss": "standard", "sharding": ("none", 1), "tensor": 1} for r in _product(LAYER_FACTORS)]


def full_matrix() -> list[dict]:
    """Every allowed combination of every factor (the space the covering arrays are drawn from)."""
    return _product(tuple(FACTORS))


def _tuples(row: dict, strength: int, pairs_of: tuple[str, ...] | None = None) -> Iterator[tuple]:
    groups = (itertools.combinations(FACTORS, strength) if pairs_of is None
              else itertools.chain(itertools.combinations(pairs_of, 2), ((n,) for n in FACTORS)))
    for names in groups:
        yield tuple((n, row[n]) for n in names)


def covering_array(strength: int, pairs_of: tuple[str, ...] | None = None) -> list[dict]:
    """Rows of the full matrix that cover every allowed tuple of ``strength`` factor values (with
    ``pairs_of``, strength 2: every pair of values of those factors, every value of the others)."""
    candidates = full_matrix()
    keyed = [(r, set(_tuples(r, strength, pairs_of))) for r in candidates]
    needed = set().union(*(k for _, k in keyed))
    chosen: list[dict] = []
    while needed:
        best, covered = max(keyed, key=lambda rk: len(rk[1] & needed))
        chosen.append(best)
        needed -= covered
    return chosen


def step_matrix() -> list[dict]:
    return covering_array(3)


def covering_subset() -> list[dict]:
    """The full test suite's rows: every allowed pair of factor values (hence every value)."""
    return covering_array(2)


#: The factors whose pairs CI's rows cover (``quick_subset``): those that decide which tensors a
#: layer saves and the loss's buffers; the model, the precision and the sharding each value once
#: (the full suite's ``covering_subset`` covers every pair).
QUICK_PAIRS = ("checkpointing", "attention", "shape", "loss")


def quick_subset() -> list[dict]:
    """CI's rows: every allowed pair of values of two ``QUICK_PAIRS`` factors, every value of
    every factor (8 rows: one per model)."""
    return covering_array(2, QUICK_PAIRS)


def depths(model: str, parameters: int, num_layers: int) -> tuple[int | None, ...]:
    """Depths a step-matrix cell is traced at: (None,) for full depth, else EXTRAPOLATION_DEPTHS."""
    return (None,) if parameters <= FULL_DEPTH_PARAMETERS or num_layers <= 4 else EXTRAPOLATION_DEPTHS


def plan_fields(row: dict) -> dict:
    """TrainingConfig fields of a matrix row (its world size apart: ``row["sharding"][1]``)."""
    b, s = row["shape"]
    return dict(checkpointing=row["checkpointing"], attention=row["attention"], micro_batch_size=b, seq_len=s,
                precision=row["precision"], loss=row["loss"], sharding=row["sharding"][0],
                **_tensor_fields(row.get("tensor", 1)))


def world(row: dict) -> int:
    return row["sharding"][1]


#: The safety target (issue 17): the step peak never more than 1 % under the trace; one layer's
#: activations within 2 %; the median |error| of every compared term at most 2 %.
PEAK_FLOOR = -0.01
LAYER_BAND = 0.02
MEDIAN_BAND = 0.02
def trace_request(row: dict, depth: int | None):
    """The traced probe's request for a row at ``depth`` layers (None: full depth). DDP is traced
    as one rank without sharding (DDP does not run under the trace)."""
    from planner.catalog.models import catalog
    from planner.probes.traced import TraceRequest
    from planner.strategies import TrainingConfig

    fields = plan_fields(row)
    if fields["sharding"] == "ddp":
        fields["sharding"] = "none"
    ranks = world(row) if fields["sharding"].startswith("fsdp") else 1
    return TraceRequest(config_json=catalog()[row["model"]].config, config=TrainingConfig(**fields), layers=depth,
                        world_size=ranks)
