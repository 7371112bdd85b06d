"""The package as users install it: one top-level import package (planner) under its own
distribution name (planner.core.distribution), every install line it prints naming that
distribution, every data file the code reads shipped as package data, and under CI (.ci/run builds
a wheel and installs it, PLANNER_TEST_INSTALLED=1) the suite runs against that installed wheel,
never the source tree beside it."""

import os
from pathlib import Path

import pytest

import planner
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
    import planner.probes
    import planner.strategies

    site = Path(planner.__file__).resolve().parent
    assert site != ROOT / "planner" and site.parent.name == "site-packages", site
    for package, folder in ((planner.strategies, "strategies"), (planner.probes, "probes")):
        where = Path(package.__file__).resolve().parent
        assert where == site / folder, f"{package.__name__} imported from {where}, not the installed {site / folder}"


def _installed() -> bool:
    return os.environ.get("PLANNER_TEST_INSTALLED") == "1"


def test_the_distribution_is_named_as_planner_says():
    """pyproject.toml's name is the one every install line prints, and it is what is installed here
    (``planner`` on the public index is an unrelated project)."""
    import tomllib
    from importlib.metadata import version

    from planner.core.distribution import DIST

    from planner.cli.version import version as planner_version

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == DIST != "planner"
    assert planner_version() == version(DIST) != "unknown"


def test_the_wheel_installs_one_top_level_package():
    """What pip installed (the wheel's RECORD) is one import package, planner, beside its
    dist-info and the ``planner`` command: no top-level strategies or probes to clash with the
    public packages of those names."""
    if not _installed():
        pytest.skip("the RECORD of a built wheel: the CI run (PLANNER_TEST_INSTALLED=1, .ci/run)")
    import importlib.util
    from importlib.metadata import files

    from planner.core.distribution import DIST

    tops = {f.parts[0] for f in files(DIST) or [] if f.parts[0] != ".." and not f.parts[0].endswith(".dist-info")}
    assert tops == {"planner"}, tops
    assert {"strategies", "probes"} <= {f.parts[1] for f in files(DIST) or [] if f.parts[0] == "planner" and len(f.parts) > 2}
    assert importlib.util.find_spec("strategies") is None and importlib.util.find_spec("probes") is None


def test_the_source_tree_has_the_installed_layout():
    """planner/strategies and planner/probes are links to the repository's own folders, so the
    source tree, the editable install and the wheel import the same names (mypy reads them there)."""
    for name in ("strategies", "probes"):
        link = ROOT / "planner" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), link


def _printed_install_lines(text: str) -> list[str]:
    import re
    import shlex

    return [shlex.split(m)[2:] for m in re.findall(r"pip install [^\n`]*?'[^']+'", text)]


def test_no_source_prints_an_install_line_of_another_name():
    """Every ``pip install`` of this project that planner prints is built by
    planner.core.distribution.install_line: no literal names ``planner[...]`` or a checkout (``.``)."""
    import re

    bad = re.compile(r"pip install (-\S+ )*'?(planner\b|\.\[|-e )")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("planner", "strategies", "probes")
             for p in (ROOT / folder).rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert not found, found


def test_the_printed_install_lines_install_this_project(tmp_path):
    """PLAN.md's install line, the launch's missing-package line and the probe's hint resolve,
    offline, to this distribution: against what is installed (pip's dry run, no index), and under CI
    against the built wheel in a local folder (dist/, as ``--find-links``)."""
    import subprocess
    import sys

    from planner.core.distribution import DIST, install_line
    from planner.emit import build_files, single_plan_result
    from planner.launch.train import _missing_module_message

    from helpers import run

    plan = run(str(ROOT / "tests" / "data" / "tiny-llama"), "1xA100-80", micro_batch_size=2, seq_len=64,
               precision="bf16-mixed", sharding="zero2")
    assert plan.feasible, plan.reasons
    doc = build_files(single_plan_result(plan))["PLAN.md"]
    lines = _printed_install_lines(doc) + _printed_install_lines(
        _missing_module_message("deepspeed", ModuleNotFoundError("deepspeed"))) + _printed_install_lines(
        install_line(["probes"]))
    assert len(lines) == 3 and all(line[-1].startswith(DIST + "[") for line in lines), lines
    assert lines[0][-1] == f"{DIST}[train,deepspeed]", lines[0]
    pip = [sys.executable, "-P", "-m", "pip", "install", "--dry-run", "--no-index", "--quiet",
           "--disable-pip-version-check"]
    for line in lines:
        done = subprocess.run(pip + ["--find-links", str(tmp_path), *line], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stderr[-2000:])
    if _installed():
        wheels = ROOT / "dist"
        assert list(wheels.glob("llm_train_planner-*.whl")), "no built wheel in dist/"
        done = subprocess.run(pip + ["--find-links", str(wheels), "--ignore-installed", "--no-deps", lines[0][-1]],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]


def test_every_child_python_a_test_starts_imports_the_installed_planner():
    """A child started with ``python -m`` or ``python -c`` puts its working directory first on its
    path: from the repository root it would import the source tree, not the wheel CI installed.
    Every such child in the tests is started with ``-P`` (a script's own folder is not the root)."""
    import re

    pattern = re.compile(r"sys\.executable,\s*(\"-[mc]\")")
    found = [f"{p.name}:{text[:m.start()].count(chr(10)) + 1}" for p in sorted(Path(__file__).parent.glob("*.py"))
             for text in [p.read_text()] for m in pattern.finditer(text)]
    assert not found, found
