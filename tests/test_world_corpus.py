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
    assert "none of all-linear, attention, qv and mlp" in world_corpus.request(base | {"lora": {"targets": "q_proj,up_proj"}}).refused
    assert "not in planner's vocabulary" in world_corpus.request(base | {"optimizer": "sophia"}).refused
    fitted = world_corpus.request(base | {"calibrates": "Ada's saturation_tokens"})
    assert any(a.startswith("calibrates Ada's saturation_tokens") for a in fitted.assumed)  # in-sample: not counted
    assert not world_corpus.Row("x", "", "", "", 1.0, "; ".join(fitted.assumed)).stated
    prepared = world_corpus.request(base | {"method": "qlora", "kbit_prep": "fp32"})
    assert prepared.fields["kbit_prep"] == "fp32" and not prepared.refused
    qv = world_corpus.request(base | {"lora": {"targets": "v_proj,q_proj", "rank": 8}})
    assert qv.fields["lora_targets"] == "qv" and not any("lora targets" in a for a in qv.assumed)
    attention = world_corpus.request(base | {"lora": {"targets": "q_proj,k_proj,v_proj", "rank": 8}})
    assert attention.fields["lora_targets"] == "attention" and any("as attention" in a for a in attention.assumed)


def test_docs_world_is_what_the_corpus_makes():
    assert (ROOT / "docs" / "world.md").read_text() == world_corpus.page()


def _bytes(text: str) -> float:
    """'20.52 GiB' -> bytes (PyTorch's message prints GiB, MiB, KiB or bytes)."""
    value, unit = text.split()[:2]
    return float(value) * {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1}[unit]


def test_every_out_of_memory_message_says_what_its_record_holds():
    """The allocator figures (benchmarks/world/oom_fragmentation.yaml): each record's allocated and
    reserved-unallocated memory appear in its quoted message, and its fraction is theirs (old
    format: reserved in total less already allocated, over already allocated), to the message's
    two printed decimals."""
    records = world_corpus.load("oom_fragmentation.yaml")
    assert sum(r["group"] == "default" and r["category"] != "ci_test" for r in records) >= 40
    for r in records:
        assert str(r["url"]).startswith("https://"), r["id"]
        if r["allocated_by_pytorch"]:
            used, spare = r["allocated_by_pytorch"], r["reserved_unallocated"]
            assert f"{used} is allocated by PyTorch" in r["quote"] and f"{spare} is reserved" in r["quote"], r["id"]
            allocated, free = _bytes(used), _bytes(spare)
        else:
            assert f"{r['already_allocated']} already allocated" in r["quote"], r["id"]
            assert f"{r['reserved_total']} reserved in total" in r["quote"], r["id"]
            allocated = _bytes(r["already_allocated"])
            free = _bytes(r["reserved_total"]) - allocated
        fraction = r["computed"]["fraction_unallocated_over_allocated"]
        assert abs(fraction - free / allocated) <= 0.01 * 2**30 / allocated + 1e-4, (r["id"], fraction, free / allocated)


def test_a_published_peak_below_the_model_states_is_not_counted():
    """Llama-3.2-1B has 1,235,814,400 parameters (tied embeddings); trained bf16-pure with torch's
    foreach AdamW (LitGPT's torch.optim.AdamW; its step scalars are host tensors) it holds 2 + 2 +
    4 bytes each at its step. LitGPT's 8.70 GB row is below that: shown, not counted."""
    case = next(c for c in world_corpus.load("peaks.yaml") if c["id"] == "litgpt-llama32-1b-full-1xa10g")
    plan = world_corpus.estimate_case(world_corpus.request(case).fields)
    assert world_corpus.model_states_bytes(plan) == 8 * 1_235_814_400
    row = world_corpus.peak_rows([case])[0]
    assert world_corpus.published_bytes(case) < world_corpus.model_states_bytes(plan)
    assert row.notes.startswith(world_corpus.BELOW) and not row.stated


def test_no_run_that_ran_out_of_memory_is_said_to_fit():
    """Every published out-of-memory run is one planner says does not fit, even with no margin (no
    broken promise hidden by the margin), and the completed runs said not to fit with the default
    margin (its false alarms) are at most three, each a run whose published peak filled 90 % or
    more of its card."""
    from planner.catalog.gpus import parse_gpus

    cases = {c["id"]: c for c in world_corpus.load("peaks.yaml")}
    rows = world_corpus.verdict_rows(list(cases.values()))
    ooms = [r for r in rows if r[1] == "out of memory"]
    assert len(ooms) >= 10 and all(r[4] == "yes" for r in ooms), [r for r in ooms if r[4] != "yes"]
    ran = [r for r in rows if r[1] == "ran"]
    alarms = [r for r in ran if r[3] != "yes"]
    assert len(ran) >= 25 and len(alarms) <= 3, alarms
    for r in alarms:
        case = cases[r[0]]
        card = parse_gpus(world_corpus.request(case).fields["gpus"]).gpu.memory_bytes
        assert world_corpus.published_bytes(case) >= 0.9 * card, r
