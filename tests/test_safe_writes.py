"""Emitted files are safe to run and never cost the user a file (issue 21): the threats, each
reproduced as an adversarial user would, and shown fixed.

1. Injection into launch.sh through user text (model id/folder, GPU id, GPU file path, output
   path, notes): launch.sh passes ``bash -n``, its commands are those of a benign plan, and running
   it creates nothing; quoted words read back as exactly what the user wrote.
2. ``--force`` with a user's file: kept, and named; an edited planner file is the user's.
3. Symlinks and directories at planner names: refused, never written through; a failure mid-way
   leaves the folder as it was.
4. Two writers into one folder: one plan at the end, over 24 rounds, with the race window held open.
5. Custom GPU files in every --gpus position.
"""

import json
import multiprocessing
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.catalog import DATA_DIR
from planner.catalog.gpus import GPU_DIR
from planner.catalog.models import resolve_model
from planner.cli import app
from planner.core import shell
from planner.core.errors import PlannerInputError
from planner.emit import build_files, launch_script, single_plan_result, write_files, writer
from planner.emit import files as emit_files
from planner.emit.writer import MANIFEST
from planner.strategies import PlanContext

from helpers import FULL, examples, run

MODEL = "meta-llama/Llama-3.2-1B"
HOSTILE = ["\n", "\r", "$(", ")", "`", "'", '"', ";", "&", "|", "\\", "#", " ", "\x1b", "\u2028", "\x00", "touch",
           "INJECTED", "a", "é", "\t", "${IFS}", "*"]
hostile_text = st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=12).map("".join)


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry of ``folder``: file bytes, link targets, directories."""
    out = {}
    for p in sorted(folder.iterdir()):
        out[p.name] = (("link", os.readlink(p)) if p.is_symlink() else ("dir",) if p.is_dir()
                       else ("file", p.read_bytes()))
    return out


@pytest.fixture(scope="module")
def plans():
    """Two different plans' files (DeepSpeed ZeRO-3, and FSDP without a DeepSpeed file)."""
    zero3 = single_plan_result(run(MODEL, "8xH100-80", sharding="zero3"))
    fsdp = single_plan_result(run(MODEL, "8xH100-80", sharding="fsdp"))
    return build_files(zero3), build_files(fsdp), zero3


@pytest.fixture(scope="module")
def draft(plans):
    """The ZeRO-3 plan's emit draft (what launch_script renders besides the plan's own text)."""
    plan = plans[2].plans[0]
    return emit_files._draft(PlanContext(resolve_model(MODEL), plan.hardware.parse(), plan.config))


def lab_gpu(folder: Path, gpu_id: str = "LAB") -> Path:
    """A user GPU file in ``folder``: the catalog's A100-SXM-80 under the id ``gpu_id``."""
    path = folder / "lab.yaml"
    path.write_text((GPU_DIR / "a100-sxm-80.yaml").read_text().replace("id: A100-SXM-80", f"id: {gpu_id}"))
    return path


# -- 1. shell injection ---------------------------------------------------------------------------

def _commands(script: str) -> list[str]:
    return [line for line in script.splitlines() if not line.startswith("#")]


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=hostile_text, gpu_id=hostile_text, gpu_file=st.none() | hostile_text)
def test_user_text_reaches_launch_sh_as_comments_only(plans, draft, model, gpu_id, gpu_file):
    """Whatever the model id, the GPU id and the GPU file path hold, every line they reach is a
    comment, the commands are exactly a benign plan's, and bash -n accepts the script. (The
    output folder never reaches launch.sh: it finds its files from its own location.)"""
    plan = plans[2].plans[0]
    hostile = plan.model_copy(update={
        "model": plan.model.model_copy(update={"id": model}),
        "hardware": plan.hardware.model_copy(update={"gpu": gpu_id, "gpu_file": gpu_file})})
    script, benign = launch_script(hostile, draft), launch_script(plan, draft)
    assert _commands(script) == _commands(benign)
    assert "\x00" not in script and "\x1b" not in script and "\u2028" not in script
    assert subprocess.run(["bash", "-n"], input=script.encode(), check=False).returncode == 0


