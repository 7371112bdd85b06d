"""``planner tune`` on the CPU: the analytic fidelity reproduces ``suggest``; crashes and OOMs are
recorded trials; no probe is spent on a plan the model rejects; a killed tune resumes with no
trial lost or repeated; two workers share one study."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers import FULL, postgres_testable

optuna = pytest.importorskip("optuna")

from planner.engine.suggest import suggest
from planner.engine.tune import tune
from planner.schema.suggest import SuggestRequest
from planner.schema.tune import ProbeOutcome, TuneRequest

TINY = str(Path(__file__).parent / "data" / "tiny-llama" / "config.json")
#: A narrowed space (one GPU: no sharding; AdamW and its 8-bit form): the study's rules, not the space's
#: size, are under test, and the analytic ranking of every tune is then quick.
NARROW = dict(optimizer=["adamw", "adamw-8bit"], sharding=["none"], offload=["none"])
LLAMA = dict(model="meta-llama/Llama-3.2-1B", gpus="1xH100-80", seq_len=2048, **NARROW)
CLI = [sys.executable, "-P", "-m", "planner"]  # the installed package, never the working directory


def analytic(plan) -> ProbeOutcome:
    return ProbeOutcome(fidelity="analytic", status="ok", peak_bytes=plan.memory["peak"],
                        step_seconds=plan.time.step_seconds)


def probed(study) -> list[tuple]:
    return [tuple(t.user_attrs["candidate"]) for t in study.trials
            if t.user_attrs.get("probed") and t.state == optuna.trial.TrialState.COMPLETE]


def test_analytic_tune_finds_suggests_best(tmp_path):
    r = tune(TuneRequest(**LLAMA, storage=f"sqlite:///{tmp_path}/s.db", probes=10, band=0.0), analytic, "analytic")
    best = suggest(SuggestRequest(**LLAMA)).plans[0]
    assert r.best_plan.config == best.config
    assert r.best.tokens_per_second == pytest.approx(best.time.tokens_per_second)
    assert all(t.fidelity == "analytic" for t in r.trials)


def test_tune_launcher_trainer_never_tries_what_only_the_planner_launch_runs(tmp_path):
    """tune --launcher trainer searches the same space as suggest --launcher trainer: no trial (and
    so no best plan) uses a choice that needs runtime.json (Strategy.runtime_only), while the default
    launcher's top plans here do use such choices."""
    from planner.strategies import REGISTRY

    req = dict(model="meta-llama/Llama-3.2-1B", gpus="1xH100-80", seq_len=2048, sharding=["none"], offload=["none"])
    runtime_only = {(s.field, v) for s in REGISTRY for v in s.runtime_only}
    r = tune(TuneRequest(**req, launcher="trainer", storage=f"sqlite:///{tmp_path}/t.db", probes=6, band=0.0),
             analytic, "analytic")
    assert r.trials
    for t in r.trials:
        assert not {(f, t.config.get(f)) for f, _ in runtime_only} & runtime_only, t.config
    best = suggest(SuggestRequest(**req, launcher="trainer")).plans[0]
    assert r.best_plan.config == best.config
    default = suggest(SuggestRequest(**req, top=20)).plans  # the filter is not vacuous here
    assert any({(f, getattr(p.config, f)) for f, _ in runtime_only} & runtime_only for p in default)


def test_crash_and_oom_are_recorded_not_fatal(tmp_path):
    calls = []

    def flaky(plan) -> ProbeOutcome:
        calls.append(plan.config)
        if len(calls) == 1:
            raise RuntimeError("injected crash")
        if len(calls) == 2:
            return ProbeOutcome(fidelity="measured", status="oom", message="CUDA out of memory (injected)")
        return analytic(plan)

    r = tune(TuneRequest(**LLAMA, storage=f"sqlite:///{tmp_path}/s.db", probes=5, band=10.0), flaky, "measured")
    statuses = {t.number: t.status for t in r.trials if t.probed}
    assert len(statuses) == 5 and r.probes == 5
    crash = next(t for t in r.trials if t.status == "error")
    oom = next(t for t in r.trials if t.status == "oom")
    assert "injected crash" in crash.message and not crash.feasible and not oom.feasible
    assert r.best is not None and r.best.number not in (crash.number, oom.number)


