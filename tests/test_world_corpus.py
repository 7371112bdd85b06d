"""planner against published measurements of real runs (benchmarks/world/, docs/world.md): every
case carries its provenance, the mapping onto planner's vocabulary refuses what it cannot say,
and the committed page is what the corpus and today's model make."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import world_corpus  # noqa: E402

CASES = world_corpus.load("peaks.yaml") + world_corpus.load("throughputs.yaml")


def test_every_case_says_where_it_comes_from_and_what_it_measured():
    assert len(world_corpus.load("peaks.yaml")) >= 30 and len(world_corpus.load("throughputs.yaml")) >= 10
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids))
    for c in CASES:
        assert str(c.get("source", "")).startswith("http"), c["id"]
        assert len(str(c.get("quote", "")).strip()) >= 12, c["id"]
        assert c.get("metric") and (c.get("hardware") or {}).get("gpu"), c["id"]


def test_what_the_vocabulary_cannot_say_is_refused_with_the_reason():
    base = {"id": "x", "hardware": {"gpu": "A100-80GB", "gpus_per_node": 1}, "model": "meta-llama/Llama-3.1-8B",
            "method": "lora", "seq_len": 2048}
    assert world_corpus.request(base | {"hardware": {"gpu": "TPU v5e"}}).refused.startswith("GPU 'TPU v5e'")
    assert "neither all-linear nor attention" in world_corpus.request(base | {"lora": {"targets": "q_proj,up_proj"}}).refused
    assert "not in planner's vocabulary" in world_corpus.request(base | {"optimizer": "sophia"}).refused
    attention = world_corpus.request(base | {"lora": {"targets": "q_proj,v_proj", "rank": 8}})
    assert attention.fields["lora_targets"] == "attention" and any("as attention" in a for a in attention.assumed)


def test_docs_world_is_what_the_corpus_makes():
    assert (ROOT / "docs" / "world.md").read_text() == world_corpus.page()
