"""The traced cross-validation matrix, in one place: its factors, the whole matrix
(benchmarks/traced_matrix.py) and a covering subset for CI (tests/test_traced.py).

Factors: architecture x checkpointing x attention x shape (micro-batch x sequence) x precision x
loss x sharding (none on one rank; FSDP2 at 2 and 8 ranks, one rank traced under a fake process
group). Constraint: Gemma-2 has no SDPA path in transformers (the planner rejects it too).

The covering subset holds every value of every factor and every pair of values of any two factors
at least once (a greedy all-pairs cover: each row added covers the most pairs not yet covered,
ties to the first in enumeration order, so the subset is the same on every run).
"""

import itertools
from collections.abc import Iterator

ARCHS = ("meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-0.5B", "mistralai/Mistral-7B-v0.3", "google/gemma-2-2b",
         "microsoft/Phi-3-mini-4k-instruct", "openai-community/gpt2")
FACTORS: dict[str, tuple] = {
    "model": ARCHS,
    "checkpointing": ("none", "selective", "full"),
    "attention": ("sdpa", "eager"),
    "shape": ((1, 512), (4, 128)),  # micro-batch x sequence
    "precision": ("bf16-mixed", "bf16-pure"),
    "loss": ("standard", "chunked"),
    "world": (1, 2, 8),  # sharding none on one rank; fsdp at 2 and 8 ranks
}
NO_SDPA_PREFIXES = ("google/gemma-2",)


def allowed(row: dict) -> bool:
    return not (row["attention"] == "sdpa" and row["model"].startswith(NO_SDPA_PREFIXES))


def full_matrix() -> list[dict]:
    """Every allowed combination of the factors, in enumeration order."""
    rows = (dict(zip(FACTORS, values)) for values in itertools.product(*FACTORS.values()))
    return [r for r in rows if allowed(r)]


def _pairs(row: dict) -> Iterator[tuple]:
    for a, b in itertools.combinations(FACTORS, 2):
        yield a, row[a], b, row[b]


def covering_subset() -> list[dict]:
    """Rows of the full matrix that cover every allowed pair of factor values (hence every value)."""
    candidates = full_matrix()
    needed = {p for row in candidates for p in _pairs(row)}
    chosen: list[dict] = []
    while needed:
        best = max(candidates, key=lambda r: sum(p in needed for p in _pairs(r)))
        chosen.append(best)
        needed -= set(_pairs(best))
    return chosen


def plan_fields(row: dict) -> dict:
    """TrainingConfig fields of a matrix row (its world size apart)."""
    b, s = row["shape"]
    return dict(checkpointing=row["checkpointing"], attention=row["attention"], micro_batch_size=b, seq_len=s,
                precision=row["precision"], loss=row["loss"], sharding="fsdp" if row["world"] > 1 else "none")
