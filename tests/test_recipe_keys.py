"""Recipe keys across library versions (planner/check/recipe_keys.py, data/recipe_keys.json)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.check.job_files import known_keys
from planner.check.recipe_keys import read_recipe_keys, recipe_keys

ROOT = Path(__file__).resolve().parent.parent


def test_the_newest_transformers_key_set_is_the_installed_one():
    """The shipped per-version sets end at the transformers the package is tested with: its
    TrainingArguments fields are exactly known_keys.json's (itself kept equal to the installed
    library by tests/test_check.py)."""
    versions, keys = recipe_keys()["transformers"]
    newest = len(versions) - 1
    assert {k for k, ix in keys.items() if newest in ix} == set(known_keys()["training_args"])


def test_version_bound_keys_warn_with_their_versions_and_the_current_name():
    problems, warnings = read_recipe_keys({"evaluation_strategy": "steps", "overwrite_output_dir": True},
                                          known_keys()["training_args"], "r.yaml")
    assert problems == []
    assert len(warnings) == 1 and "evaluation_strategy (transformers 4.36.2 to 4.4" in warnings[0]
    assert "(did you mean eval_strategy?)" in warnings[0] and "overwrite_output_dir" in warnings[0]


def test_trl_and_framework_keys_pass_and_a_typo_is_refused_with_did_you_mean():
    ok = {"beta": 0.1, "use_vllm": True, "packing": True, "model_name_or_path": "x", "torch_dtype": "bfloat16",
          "dataset_mixture": {}, "lora_r": 8, "reward_funcs": ["accuracy"], "dataset_mixer": {}}
    assert read_recipe_keys(ok, known_keys()["training_args"], "r.yaml") == ([], [])
    problems, _ = read_recipe_keys({"learning_rat": 1e-5, "zzz_not_a_key": 1}, known_keys()["training_args"], "r.yaml")
    assert len(problems) == 1 and "learning_rat (did you mean learning_rate?)" in problems[0]
    assert "zzz_not_a_key" in problems[0] and "zzz_not_a_key (did you mean" not in problems[0]


def test_the_tool_reads_dataclass_fields_from_source(tmp_path):
    """tests/tools/recipe_keys.py on a framework file: the classes extending TRL's, their subclasses
    and *Arguments classes count; a nested dataset entry does not."""
    src = tmp_path / "configs.py"
    src.write_text("import trl\nfrom dataclasses import dataclass\n"
                   "@dataclass\nclass DatasetConfig:\n    id: str = ''\n"
                   "@dataclass\nclass ScriptArguments(trl.ScriptArguments):\n    dataset_mixture: dict = None\n"
                   "@dataclass\nclass GRPOScriptArguments(ScriptArguments):\n    reward_funcs: list = None\n")
    out = tmp_path / "keys.json"
    subprocess.run([sys.executable, str(ROOT / "tests/tools/recipe_keys.py"), str(out), f"demo@abc={src}"], check=True)
    data = json.loads(out.read_text())["demo"]
    assert data["versions"] == ["abc"] and set(data["keys"]) == {"dataset_mixture", "reward_funcs"}


@pytest.mark.parametrize("library, minimum", [("transformers", 10), ("trl", 10)])
def test_the_shipped_sets_span_the_versions_people_pin(library, minimum):
    versions, keys = recipe_keys()[library]
    assert len(versions) >= minimum and len(keys) > 100
