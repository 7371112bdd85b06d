"""A tiny model folder as a user has one: config, random weights and a tokenizer (a byte-level BPE
trained on planner's sample text), built offline from tests/data/tiny-llama/config.json by the
builder the GPU validation uses too (planner/launch/model_folder.py)."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
CONFIG = ROOT / "tests" / "data" / "tiny-llama" / "config.json"


def make_tiny_model(out: Path, seed: int = 0) -> Path:
    from planner.launch.model_folder import make_model_folder

    return make_model_folder(json.loads(CONFIG.read_text()), out, seed=seed)