def test_quoted_words_read_back_exactly_in_bash():
    """shell.quote: bash reads each quoted word back as exactly the original (NUL aside: no shell
    word holds one), on one line."""
    import random

    rng = random.Random(21)
    words = ["".join(rng.choice([h for h in HOSTILE if h != "\x00"]) for _ in range(rng.randint(1, 10)))
             for _ in range(examples(2000, 300))]
    quoted = [shell.quote(w) for w in words]
    assert all("\n" not in q and "\r" not in q for q in quoted)
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + " ".join(quoted)], capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:-1] == [w.encode() for w in words]


def _fake_accelerate(bin_dir: Path) -> None:
    bin_dir.mkdir()
    (bin_dir / "accelerate").write_text("#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" > \"$FAKE_ARGS\"\n")
    (bin_dir / "accelerate").chmod(0o755)


def test_a_hostile_model_folder_and_gpu_file_run_nothing(tmp_path, monkeypatch):
    """The issue's attack, end to end: a model folder and a GPU file path holding a newline and a
    command; the emitted launch.sh passes bash -n and, run with a stand-in accelerate, runs only
    that; a GPU id holding a newline is refused (exit 2)."""
    monkeypatch.chdir(tmp_path)
    evil = "m\ntouch INJECTED_M #$(touch INJECTED_S)`touch INJECTED_B`'\""
    (tmp_path / evil).mkdir()
    config = json.loads((DATA_DIR / "models" / "meta-llama--Llama-3.2-1B.json").read_text())["config"]
    (tmp_path / evil / "config.json").write_text(json.dumps(config))
    gpu_dir = tmp_path / "gpus\n touch INJECTED_G #"
    gpu_dir.mkdir()
    lab_gpu(gpu_dir)
    runner = CliRunner()
    out = tmp_path / "plan $(touch INJECTED_O)"
    r = runner.invoke(app, ["suggest", "--model", str(tmp_path / evil), "--gpus", f"2x{gpu_dir}/lab.yaml",
                            "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert subprocess.run(["bash", "-n", str(out / "launch.sh")], check=False).returncode == 0
    _fake_accelerate(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", MODEL="x", DATA="sample",
               FAKE_ARGS=str(tmp_path / "args"))
    subprocess.run(["bash", str(out / "launch.sh")], cwd=tmp_path, env=env, check=True, timeout=60)
    assert (tmp_path / "args").read_text().splitlines()[:2] == ["launch", "--config_file"]
    assert not list(tmp_path.rglob("INJECTED*"))
    assert "$'" in r.output  # the next-step commands quote the folder on one line
    (tmp_path / "bad").mkdir()
    lab_gpu(tmp_path / "bad", '"LAB\\ntouch INJECTED #"')  # (YAML reads \n in double quotes as a newline)
    r = runner.invoke(app, ["estimate", "--model", MODEL, "--gpus", "1x./bad/lab.yaml"])
    assert r.exit_code == 2 and "one line of printable text" in r.output and "Traceback" not in r.output


# -- 2. --force and the user's files ----------------------------------------------------------------

def test_force_keeps_the_users_files_and_removes_only_planners(tmp_path, plans):
    zero3, fsdp, _ = plans
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "deepspeed_config.json").write_text('{"my": "own"}')
    with pytest.raises(PlannerInputError, match="--force"):
        write_files(fsdp, mine, force=False)
    done = write_files(fsdp, mine, force=True)  # the FSDP plan has no DeepSpeed file: the user's stays
    assert (mine / "deepspeed_config.json").read_text() == '{"my": "own"}'
    assert done.kept == ["deepspeed_config.json (not written by planner, or changed since)"]
    with pytest.raises(PlannerInputError, match="did not write") as e:  # a ZeRO-3 plan needs that name: refused
        before = snapshot(mine)
        write_files(zero3, mine, force=True)
    assert "another --out" in e.value.hint and snapshot(mine) == before
    ours = tmp_path / "ours"
    write_files(zero3, ours, force=False)
    write_files(fsdp, ours, force=True)  # planner's own earlier DeepSpeed file goes
    assert not (ours / "deepspeed_config.json").exists()
    assert sorted(p.name for p in ours.iterdir()) == sorted([*fsdp, MANIFEST])
    (ours / "PLAN.md").write_text((ours / "PLAN.md").read_text() + "\nmy notes\n")  # edited: the user's now
    before = snapshot(ours)
    with pytest.raises(PlannerInputError, match="PLAN.md"):
        write_files(zero3, ours, force=True)
    assert snapshot(ours) == before


def test_a_folder_from_before_the_manifest_is_refused_with_what_to_do(tmp_path, plans):
    """Files an older planner wrote (no manifest) are the user's as far as --force knows: refused,
    and the hint says why and what to do."""
    zero3, _, _ = plans
    for name, text in zero3.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(PlannerInputError) as e:
        write_files(zero3, tmp_path, force=True)
    assert "older planner" in e.value.hint and MANIFEST in e.value.hint


def test_cli_names_the_kept_file(tmp_path):
    out = tmp_path / "d"
    out.mkdir()
    (out / "deepspeed_config.json").write_text("{}")
    # (a plan without DeepSpeed, which would write that file: the user's is kept beside it)
    r = CliRunner().invoke(app, ["suggest", "--model", MODEL, "--gpus", "1xA100-80", "--sharding", "none",
                                 "--out", str(out), "--force"])
    assert r.exit_code == 0, r.output
    assert "kept deepspeed_config.json" in r.output and (out / "deepspeed_config.json").read_text() == "{}"


# -- 3. symlinks, directories, failures -------------------------------------------------------------

@pytest.mark.parametrize("force", [False, True])
def test_links_and_directories_at_planner_names_are_never_written_through(tmp_path, plans, force):
    zero3, _, _ = plans
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("precious")
    for name, make in [("accelerate_config.yaml", lambda p: p.symlink_to(outside / "victim")),
                       ("PLAN.md", lambda p: p.symlink_to(tmp_path / "nowhere")),  # dangling
                       ("plan.json", lambda p: p.mkdir())]:
        d = tmp_path / f"{name}-{force}"
        d.mkdir()
        make(d / name)
        before = snapshot(d)
        with pytest.raises(PlannerInputError):
            write_files(zero3, d, force=force)
        assert snapshot(d) == before, name  # nothing written, no temp file left
        assert (outside / "victim").read_text() == "precious"


def test_planted_temp_names_redirect_nothing(tmp_path, plans):
    """The old fixed temp names (.NAME.tmp-PID) planted as links: the write neither follows nor
    removes them (its staging folder has a random, exclusive name)."""
    zero3, _, _ = plans
    (tmp_path / "victim").write_text("precious")
    out = tmp_path / "d"
    out.mkdir()
    for name in zero3:
        for pid in (os.getpid(), os.getpid() + 1):
            (out / f".{name}.tmp-{pid}").symlink_to(tmp_path / "victim")
    write_files(zero3, out, force=False)
    assert (tmp_path / "victim").read_text() == "precious"
    assert all((out / n).read_text() == text for n, text in zero3.items())


def test_a_failure_mid_way_leaves_the_folder_as_it_was(tmp_path, plans, monkeypatch):
    zero3, fsdp, _ = plans
    write_files(zero3, tmp_path, force=False)
    before = snapshot(tmp_path)
    real, calls = writer._place, []

    def failing(source, target):
        calls.append(target)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(source, target)

    monkeypatch.setattr(writer, "_place", failing)
    with pytest.raises(PlannerInputError, match="No space left"):
        write_files(fsdp, tmp_path, force=True)
    assert snapshot(tmp_path) == before
    fresh = tmp_path / "new" / "deeper"
    calls.clear()
    with pytest.raises(PlannerInputError):
        write_files(fsdp, fresh, force=False)
    assert not (tmp_path / "new").exists()  # the folders made for the failed write go again


def _killed_writer(files: dict, out: str, at: int) -> None:
    """A writer that dies (os._exit, as under kill -9: no cleanup runs) at its ``at``-th step: a
    file staged, an old file moved aside, a new one placed."""
    steps = [0]

    def step(real):
        def wrapped(*a, **k):
            steps[0] += 1
            if steps[0] == at:
                os._exit(9)
            return real(*a, **k)
        return wrapped

    writer._stage, writer._place = step(writer._stage), step(writer._place)
    os.rename = step(os.rename)
    write_files(files, Path(out), True)
    os._exit(0)


def test_a_writer_killed_at_any_step_leaves_one_plan_and_the_next_run_finishes(tmp_path, plans):
    """A plan replaced by another, the writer killed at each of its steps in turn: the next planner
    in the folder (tune's check of --out, or any write) finds one plan there, the old or the new
    one, whole, and no staging folder; a rerun of the write then completes."""
    zero3, fsdp, _ = plans
    ctx = multiprocessing.get_context("fork")
    outcomes = set()
    for at in range(1, 60):
        out = tmp_path / f"k{at}"
        write_files(zero3, out, force=False)
        child = ctx.Process(target=_killed_writer, args=(fsdp, str(out), at))
        child.start()
        child.join(60)
        if child.exitcode == 0:  # the write had fewer steps: every one was killed once
            break
        assert child.exitcode == 9
        assert emit_files.foreign_plan_files(out) == []  # finishes or undoes the killed write
        assert not list(out.glob(writer.STAGING_PREFIX + "*"))
        assert _one_plan(out, [zero3, fsdp]), sorted(p.name for p in out.iterdir())
        outcomes.add("new" if (out / "plan.json").read_text() == fsdp["plan.json"] else "old")
        write_files(fsdp, out, force=True)
        assert _one_plan(out, [fsdp])
    assert at > 10 and outcomes == {"old", "new"}


# -- 4. two writers ---------------------------------------------------------------------------------

def _writer(files: dict, out: str, force: bool, hold: float, go, results) -> None:
    if hold:  # hold the race window open: between the check and the replace
        real = writer._write_locked

        def slow(*a):
            time.sleep(hold)
            return real(*a)
        writer._write_locked = slow
    go.wait()
    try:
        write_files(files, Path(out), force)
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - the refusal is the expected outcome of one of them
        results.put(type(e).__name__)


def _one_plan(out: Path, candidates: list[dict]) -> bool:
    """The folder holds exactly one of ``candidates``' file sets, and its manifest says so."""
    names = {p.name for p in out.iterdir()} - {MANIFEST}
    manifest = json.loads((out / MANIFEST).read_text())["files"]
    return any(names == set(c) and all((out / n).read_text() == t for n, t in c.items()) and set(manifest) == names
               for c in candidates)


@pytest.mark.parametrize("force", [True, False])
def test_two_writers_leave_one_plan(tmp_path, plans, force):
    zero3, fsdp, _ = plans
    ctx = multiprocessing.get_context("fork")
    rounds = 24
    for i in range(rounds):
        out = tmp_path / f"r{i}"
        go, results = ctx.Event(), ctx.Queue()
        hold = 0.05 if i % 2 else 0.0
        procs = [ctx.Process(target=_writer, args=(files, str(out), force, hold, go, results))
                 for files in (zero3, fsdp)]
        for p in procs:
            p.start()
        go.set()
        for p in procs:
            p.join(30)
        outcomes = sorted(results.get(timeout=5) for _ in procs)
        assert _one_plan(out, [zero3, fsdp]), i
        assert outcomes == (["ok", "ok"] if force else ["PlannerInputError", "ok"]), (i, outcomes)
        shutil.rmtree(out)


# -- 5. custom GPU files ----------------------------------------------------------------------------

def test_custom_gpu_files_work_in_every_gpus_position(tmp_path, monkeypatch):
    """suggest --out and estimate with NxFILE and NODESxNxFILE; emit --gpus FILE; check --gpus FILE;
    and a plan file emitted again after the GPU file is gone (the plan carries its definition)."""
    monkeypatch.chdir(tmp_path)
    lab_gpu(tmp_path)
    runner = CliRunner()
    for gpus in ("4x./lab.yaml", "2x4x./lab.yaml", f"1x{tmp_path / 'lab.yaml'}"):
        r = runner.invoke(app, ["suggest", "--model", MODEL, "--gpus", gpus, "--out", f"out-{gpus.count('x')}",
                                "--force"])
        assert r.exit_code == 0, (gpus, r.output)
        r = runner.invoke(app, ["estimate", "--model", MODEL, "--gpus", gpus])
        assert r.exit_code == 0, (gpus, r.output)
    r = runner.invoke(app, ["emit", "--plan", "out-1/plan.json", "--gpus", "8x./lab.yaml", "--out", "emit8"])
    assert r.exit_code == 0, r.output
    assert json.loads(Path("emit8/accelerate_config.yaml").read_text().split("num_processes: ")[1].split()[0]) == 8
    r = runner.invoke(app, ["check", "--job-dir", "out-1", "--model", MODEL, "--gpus", "1x./lab.yaml"])
    assert r.exit_code in (0, 1) and "Traceback" not in r.output, r.output
    Path("lab.yaml").unlink()
    r = runner.invoke(app, ["emit", "--plan", "out-1/plan.json", "--out", "again"])
    assert r.exit_code == 0, r.output
    for name in ("accelerate_config.yaml", "training_args.json", "launch.sh"):
        assert Path("again", name).read_text() == Path("out-1", name).read_text()


@FULL  # (CI: the GPU file in suggest's and estimate's --gpus, the tune below)
def test_probe_takes_a_custom_gpu_file(tmp_path, monkeypatch):
    """A traced probe on a GPU file."""
    monkeypatch.chdir(tmp_path)
    lab_gpu(tmp_path)
    r = CliRunner().invoke(app, ["probe", "--model", "HuggingFaceTB/SmolLM2-135M", "--gpus", "1x./lab.yaml", "--layers",
                                 "1", "--seq-len", "128"])
    assert r.exit_code in (0, 1) and "Traceback" not in r.output, r.output


def test_tune_takes_a_custom_gpu_file_and_never_writes_through_a_link(tmp_path, monkeypatch):
    """A tune (analytic, two trials) on a GPU file; tune's default study file planted as a symlink
    is refused (exit 2), its target kept."""
    monkeypatch.chdir(tmp_path)
    lab_gpu(tmp_path)
    runner = CliRunner()
    tune = ["tune", "--model", MODEL, "--gpus", "2x./lab.yaml", "--fidelity", "analytic", "--trials", "2"]
    r = runner.invoke(app, [*tune, "--out", "t"])
    assert r.exit_code == 0, r.output
    assert json.loads(Path("t/plan.json").read_text())["plans"][0]["hardware"]["gpu"] == "LAB"
    (tmp_path / "precious").write_text("mine")
    Path("u").mkdir()
    Path("u/study.db").symlink_to(tmp_path / "precious")
    r = runner.invoke(app, [*tune, "--out", "u"])
    assert r.exit_code == 2 and "symlink" in r.output and (tmp_path / "precious").read_text() == "mine"
