"""The model catalog: exact parameter counts, resolution of --model, clear errors."""

import json

import pytest

from planner.catalog.models import catalog, resolve_model
from planner.core.errors import PlannerInputError
from planner.cost import params

REQUIRED = [
    "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B", "meta-llama/Llama-2-7b-hf", "mistralai/Mistral-7B-v0.1", "mistralai/Mixtral-8x7B-v0.1",
    "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-72B", "google/gemma-2-9b",
    "microsoft/Phi-3-mini-4k-instruct", "openai-community/gpt2", "openai-community/gpt2-xl",
]
FAMILIES = {"llama", "mistral", "qwen2", "qwen3", "mixtral", "gemma", "gemma2", "smollm3", "phi3", "starcoder2",
            "gpt2"}


def test_catalog_has_required_models_and_families():
    assert set(REQUIRED) <= set(catalog())
    assert {resolve_model(m).family for m in catalog()} == FAMILIES


def test_llama_3_1_8b_exact():
    assert params.total_parameters(resolve_model("meta-llama/Llama-3.1-8B")) == 8_030_261_248


@pytest.mark.parametrize("model_id", sorted(m for m, f in catalog().items() if f.published_parameters))
def test_count_matches_published(model_id):
    f = catalog()[model_id]
    assert f.published_parameters_source
    assert params.total_parameters(resolve_model(model_id)) == f.published_parameters


def test_mixtral_active_parameters_match_mistral_figure():
    # Mistral AI, "Mixtral of experts" (2023-12-11): 46.7B total, 12.9B used per token.
    m = resolve_model("mistralai/Mixtral-8x7B-v0.1")
    assert params.total_parameters(m) == 46_702_792_704
    assert params.active_parameters(m) == pytest.approx(12.9e9, rel=0.005)
    dense = resolve_model("meta-llama/Llama-3.1-8B")
    assert params.active_parameters(dense) == params.total_parameters(dense)


def test_aliases_are_unique_and_resolve_case_insensitively():
    names = [n.lower() for f in catalog().values() for n in [f.id, *f.aliases]]
    assert len(names) == len(set(names))
    assert resolve_model("META-LLAMA/llama-3.1-8b-instruct").id == "meta-llama/Llama-3.1-8B"
    assert resolve_model("gpt2").id == "openai-community/gpt2"


def test_config_json_path_and_folder(tmp_path):
    cfg = dict(catalog()["Qwen/Qwen2.5-0.5B"].config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_file = resolve_model(str(tmp_path / "config.json"))
    by_dir = resolve_model(str(tmp_path))
    assert params.total_parameters(by_file) == params.total_parameters(by_dir) == 494_032_768


def test_local_hf_cache(tmp_path, monkeypatch):
    repo = tmp_path / "models--acme--tiny-llama"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    cfg = dict(catalog()["HuggingFaceTB/SmolLM2-135M"].config)
    (snap / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = resolve_model("acme/tiny-llama")
    assert spec.source.endswith("abc123/config.json")
    assert params.total_parameters(spec) == 134_515_008


def test_unknown_model_names_close_matches_and_config_json():
    with pytest.raises(PlannerInputError) as e:
        resolve_model("meta-llama/Llama-3.1-8")
    assert "meta-llama/Llama-3.1-8B" in e.value.message
    assert "config.json" in e.value.message


@pytest.mark.parametrize(
    "content, needle",
    [("{", "not valid JSON"), ("[1, 2]", "JSON object"), ('{"model_type": "bert"}', "not supported"),
     ('{"model_type": "llama"}', "lacks"),
     ('{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 0, "num_hidden_layers": 2,'
      ' "intermediate_size": 8, "vocab_size": 10}', "unusable"),
     ('{"model_type": "gpt2", "n_layer": -1}', "unusable"), ('{"model_type": "llama", "hidden_size": "x", "num_attention_heads": 2}', "config.json")],
)
def test_bad_config_files_are_clear_errors(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(PlannerInputError) as e:
        resolve_model(str(path))
    assert needle in e.value.message


@pytest.mark.parametrize("model_id", sorted(catalog()))
def test_count_equals_transformers_on_meta_device(model_id):
    """Build the real architecture with transformers on the meta device and count exactly."""
    meta = pytest.importorskip("planner.probes.meta_model")
    model = meta.build_on_meta(catalog()[model_id].config)
    spec = resolve_model(model_id)
    assert params.total_parameters(spec) == meta.count_parameters(model)
    assert params.layer_parameters(spec) == meta.count_parameters(meta.decoder_layers(model)[0])
    assert len(meta.decoder_layers(model)) == spec.num_layers


@pytest.mark.parametrize("ref, layout", [
    (b"\xff\xfe not text", "ref"),  # UnicodeDecodeError reading refs/main (the fuzzer's class)
    (b"../../../../etc", "ref"),  # a path out of the snapshots folder: not followed
    (b"abc123", "loop"),  # config.json a link to itself: skipped, then refused as unknown
])
def test_a_hf_cache_in_an_odd_state_is_read_or_refused_cleanly(tmp_path, monkeypatch, ref, layout):
    repo = tmp_path / "models--acme--odd"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_bytes(ref)
    if layout == "loop":
        (snap / "config.json").symlink_to("config.json")
    else:
        (snap / "config.json").write_text(json.dumps(dict(catalog()["HuggingFaceTB/SmolLM2-135M"].config)))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    if layout == "loop":
        with pytest.raises(PlannerInputError, match="unknown model"):
            resolve_model("acme/odd")
    else:  # the ref is not used; the newest snapshot is
        assert resolve_model("acme/odd").source.endswith("abc123/config.json")
