"""One contract, every registered strategy."""

import itertools

import pytest

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.core.ledger import TERMS, LedgerDraft
from planner.core.vocabulary import TrainingConfig
from strategies import REGISTRY, Check, PlanContext

CONTEXTS = [
    PlanContext(resolve_model(m), parse_gpus(g), TrainingConfig(**c))
    for m, g, c in itertools.product(
        ["meta-llama/Llama-3.1-8B", "openai-community/gpt2", "mistralai/Mixtral-8x7B-v0.1"],
        ["1xA100-40", "8xH100-80", "2x8xV100-32"],
        [{}, {"sharding": "zero3", "offload": "optimizer+params", "optimizer": "lion"},
         {"sharding": "fsdp", "precision": "bf16-pure", "checkpointing": "full", "loss": "chunked"},
         {"optimizer": "paged-adamw-8bit", "attention": "eager", "checkpointing": "selective", "grad_accum": 4}],
    )
]


def test_registry_covers_every_technique_once():
    fields = [s.field for s in REGISTRY]
    assert len(fields) == len(set(fields))
    techniques = set(TrainingConfig.model_fields) - {"micro_batch_size", "grad_accum", "seq_len"}
    assert set(fields) == techniques


@pytest.mark.parametrize("strategy", REGISTRY, ids=lambda s: s.field)
def test_strategy_contract(strategy):
    enum = type(TrainingConfig.model_fields[strategy.field].default)
    assert strategy.choices == tuple(enum)
    for ctx in CONTEXTS:
        check = Check()
        strategy.check(ctx, check)  # never raises; reasons are plain sentences
        assert all(isinstance(x, str) and x for x in check.infeasible + check.warnings)
        draft = LedgerDraft()
        for s in REGISTRY[: REGISTRY.index(strategy) + 1]:
            s.apply(ctx, draft)
        assert all(row.term in TERMS and row.bytes >= 0 and row.shard >= 1 for row in draft.rows)
