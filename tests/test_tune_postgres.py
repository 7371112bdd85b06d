"""planner tune across workers on a real PostgreSQL server (issue 40): what docs/reference.md and
examples/tune_workers.sbatch describe for many nodes, run on this machine.

A private server is started for the test (Debian's postgresql package, which .ci/run installs where
it is missing: initdb and pg_ctl on a Unix socket in a temporary folder, no TCP, trust
authentication; as the postgres user when the tests run as root, which PostgreSQL refuses). Two
``planner tune`` workers (traced trials of the tiny Llama, one study) start together; one is killed
with SIGKILL while it probes; the other finishes; the same command with one probe more resumes the
study. The study then holds every candidate once, the killed worker's trial failed (a resumed tune
fails stale trials at its start, where Optuna checks only as a trial starts) and its candidate
probed by another. tests/test_tune.py runs the same kill on SQLite (the full suite) and the queue race."""

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
pytest.importorskip("psycopg2")

from test_tune import _tune_cmd, probed  # noqa: E402

from helpers import postgres_server_bin  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own for this module; its SQLAlchemy URL for a database ``tune``."""
    initdb, pg_ctl = postgres_server_bin("initdb"), postgres_server_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server installed (Debian's postgresql package; .ci/run installs it)")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="planner-pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    root.chmod(0o755)
    data, port = root / "data", _free_port()
    run = dict(check=True, capture_output=True, text=True, timeout=120)
    subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "planner", "--no-sync"], **run)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-o",
                    f"-p {port} -k {root} -c listen_addresses='' -c fsync=off", "start"], **run)
    try:
        url = f"postgresql+psycopg2://planner@/postgres?host={root}&port={port}"
        import sqlalchemy

        engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as con:
            con.execute(sqlalchemy.text("CREATE DATABASE tune"))
        engine.dispose()
        yield f"postgresql+psycopg2://planner@/tune?host={root}&port={port}"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True,
                       timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def _probing(engine) -> bool:
    """A trial is probed and another is probing, its heartbeat recorded and its candidate and worker
    named (tests/test_tune.py ``_probing_now``: a worker killed before its first heartbeat leaves a
    trial Optuna never fails; the objective names the worker after the candidate)."""
    import sqlalchemy

    try:
        with engine.connect() as con:
            complete = con.execute(sqlalchemy.text("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'")).scalar()
            beating = con.execute(sqlalchemy.text(
                "SELECT COUNT(*) FROM trials t JOIN trial_heartbeats h ON h.trial_id = t.trial_id"
                " JOIN trial_user_attributes a ON a.trial_id = t.trial_id"
                " WHERE t.state = 'RUNNING' AND a.key = 'worker'")).scalar()
    except sqlalchemy.exc.SQLAlchemyError:  # the tables are not created yet
        return False
    return complete >= 1 and beating >= 1


@pytest.mark.heavy
def test_workers_share_a_study_and_a_killed_workers_trial_is_retried(postgres):
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    budget = 4
    cmd = _tune_cmd(postgres, budget, "--study-name", "race")
    workers = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
               for _ in range(2)]
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres)
    deadline = time.time() + 600
    while not _probing(engine) and time.time() < deadline and all(w.poll() is None for w in workers):
        time.sleep(0.2)
    engine.dispose()
    study = optuna.load_study(study_name="race", storage=postgres)
    # the other worker may have a trial just started, its candidate and worker not yet named
    running = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING and "worker" in t.user_attrs]
    assert running, "no trial was probing"
    # kill the worker whose process probes the running trial (its host:pid is a user attribute)
    pid = int(running[0].user_attrs["worker"].rsplit(":", 1)[1])
    victim = next(w for w in workers if w.pid == pid)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    other = next(w for w in workers if w is not victim)
    _, err = other.communicate(timeout=600)
    assert other.returncode == 0, err[-2000:]
    time.sleep(2.5)  # past the heartbeat's grace period, should the killed trial still be RUNNING
    # resumed with one probe more: the killed trial is failed as stale at the start and its
    # candidate probed first, unless the other worker had already retried it
    done = subprocess.run(_tune_cmd(postgres, budget + 1, "--study-name", "race"), capture_output=True, text=True,
                          timeout=600)  # (--json: _tune_cmd's)
    assert done.returncode == 0, done.stderr[-2000:]
    after = optuna.load_study(study_name="race", storage=postgres)
    keys = probed(after)
    assert len(keys) == budget + 1 and len(set(keys)) == budget + 1  # the budget, each candidate once
    lost = after.trials[running[0].number]
    assert lost.state == optuna.trial.TrialState.FAIL
    assert tuple(lost.user_attrs["candidate"]) in keys  # the killed worker's candidate was probed again
    assert json.loads(done.stdout)["probes"] == budget + 1
    assert {t.user_attrs["worker"] for t in after.trials if t.user_attrs.get("probed")} - {
        running[0].user_attrs["worker"]}, "no other worker probed"
