"""Every screen reads at 80, 100 and 120 columns: the real command's output (a child process with
COLUMNS set, stdout a pipe) has no line wider than the width, no number cut ('…') or missing, the
verdict first and the next command last.

Each screen is captured once per width and each --json once per worker (functools.cache). The
nothing-fits search is the slow one: its result is taken once (--json) and rendered at each width by
the renderer the command uses."""

import functools
import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from rich.console import Console

from planner.core.formatting import count

from helpers import covering

LLAMA = "meta-llama/Llama-3.1-8B"
WIDTHS = (80, 100, 120)
GIB = 2**30

CASES = {
    "suggest-1xA100": ["suggest", "--model", LLAMA, "--gpus", "1xA100-40"],
    "suggest-8xH100": ["suggest", "--model", LLAMA, "--gpus", "8xH100-80", "--tokens", "1e9",
                       "--price-per-gpu-hour", "2.5"],
    "estimate-fits": ["estimate", "--model", LLAMA, "--gpus", "8xH100-80", "--sharding", "fsdp", "--mbs", "4",
                      "--grad-accum", "2", "--loss", "chunked"],
    "estimate-miss": ["estimate", "--model", LLAMA, "--gpus", "1xA100-40"],
    "models": ["models"],
    "gpus": ["gpus"],
}
NOTHING_FITS = ["suggest", "--model", "meta-llama/Llama-3.1-405B", "--gpus", "1xRTX4090-24"]


