"""The real job files of tests/data/recipes (issue 19's corpus): every file has a provenance row
(repository, path, a 40-hex commit, a kind) and every row a file, so the corpus stays traceable."""

import csv
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent / "data" / "recipes"
KINDS = {"accelerate", "deepspeed", "trl_recipe", "llamafactory", "axolotl"}


def test_every_file_has_its_provenance_and_every_row_its_file():
    rows = list(csv.DictReader((ROOT / "provenance.csv").open()))
    files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()} - {"provenance.csv", "PROVENANCE.md"}
    assert {r["local_path"] for r in rows} == files
    assert len(rows) >= 40
    for r in rows:
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]), r
        assert r["kind"] in KINDS and r["repo"].count("/") == 1 and r["local_path"].endswith(r["path"]), r
        assert r["published_outcome"], r


def _rows(kind: str) -> list[dict]:
    return [r for r in csv.DictReader((ROOT / "provenance.csv").open()) if r["kind"] == kind]


def test_every_trl_recipe_is_read_without_a_refusal():
    """Each TRL-style recipe (alignment-handbook, open-r1, TRL's CLI example) as the Trainer
    arguments of a check: no key refused (TrlParser's dataclasses: TRL configs, ModelConfig, the
    frameworks' script arguments; a refusal raises), and its workload read from the file."""
    import yaml

    from planner.check import CheckRequest, check

    rows = _rows("trl_recipe")
    assert len(rows) >= 18
    for row in rows:
        path = ROOT / row["local_path"]
        result = check(CheckRequest(model="meta-llama/Llama-3.1-8B", gpus="8xH100-80", alternatives=0,
                                    training_args=path))
        for key, field in (("per_device_train_batch_size", "micro_batch_size"), ("gradient_accumulation_steps",
                                                                                 "grad_accum")):
            if key in yaml.safe_load(path.read_text()):
                assert result.sources[field].endswith(key), (row["local_path"], result.sources[field])


def test_a_handbook_qlora_recipe_is_read_as_its_qlora_plan():
    """alignment-handbook's zephyr-7b-beta QLoRA SFT recipe: TRL's use_peft, load_in_4bit, lora_r 16,
    lora_alpha 16 and every projection targeted read as qlora r16 all-linear."""
    from planner.check import CheckRequest, check

    path = ROOT / "huggingface__alignment-handbook/recipes/zephyr-7b-beta/sft/config_qlora.yaml"
    result = check(CheckRequest(model="mistralai/Mistral-7B-v0.1", gpus="1xA100-80", alternatives=0, training_args=path))
    c = result.estimate.config
    assert (c.adapter, c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_targets) == ("qlora", 16, 16, 0.05, "all-linear")
    assert (c.micro_batch_size, c.grad_accum, c.seq_len, c.checkpointing) == (4, 2, 2048, "full")


def test_parameter_only_offload_is_not_read_as_full_offload():
    """axolotl's zero3_bf16_cpuoffload_params.json (offload_param without offload_optimizer) on
    Llama-3.1-70B, 8xH100-80: DeepSpeed keeps the fp32 masters, Adam moments and gradients on the
    GPU (12 B per parameter / 8 ranks = 98.6 GiB of optimizer state alone), so the job will not fit
    (exit 1); it was read as optimizer+params offload and given FITS at 70.6 GiB."""
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.core.ledger import Location

    path = ROOT / "axolotl-ai-cloud__axolotl/deepspeed_configs/zero3_bf16_cpuoffload_params.json"
    out = CliRunner().invoke(app, ["check", "--model", "meta-llama/Llama-3.1-70B", "--gpus", "8xH100-80",
                                   "--deepspeed-config", str(path), "--json"])
    assert out.exit_code == 1, out.output
    result = json.loads(out.output)
    assert result["estimate"]["config"]["offload"] == "params"
    from planner.check import CheckRequest, check

    est = check(CheckRequest(model="meta-llama/Llama-3.1-70B", gpus="8xH100-80", deepspeed_config=path,
                             alternatives=0)).estimate
    gpu = {t: sum(r.bytes for r in est.ledger if r.term == t and r.location == Location.GPU)
           for t in ("master_weights", "optimizer_states", "weights")}
    assert (gpu["master_weights"] + gpu["optimizer_states"]) / 2**30 == pytest.approx(70.55e9 * 12 / 8 / 2**30, rel=0.01)
    assert gpu["weights"] < 2**30  # the 16-bit partition is on the host (a few small persistent tensors stay)
