"""Model catalog (data/models/*.json), local config.json files and the local Hugging Face cache.

``--model`` resolves, in order: a path to a config.json or to a folder holding one; a catalog
id or alias (case-insensitive); an id in the local Hugging Face cache
(``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``). Never the network.
"""

import difflib
import os
import re
from functools import cache
from pathlib import Path

from pydantic import ConfigDict

from planner.catalog import DATA_DIR
from planner.catalog.families import SUPPORTED_FAMILIES, spec_from_config
from planner.catalog.files import read_mapping
from planner.core.errors import PlannerInputError
from planner.core.record import Record
from planner.core.specs import ModelSpec

MODEL_DIR = DATA_DIR / "models"


class ModelFile(Record):
    """The schema of one catalog model file: the architecture fields of its config.json."""

    model_config = ConfigDict(extra="forbid")

    id: str
    aliases: list[str] = []
    source: str
    published_parameters: int | None = None
    published_parameters_source: str | None = None
    config: dict


@cache
def catalog() -> dict[str, ModelFile]:
    files = [ModelFile.model_validate_json(p.read_text()) for p in sorted(MODEL_DIR.glob("*.json"))]
    return {f.id: f for f in files}


@cache
def _index() -> dict[str, str]:
    return {name.lower(): f.id for f in catalog().values() for name in [f.id, *f.aliases]}


def _hub_cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _from_hub_cache(model_id: str) -> Path | None:
    """config.json of ``model_id`` in the local HF cache: the snapshot refs/main names, else the
    newest. A cache folder in another state than huggingface_hub leaves it (a ref that is no
    commit hash, entries that cannot be read) counts as missing those entries; the config found is
    read as any user file is (catalog/files.py)."""
    folder = "models--" + model_id.replace("/", "--")
    for root in _hub_cache_dirs():
        repo = root / folder
        try:
            if not repo.is_dir():
                continue
            snapshot = _ref_commit(repo / "refs" / "main")
            candidate = repo / "snapshots" / snapshot / "config.json" if snapshot else None
            if candidate is not None and candidate.is_file():
                return candidate
            configs = [(p.stat().st_mtime, p) for p in (repo / "snapshots").glob("*/config.json") if p.is_file()]
        except OSError:  # a loop of links, a folder it may not list
            continue
        if configs:
            return max(configs)[1]
    return None


def _ref_commit(ref: Path) -> str | None:
    """The snapshot a ref file names (huggingface_hub writes a commit hash): one folder name of
    letters, digits, '-' and '_', else None (never a path out of the snapshots folder)."""
    try:
        if not ref.is_file():
            return None
        with ref.open("rb") as f:
            text = f.read(128).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[0-9A-Za-z_-]{1,100}", text) else None


def _read_config(path: Path) -> dict:
    return read_mapping(path, "model config", hint="Pass a Hugging Face config.json (a JSON object).")


def resolve_model(ref: str) -> ModelSpec:
    """A ModelSpec for ``--model``: a path, a catalog id, or an id in the local HF cache."""
    config, model_id, source, published = _locate(ref)
    spec = spec_from_config(config, model_id=model_id, source=source, published=published)
    return _INTERNED.setdefault(spec, spec)


#: One instance per distinct ModelSpec resolved in this process: the cost model's formulas are
#: memoized on the spec, and a hit on the same instance skips pydantic's field-by-field equality.
_INTERNED: dict[ModelSpec, ModelSpec] = {}


def model_config(ref: str) -> dict:
    """The config.json mapping behind ``--model`` (what the traced probe builds the model from)."""
    return _locate(ref)[0]


def _locate(ref: str) -> tuple[dict, str, str, tuple]:
    if not ref.strip():
        raise PlannerInputError("--model is empty", hint="Give a catalog id (`planner models`) or a path to a config.json.")
    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise PlannerInputError(f"{path.parent} has no config.json",
                                    hint="Pass a model folder holding config.json, or the file itself.")
    if path.is_file():
        return _read_config(path), str(ref), str(path.resolve()), (None, None)
    model_id = _index().get(ref.lower())
    if model_id is not None:
        f = catalog()[model_id]
        return f.config, f.id, f.source, (f.published_parameters, f.published_parameters_source)
    cached = _from_hub_cache(ref)
    if cached is not None:
        return _read_config(cached), ref, str(cached), (None, None)
    close = difflib.get_close_matches(ref.lower(), list(_index()), n=5, cutoff=0.6)
    names = sorted({_index()[c] for c in close})
    hint = f"Did you mean: {', '.join(names)}?\n" if names else ""
    raise PlannerInputError(
        f"unknown model {ref!r}: not a file, not in the catalog, not in the local Hugging Face cache",
        hint=f"{hint}Pass a path to the model's config.json (or its folder) for any {', '.join(SUPPORTED_FAMILIES)} "
        "model; `planner models` lists the catalog.",
    )