def planner(args: list[str], width: int | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    env.pop("COLUMNS", None)
    if width:
        env["COLUMNS"] = str(width)
    r = subprocess.run([sys.executable, "-P", "-m", "planner", *args], check=False, capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r


@functools.cache
def screen(args: tuple[str, ...], width: int) -> str:
    return planner(list(args), width).stdout


@functools.cache
def result(args: tuple[str, ...]):
    return json.loads(planner([*args, "--json"]).stdout)


@functools.cache
def job_dir(root: str) -> str:
    """A planner job directory (suggest --out); the --out screen is checked on the way."""
    out = os.path.join(root, "job")
    r = planner([*CASES["suggest-1xA100"], "--out", out], 80)
    assert os.path.exists(os.path.join(out, "launch.sh")) and "wrote" in r.stderr and "wrote" not in r.stdout
    readable(r.stdout, 80)
    assert f"{out}/launch.sh" in last_lines(r.stdout) and f"planner check --job-dir {out}" in last_lines(r.stdout)
    return out


def check_args(root) -> tuple[str, ...]:
    return ("check", "--job-dir", job_dir(str(root)), "--model", LLAMA, "--gpus", "1xA100-40")


def readable(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    assert lines, "nothing printed"
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}: {too_wide[:3]}"
    assert "…" not in text, "a cell was cut"
    return lines


def flat(text: str) -> str:
    """The text with every run of spaces and line breaks as one space: a phrase may wrap between
    words, a number never (a number cut by a wrap would read as two)."""
    return " ".join(text.split())


def first_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.strip())


def last_lines(text: str, n: int = 6) -> str:
    """The last ``n`` non-empty lines, joined with shell continuations undone."""
    lines = [line for line in text.splitlines() if line.strip()][-n:]
    return " ".join(line.strip().removesuffix("\\").strip() for line in lines)


def peak(plan: dict) -> str:
    """The peak per GPU as the verdict says it (the paged state that fills the rest is said apart)."""
    paged = plan.get("paged")
    if paged and paged["spilled_bytes"]:
        return f"{(plan['memory']['peak'] - paged['resident_bytes']) / GIB:,.1f} GiB + paged state fills the rest"
    return f"{plan['memory']['peak'] / GIB:,.1f} of {plan['hardware']['gpu_memory_bytes'] / GIB:,.1f} GiB"


def expected(case: str, out: dict | list) -> tuple[str, list[str], list[str]]:
    """(verdict word, figures that must show whole, words of the next command)."""
    if case.startswith("suggest"):
        best = out["plans"][0]
        figures = [f"{best['time']['tokens_per_second']:,.0f} tokens/s", peak(best), f"{out['considered']:,}"]
        if out.get("training"):
            figures.append(f"{out['training']['gpu_hours']:,.1f} GPU-hours")
        figures += [f"+{100 * t['gain']:.0f} % ({t['plan']['time']['tokens_per_second']:,.0f} tokens/s)"
                    for t in out.get("trade_offs", [])]
        return "A PLAN FITS", figures, ["--out plan", "plan/launch.sh", "planner check --job-dir plan"]
    if case.startswith("estimate"):
        figures = [f"{out['memory']['peak'] / GIB:,.2f}", f"{out['time']['tokens_per_second']:,.0f} tokens/s"]
        if out["fits"]:
            return "FITS", [*figures, peak(out)], ["planner emit --plan plan.json", "planner suggest"]
        return "DOES NOT FIT", [*figures, f"{-out['headroom_bytes'] / GIB:,.2f} GiB short"], ["planner suggest"]
    if case == "models":
        return "model", [f"{m['id']}" for m in out] + [count(m["parameters"]) for m in out], []
    if case == "gpus":
        return "gpu", [g["id"] for g in out] + [f"{g['memory_gib']:,.1f}" for g in out], []
    raise AssertionError(case)


@pytest.mark.parametrize("case, width", covering(list(CASES), WIDTHS))  # CI: each case and each width once
def test_screen_reads_at_width(case, width):
    args = tuple(CASES[case])
    text = screen(args, width)
    lines = readable(text, width)
    word, figures, then = expected(case, result(args))
    head = "\n".join(lines[:2]) if case == "gpus" else first_line(text)  # a two-line table header
    assert word in head, head
    if case.startswith(("suggest", "estimate")):
        assert first_line(text).startswith(word)
    missing = [f for f in figures if f not in flat(text)]
    assert not missing, f"not shown whole: {missing}"
    tail = last_lines(text)
    assert all(t in tail for t in then), tail


@pytest.mark.parametrize("width", WIDTHS)
def test_check_screen_reads_at_width(width, tmp_path_factory):
    args = check_args(tmp_path_factory.getbasetemp())
    text = screen(args, width)
    readable(text, width)
    out = result(args)
    verdict = "FITS" if out["fits"] else "WILL NOT FIT"
    assert first_line(text).startswith(verdict)
    r = out["estimate"]
    for figure in (peak(r), f"{r['time']['tokens_per_second']:,.0f} tokens/s"):
        assert figure in flat(text)
    assert "planner suggest --model" in last_lines(text)
    assert "launch.sh" in last_lines(text)  # a planner job directory that fits: run it


def test_nothing_fits_reads_at_every_width():
    """The slow search once (--json); its screen at each width from the command's renderer."""
    from planner.render.next_steps import Asked
    from planner.render.report import render_suggest
    from planner.schema.suggest import SuggestResult

    out = result(tuple(NOTHING_FITS))
    assert out["fits"] is False
    parsed = SuggestResult.model_validate(out)
    for width in WIDTHS:
        console = Console(file=StringIO(), width=width, highlight=False)
        render_suggest(parsed, console, Asked(model="meta-llama/Llama-3.1-405B", gpus="1xRTX4090-24"))
        text = console.file.getvalue()
        readable(text, width)
        assert first_line(text).startswith("NOTHING FITS")
        assert f"{out['considered']:,}" in flat(text)
        tail = last_lines(text, 3)
        assert "planner " in tail, tail
        for s in out["hardware_suggestions"]:
            assert f"--gpus {s['gpus']}" in last_lines(text, 8)
            if s.get("host_memory_gb"):
                assert f"--host-memory-gb {s['host_memory_gb']:g}" in last_lines(text, 8)


def test_default_width_is_100_when_stdout_is_a_pipe():
    text = planner(CASES["suggest-1xA100"]).stdout
    assert max(map(len, text.splitlines())) <= 100
    assert text == screen(tuple(CASES["suggest-1xA100"]), 100)


def test_version_imports_no_command():
    """``planner --version`` answers before the commands are imported (no typer, rich, pydantic or
    strategies), so it costs an interpreter start; typer's eager option says the same."""
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['planner', '--version']; from planner.cli import main; main(); "
            "print(sorted(m for m in ('typer', 'rich', 'pydantic', 'strategies', 'planner.cli.commands') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0].startswith("planner ") and out.splitlines()[1] == "[]"
    from typer.testing import CliRunner

    from planner.cli import app

    assert CliRunner().invoke(app, ["--version"]).stdout == out.splitlines()[0] + "\n"


def test_version_and_catalog_json():
    from importlib.metadata import version

    from planner.core.distribution import DIST

    r = planner(["--version"])
    assert r.returncode == 0 and r.stdout.strip() == f"planner {version(DIST)}"
    models = result(("models",))
    assert {"id": LLAMA, "family": "llama", "parameters": 8_030_261_248} in models
    gpus = {g["id"]: g for g in result(("gpus",))}
    h100 = gpus["H100-SXM-80"]
    assert set(h100) == {"id", "memory_gib", "bf16_dense_tflops", "fp8_dense_tflops", "link", "aliases"}
    assert h100["bf16_dense_tflops"] > 900 and h100["fp8_dense_tflops"] > 1900 and "h100" in h100["aliases"]


@pytest.mark.parametrize("command", ["suggest", "check", "estimate", "probe", "tune", "emit", "calibrate"])
def test_help_cuts_nothing_at_80_columns(command):
    """Every option's name, metavar, help and default shows whole at 80 columns: short metavars
    (VALUE, SECONDS) leave the help its width, and no unbreakable token is cut to '…'."""
    r = planner([command, "--help"], width=80)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout, [line for line in r.stdout.splitlines() if "…" in line]
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_a_plan_planner_cannot_emit_ends_with_how_to_run_it_and_the_plan_it_can():
    """LLaMA-Factory's DPO (full-logits log-probabilities) is planned, not emitted: the screen's
    last lines say to run it with llamafactory-cli and give the TRL plan's command, never emit."""
    for verb in ("estimate", "suggest"):
        text = screen((verb, "--model", "Qwen/Qwen2.5-0.5B", "--gpus", "1xA100-80", "--method", "dpo",
                       "--dpo-logprobs", "full-logits", "--adapter", "lora", "--batching", "padded"), 80)
        tail = last_lines(text)
        assert "llamafactory-cli" in tail and f"planner {verb}" in tail and "--dpo-logprobs fused" in tail, tail
        assert "emit" not in tail and "--out" not in tail and "full-logits" not in tail.split("Plan the job")[1], tail
        assert all(len(line) <= 80 for line in text.splitlines())


@pytest.mark.parametrize("args, kept", [
    (["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "8xH100-80", "--seq-len", "131072",
      "--sharding", "fsdp", "--sequence-parallel", "ring", "--sp-size", "8", "--checkpointing", "full"],
     ["--seq-len", "131072"]),
    (["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40", "--seq-len", "8192"],
     ["--seq-len", "8192"]),
    (["estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpus", "1xA100-40"], []),
])
def test_the_next_search_keeps_the_workload(args, kept):
    """The suggested search plans the same rows: a search without --seq-len would plan 2,048-token
    rows, another job."""
    out = planner(args).stdout
    last = " ".join(out.split("planner suggest")[-1].split())
    assert ("--seq-len" in last) == bool(kept) and " ".join(kept) in last
