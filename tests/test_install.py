"""The package as users install it: every data file the code reads ships as package data, and
under CI (.ci/run builds a wheel and installs it, PLANNER_TEST_INSTALLED=1) the suite runs against
that installed wheel, never the source tree beside it."""

import os
from pathlib import Path

import pytest

import planner
import probes
import strategies
from planner.catalog import DATA_DIR

ROOT = Path(__file__).resolve().parent.parent


def test_the_data_files_are_where_the_package_reads_them():
    for name in ("efficiency.yaml", "known_keys.json"):
        assert (DATA_DIR / name).is_file(), name
    assert len(list((DATA_DIR / "gpus").glob("*.yaml"))) >= 20
    assert len(list((DATA_DIR / "models").glob("*.json"))) >= 30


def test_pyproject_ships_every_data_file_the_source_tree_has():
    """Every file under planner/catalog/data matches a package-data pattern of pyproject.toml (the
    rule that left efficiency.yaml and known_keys.json out of a non-editable install)."""
    import fnmatch
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["planner.catalog"]
    data = ROOT / "planner" / "catalog"
    files = [p.relative_to(data).as_posix() for p in (data / "data").rglob("*") if p.is_file()]
    assert files and not [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)]


def test_the_suite_runs_against_the_installed_package():
    if os.environ.get("PLANNER_TEST_INSTALLED") != "1":
        pytest.skip("not the CI run of an installed wheel (PLANNER_TEST_INSTALLED=1, .ci/run)")
    for package in (planner, strategies, probes):
        where = Path(package.__file__).resolve().parent
        assert where != ROOT / package.__name__, f"{package.__name__} imported from the source tree: {where}"
        assert where.parent.name == "site-packages", where