def test_no_probe_is_spent_on_a_plan_predicted_not_to_fit(tmp_path):
    seen = []

    def record(plan) -> ProbeOutcome:
        seen.append(plan.fits)
        return analytic(plan)

    r = tune(TuneRequest(model="meta-llama/Llama-3.1-8B", gpus="1xA100-40", seq_len=2048,
                         storage=f"sqlite:///{tmp_path}/s.db", probes=4, band=10.0, enqueue=0, seed=3),
             record, "analytic")
    assert seen and all(seen)
    assert any(not t.probed and t.status == "predicted not to fit" for t in r.trials)


def _study(url: str):
    names = optuna.get_all_study_names(url)
    assert len(names) == 1
    return optuna.load_study(study_name=names[0], storage=url)


def _tune_cmd(url: str, trials: int, *extra: str) -> list[str]:
    narrow = [arg for field, values in NARROW.items() for v in values for arg in (f"--{field}", v)]
    return [*CLI, "tune", "--model", TINY, "--gpus", "1xH100-80", "--seq-len", "64", "--fidelity", "traced",
            "--trials", str(trials), "--storage", url, "--heartbeat-seconds", "1", "--band", "10", "--json", *narrow,
            *extra]


def _probing_now(db: Path) -> bool:
    """Some trial has been probed and another is running with its heartbeat recorded and its
    candidate chosen. Optuna only fails a RUNNING trial as stale once it has a heartbeat; a worker
    killed in the instant between creating a trial and its first heartbeat leaves a trial Optuna
    never reclaims (tune's own orphan rule handles that, tested apart), so the test waits until the
    trial is probing (a real kill lands mid-probe, seconds after it)."""
    if not db.exists():
        return False
    try:
        with sqlite3.connect(db) as con:
            states = Counter(s for (s,) in con.execute("SELECT state FROM trials"))
            beating = con.execute("SELECT COUNT(*) FROM trials t JOIN trial_heartbeats h ON h.trial_id = t.trial_id"
                                  " JOIN trial_user_attributes a ON a.trial_id = t.trial_id"
                                  " WHERE t.state = 'RUNNING' AND a.key = 'candidate'").fetchone()[0]
    except sqlite3.Error:
        return False
    return states.get("COMPLETE", 0) >= 1 and beating >= 1


