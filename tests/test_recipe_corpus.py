"""The real job files of tests/data/recipes (issue 19's corpus): every file has a provenance row
(repository, path, a 40-hex commit, a kind) and every row a file, so the corpus stays traceable."""

import csv
import re
from pathlib import Path

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
