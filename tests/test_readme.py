"""Every command in the README works, and its quoted output has not drifted.

The README's contract (written for this test):
- its first code block holds exactly the two first-line commands (set up and run the main job; set
  up and run all tests, ``bash .ci/run``); the planner command of the first is run here;
- every ``console`` block is a session: lines starting ``$ `` are commands, run in order in one
  scratch folder (so ``--out plan`` then ``planner check --job-dir plan`` works), with COLUMNS=80 and
  no network; the lines after a command are its output, trimmed: each must appear in the real
  output (spaces collapsed), in order; ``...`` stands for lines left out.
A command's exit code must be 0, or the one written after it as ``# exit N``.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    return BLOCK.findall(README.read_text())


def _sessions() -> list[tuple[str, int, list[str]]]:
    """(command, expected exit code, quoted output lines) in README order."""
    out = []
    for lang, body in _blocks():
        if lang != "console":
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                cmd, _, code = line[2:].partition("# exit ")
                out.append((cmd.strip(), int(code or 0), []))
            elif out and line.strip():
                out[-1][2].append(line)
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(cmd)
    assert argv[0] == "planner", f"README commands run planner only: {cmd}"
    env = os.environ | {"COLUMNS": "80", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-P", "-m", "planner", *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_readme_opens_with_the_two_commands():
    lang, first = _blocks()[0]
    lines = [x for x in first.splitlines() if x.strip()]
    assert len(lines) == 2 and lines[1].strip() == "bash .ci/run", lines
    assert "planner suggest" in lines[0] and "pip install" in lines[0]


def test_the_first_command_runs(tmp_path):
    first = [x for x in _blocks()[0][1].splitlines() if x.strip()][0]
    planner = first[first.index(".venv/bin/planner"):].replace(".venv/bin/planner", "planner", 1)
    r = _run(planner, tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr


def test_every_console_command_runs_and_its_quoted_output_holds(tmp_path):
    sessions = _sessions()
    assert len(sessions) >= 5, "the README shows too few commands"
    for cmd, code, quoted in sessions:
        r = _run(cmd, tmp_path)
        assert r.returncode == code and "Traceback" not in r.stderr, (cmd, r.returncode, r.stderr[-2000:])
        shown = [_norm(x) for x in (r.stdout + r.stderr).splitlines()]
        at = 0
        for want in quoted:
            if want.strip() == "...":
                continue
            hit = next((i for i in range(at, len(shown)) if _norm(want) in shown[i]), None)
            assert hit is not None, f"{cmd}: quoted line drifted or out of order:\n  {want!r}\n" + "\n".join(shown)
            at = hit + 1


@pytest.mark.parametrize("path", ["docs/reference.md", "docs/architecture.md"])
def test_the_readme_links_resolve(path):
    assert path in README.read_text() and (README.parent / path).exists()


@pytest.mark.parametrize("path", ["README.md", "docs/reference.md"])
def test_the_numerics_ladder_is_the_registrys(path):
    """The ladder the docs state is the one the strategies declare (strategies.LADDER), and every
    optimizer value is in the reference's vocabulary table."""
    from planner.core.numerics import ladder_phrase
    from planner.strategies import BY_FIELD, LADDER

    text = " ".join((README.parent / path).read_text().split())
    assert ladder_phrase(LADDER) in text
    if path == "docs/reference.md":
        cell = text.split("| `--optimizer` |")[1].split("|")[0]
        assert all(f"`{v}`" in cell for v in BY_FIELD["optimizer"].choices)