# (where a PostgreSQL server is installed, CI kills a worker there instead: tests/test_tune_postgres.py)
@(FULL if postgres_testable() else (lambda test: test))
@pytest.mark.heavy
def test_killed_tune_resumes_without_losing_or_repeating_a_trial(tmp_path):
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    proc = subprocess.Popen(_tune_cmd(url, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 600
    while not _probing_now(db) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, "the tune ended before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)  # mid-probe, no chance to clean up
    proc.wait()
    before = _study(url)
    interrupted = [t for t in before.trials if t.state == optuna.trial.TrialState.RUNNING]
    assert len(interrupted) == 1
    time.sleep(2.5)  # past the heartbeat's grace period
    done = subprocess.run(_tune_cmd(url, 4), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    after = _study(url)
    keys = probed(after)
    assert len(keys) == 4 and len(set(keys)) == 4  # the budget, each candidate once
    lost = after.trials[interrupted[0].number]
    assert lost.state == optuna.trial.TrialState.FAIL
    assert tuple(lost.user_attrs["candidate"]) in keys  # the interrupted candidate was retried
    assert json.loads(done.stdout)["probes"] == 4


def test_a_trial_orphaned_before_its_first_heartbeat_is_failed_and_retried(tmp_path, monkeypatch):
    import planner.engine.tune as tune_module

    req = TuneRequest(**LLAMA, storage=f"sqlite:///{tmp_path}/s.db", probes=1, band=10.0, heartbeat_seconds=1)
    first = tune(req, analytic, "analytic")
    study = _study(req.storage)
    done = study.trials[first.trials[0].number]
    orphan = study.ask()  # RUNNING with no heartbeat thread: a worker killed right after creating it
    for name, dist in done.distributions.items():  # the probed plan with the next micro-batch size
        pick = done.params[name]
        if name == "micro_batch_size":
            pick = dist.choices[(dist.choices.index(pick) + 1) % len(dist.choices)]
        study._storage.set_trial_param(orphan._trial_id, name, dist.to_internal_repr(pick), dist)
    monkeypatch.setattr(tune_module, "ORPHAN_AFTER_SECONDS", 300.0)
    tune(req.model_copy(update={"probes": 1}), analytic, "analytic")  # too young: left alone
    assert _study(req.storage).trials[orphan.number].state == optuna.trial.TrialState.RUNNING
    monkeypatch.setattr(tune_module, "ORPHAN_AFTER_SECONDS", 0.0)
    tune(req.model_copy(update={"probes": 2}), analytic, "analytic")
    after = _study(req.storage)
    assert after.trials[orphan.number].state == optuna.trial.TrialState.FAIL
    retry = [t for t in after.trials if t.user_attrs.get("retry_of") == orphan.number]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.COMPLETE
    assert retry[0].params == after.trials[orphan.number].params


def test_a_probe_whose_worker_died_before_optuna_recorded_it_is_owed(tmp_path):
    """A worker killed after recording its probe on the trial, before Optuna finished the trial: the
    stale trial is failed and Optuna's retry queues a copy of its attributes, "probed" included. The
    study never got that probe's result, so neither the failed trial nor its queued copy spends the
    budget: the resumed tune probes the candidate again and then as many more as the budget holds
    (CI once ended such a study one probe short)."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    req = TuneRequest(**LLAMA, storage=f"sqlite:///{tmp_path}/s.db", probes=1, band=10.0)
    first = tune(req, analytic, "analytic")
    study = _study(req.storage)
    done = study.trials[first.trials[0].number]
    killed = study.ask()
    for name, dist in done.distributions.items():  # the probed plan with the next micro-batch size
        pick = done.params[name]
        if name == "micro_batch_size":
            pick = dist.choices[(dist.choices.index(pick) + 1) % len(dist.choices)]
        study._storage.set_trial_param(killed._trial_id, name, dist.to_internal_repr(pick), dist)
    key = [done.user_attrs["candidate"][0], study.trials[killed.number].params["micro_batch_size"]]
    for attr, value in (("candidate", key), ("probed", True), ("status", "ok"), ("fidelity", "analytic"),
                        ("tokens_per_second", 1.0), ("predicted_tokens_per_second", 1.0)):
        killed.set_user_attr(attr, value)
    study._storage.set_trial_state_values(killed._trial_id, optuna.trial.TrialState.FAIL)  # as stale
    RetryHeartbeatStaleTrialCallback(max_retry=3)(study, _study(req.storage).trials[killed.number])
    again = tune(req.model_copy(update={"probes": 3}), analytic, "analytic")
    after = _study(req.storage)
    keys = probed(after)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert tuple(key) in keys
    assert again.probes == 3 and not next(r for r in again.trials if r.number == killed.number).probed


def _ask_queued(url: str, start: float, n: int, q) -> None:
    """A worker that takes ``n`` queued trials from the shared study, all workers starting together."""
    from planner.engine.tune import _open_study

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = _open_study(url, "race", TuneRequest(model="gpt2", gpus="1xA100-80"))
    while time.time() < start:
        pass
    got = []
    try:
        for _ in range(n):
            trial = study.ask()
            got.append(trial.number)
            study.tell(trial, 1.0)
    except Exception as e:  # the race's symptom: a trial another worker already told
        got.append(repr(e)[:300])
    q.put(got)


@pytest.mark.heavy
def test_concurrent_workers_never_take_the_same_queued_trial(tmp_path):
    """Optuna's hand-out of a WAITING trial is not atomic on SQLite (optuna/optuna#4621): without
    BEGIN IMMEDIATE (tune._serialise_sqlite) six workers asking 60 queued trials took 7-9 twice."""
    import multiprocessing as mp

    from planner.engine.tune import _open_study

    url = f"sqlite:///{tmp_path}/race.db"
    study = _open_study(url, "race", TuneRequest(model="gpt2", gpus="1xA100-80"))
    for i in range(60):
        study.enqueue_trial({"x": i})
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 4
    procs = [ctx.Process(target=_ask_queued, args=(url, start, 10, q)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    numbers = [n for g in got for n in g]
    assert all(isinstance(n, int) for n in numbers), numbers
    assert sorted(numbers) == list(range(60))


@FULL  # CI: test_concurrent_workers_never_take_the_same_queued_trial
def test_two_workers_share_one_study(tmp_path):
    url = f"sqlite:///{tmp_path}/shared.db"
    cmd = _tune_cmd(url, 4, "--study-name", "shared")
    workers = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [w.communicate(timeout=900) for w in workers]
    assert all(w.returncode == 0 for w in workers), [e[-1500:] for _, e in outs]
    study = optuna.load_study(study_name="shared", storage=url)
    keys = probed(study)
    assert 4 <= len(keys) <= 5 and len(set(keys)) == len(keys)  # at most one probe in flight past the budget
    assert len({t.user_attrs["worker"] for t in study.trials if t.user_attrs.get("probed")}) == 2


def test_cli_tune_writes_the_best_plan_and_the_plot(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([*CLI, "tune", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "1xH100-80",
                        "--fidelity", "analytic", "--trials", "5", "--out", str(out), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["best"]["fidelity"] == "analytic"
    assert (out / "study.db").exists() and (out / "plan.json").exists() and (out / "accelerate_config.yaml").exists()
    plan = json.loads((out / "plan.json").read_text())["plans"][0]["config"]
    assert plan == result["best_plan"]["config"]
    pytest.importorskip("matplotlib")
    assert (out / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a rerun resumes the study and rewrites the plan it wrote; a file the user changed stops it
    again = [*CLI, "tune", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "1xH100-80", "--fidelity", "analytic",
             "--trials", "6", "--out", str(out)]
    resumed = subprocess.run(again, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-2000:]
    (out / "PLAN.md").write_text("my notes")
    edited = subprocess.run(again, capture_output=True, text=True, timeout=600)
    assert edited.returncode == 2 and "PLAN.md" in edited.stderr and "--force" in edited.stderr
    assert (out / "PLAN.md").read_text() == "my notes"


def test_timeout_stops_the_run_and_the_study_resumes(tmp_path):
    def slow(plan) -> ProbeOutcome:
        time.sleep(1.0)
        return analytic(plan)

    url = f"sqlite:///{tmp_path}/s.db"
    first = tune(TuneRequest(**LLAMA, storage=url, probes=50, band=10.0, timeout=2.0), slow, "analytic")
    assert first.stopped.startswith("timeout") and 1 <= first.probes < 50
    second = tune(TuneRequest(**LLAMA, storage=url, probes=first.probes + 2, band=10.0), slow, "analytic")
    assert second.study_name == first.study_name and second.probes == first.probes + 2
    assert len(probed(_study(url))) == len(set(probed(_study(url)))) == first.probes + 2

    def never(plan) -> ProbeOutcome:
        raise AssertionError("--trials 0 must not probe")

    report = tune(TuneRequest(**LLAMA, storage=url, probes=0, band=10.0), never, "analytic")
    assert report.probes == second.probes and report.best == second.best and report.stopped.startswith("probe budget")


@pytest.mark.parametrize("content", ["table", "garbage"])
def test_a_storage_file_of_another_program_is_refused_and_kept(tmp_path, content):
    """--storage at an SQLite file with other tables (Optuna would add its own to it), or at a
    file that is no database: exit 2, the file byte for byte as it was; an empty file is used."""
    from planner.core.errors import PlannerInputError

    path = tmp_path / "mine.db"
    if content == "table":
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE notes (x TEXT)")
        con.commit()
        con.close()
    else:
        path.write_text("my notes, not a database\n")
    before = path.read_bytes()
    with pytest.raises(PlannerInputError, match="another program|not an SQLite database"):
        tune(TuneRequest(**LLAMA, storage=f"sqlite:///{path}", probes=1), analytic, "analytic")
    assert path.read_bytes() == before
    empty = tmp_path / "empty.db"
    empty.touch()
    assert tune(TuneRequest(**LLAMA, storage=f"sqlite:///{empty}", probes=1), analytic, "analytic").trials
