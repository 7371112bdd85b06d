"""``planner tune``: spend a budget of probes to find the plan that is fastest when measured.

An Optuna study over the search space ``suggest`` uses (planner/engine/space.py: the strategies' choices
and micro-batch sizes), in a storage that outlives the process:
- the analytic model ranks the space first (planner/engine/search.py); its top candidates are enqueued,
  so the first probes go where the model expects the best plans;
- every trial is evaluated analytically first: a candidate predicted not to fit is recorded as an
  infeasible trial (``trial.set_constraint``) and no probe is spent on it;
- the rest are probed by the fidelity given (``probe``: measured on a GPU, traced memory with the
  analytic time on a CPU, or the analytic model itself); a probe's OOM is an infeasible trial
  (memory constraint > 0), a crash or timeout is recorded with its message, never raised;
- every trial records the fidelity that produced its values and, for probed ones, the analytic
  prediction beside the probe's figures;
- a candidate already probed (by this worker, another worker, or before an interruption) is never
  probed again: a trial that samples it is pruned and the best unprobed candidate is enqueued;
- a worker that dies mid-probe leaves a trial whose heartbeat stops; once stale it is failed and
  retried (Optuna's RetryHeartbeatStaleTrialCallback), so no trial is lost; one that dies in the
  instant between creating a trial and its first heartbeat leaves a trial Optuna never reclaims,
  so a later tune fails and re-enqueues it (``_reclaim_orphans``);
- it stops at ``trials`` probes (over the whole study, so a resumed tune continues its count),
  at ``timeout``, or early when no unprobed candidate can beat the best measured one by more than
  the model's error band (see ``can_still_win``).

No torch here: probes are passed in as a function (probes/tune_probes.py builds them).
"""

import hashlib
import json
import os
import socket
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from planner.catalog.models import resolve_model
from planner.core.errors import PlannerInputError
from planner.core.lengths import Batching
from planner.core.numerics import NumericsPolicy
from planner.engine.estimate import default_seq_len, evaluate, result_of
from planner.engine.ranking import TIE_BAND, Candidate, allowed_levels, order, pick, searched
from planner.engine.search import search_plans
from planner.engine.suggest import _space
from planner.schema.tune import Probe, ProbeOutcome, TrialRow, TuneRequest, TuneResult
from planner.strategies import numerics_of

FIDELITIES = ("auto", "analytic", "traced", "measured")
#: Far outside any memory: the constraint of a candidate that cannot run at all.
INFEASIBLE = float(2**60)
#: Measured plans closer than this in tokens/s are ties (run-to-run noise of a timed step on one
#: GPU is ~1-2 %), broken toward the simpler plan as suggest breaks its ties (planner/engine/ranking.py).
MEASURED_TIE_BAND = 0.02
#: Trials (pruned duplicates and analytic rejections included) per probe before the study gives up
#: on a sampler that keeps proposing what was already decided.
TRIALS_PER_PROBE_CAP = 30
#: Seconds after which a RUNNING trial that never recorded a heartbeat is taken for dead. A live
#: worker records its first heartbeat right after creating the trial; only a write lock can delay
#: that, and SQLite waits at most its 120 s lock timeout (``_open_study``). Optuna never fails such
#: a trial itself (its stale check skips trials with no heartbeat), so ``_reclaim_orphans`` does.
ORPHAN_AFTER_SECONDS = 300.0


def study_name(req: TuneRequest, fidelity: str) -> str:
    """Default name: the model, GPUs, fidelity and a hash of everything that shapes the space, so
    the same command resumes the same study and a changed one starts another."""
    shape = req.model_dump(mode="json", exclude={"timeout", "probe_timeout", "storage", "study_name", "out", "calibration",
                                                  "probes", "enqueue", "heartbeat_seconds", "top", "engine",
                                                  "trials", "band"})
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]
    slug = "".join(ch if ch.isalnum() else "-" for ch in req.model.split("/")[-1]).strip("-")
    return f"tune-{slug}-{req.gpus}-{fidelity}-{digest}"


def default_storage(out: Path | None) -> str:
    """A SQLite study file next to the output (``--out``), else in the working directory; never
    through a symlink or onto something that is not a regular file (SQLite would write there)."""
    path = (out / "study.db") if out is not None else Path("planner-tune.db")
    if path.is_symlink() or (os.path.lexists(path) and not path.is_file()):
        raise PlannerInputError(f"{path} is a symlink or not a regular file: planner does not write its study through it",
                                hint="Remove it, or pass --storage with a study file of your own.")
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path.resolve()}"


def can_still_win(analytic_tps: float, best_measured: float, ratio: float, band: float) -> bool:
    """Whether a candidate the model rates at ``analytic_tps`` tokens/s could beat the best
    measured one: its expected measured rate is analytic x ``ratio`` (the median measured/analytic
    ratio of the probes so far: the model's bias on this machine), and it may do ``band`` better
    than expected (the model's error band). Unit: tokens/s; both sides per the same GPU count."""
    return analytic_tps * ratio * (1 + band) > best_measured


def tune(req: TuneRequest, probe: Probe, fidelity: str, on_trial: Callable[[TrialRow, int], None] | None = None,
         notes: list[str] | None = None) -> TuneResult:
    """Run (or resume) the study for ``req`` with ``probe`` until a stop reason (``_Study.stop_reason``)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    import sqlalchemy.exc

    try:
        study = _Study(req, probe, fidelity, on_trial)
        stopped = study.run()
        return study.result(stopped, notes or [])
    except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as e:
        # the storage failed under the study (a database locked past its timeout, a file another
        # program changed, a server gone): what the study holds so far is kept, and a rerun resumes
        raise PlannerInputError(f"--storage {req.storage or 'the study file'}: the study's storage failed: "
                                f"{str(e).splitlines()[0][:300]}",
                                hint="Check the database, then run the same planner tune again: it resumes.") from None


class _Study:
    """One tune: the analytic ranking of the space, the Optuna study in its storage, the objective
    and the stop rule. Every decided candidate is keyed ``(combo index, micro-batch)``."""

    def __init__(self, req: TuneRequest, probe: Probe, fidelity: str,
                 on_trial: Callable[[TrialRow, int], None] | None) -> None:
        import optuna

        model = resolve_model(req.model)
        self.hardware = req.hardware()
        if req.lengths is not None and req.batching_used != Batching.PACKED:
            raise PlannerInputError("tune --lengths with padded batching: a probe runs rows of the plan's full "
                                    "length, not the samples' own, so its speed would not be the plan's",
                                    hint="Run planner suggest with --lengths, or tune packed (--batching packed).")
        if req.seq_len is None:
            req = req.model_copy(update={"seq_len": default_seq_len(model)})
        self.req, self.model, self.probe, self.fidelity, self.on_trial = req, model, probe, fidelity, on_trial
        self.space = _space(req, self.hardware.num_gpus, req.global_batch_size)
        outcome = search_plans(self.space, model, self.hardware, req.margin, req.engine, req.trials, req.seed,
                               sized=False)
        self.ranked, self.levels = _ranked(outcome, req.numerics)
        self.url = req.storage or default_storage(req.out)
        self.name = req.study_name or study_name(req, fidelity)
        self.study = _open_study(self.url, self.name, req)
        _reclaim_orphans(self.study, ORPHAN_AFTER_SECONDS)
        # a dead worker's trial whose heartbeat went stale: failed and re-enqueued now (Optuna checks
        # only when a trial starts, which a study whose budget is spent never does)
        optuna.storages.fail_stale_trials(self.study)
        if not self.study.trials:
            self.study.set_user_attr("request", req.model_dump(mode="json", exclude={"out", "calibration"}))
            self.study.set_user_attr("fidelity", fidelity)
        self.stopped: str | None = None

    def analytic(self, key: tuple[int, int]):
        return evaluate(self.model, self.hardware, self.space.config(self.space.combo(key[0]), key[1]), self.req.margin)

    def trials(self) -> list:
        return self.study.get_trials(deepcopy=False)

    def key_of(self, params: dict) -> tuple[int, int]:
        return self.space.combo_index({f: params[f] for f in self.space.choices}), params["micro_batch_size"]

    def next_unprobed(self, done: set):
        return next((r for r in self.ranked if (r.combo, r.micro_batch_size) not in done), None)

    def enqueue_next(self, trials) -> None:
        """Queue the analytic model's next-best unprobed candidate, one at a time (up to
        ``enqueue`` in all): a short queue lets a retried trial of a dead worker run next."""
        import optuna

        waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
        queued = self.study.user_attrs.get("enqueued", [])
        if waiting or len(queued) >= self.req.enqueue:
            return
        nxt = self.next_unprobed(_probed_keys(trials) | {tuple(k) for k in queued})
        if nxt is not None:
            self.study.set_user_attr("enqueued", [*queued, [nxt.combo, nxt.micro_batch_size]])
            self.study.enqueue_trial(_params(self.space, nxt.combo, nxt.micro_batch_size))

    def objective(self, trial) -> float:
        import optuna

        params = {f: trial.suggest_categorical(f, list(v)) for f, v in self.space.choices.items()}
        params["micro_batch_size"] = trial.suggest_categorical("micro_batch_size", list(self.space.micro_batch_sizes))
        key = self.key_of(params)
        trial.set_user_attr("candidate", list(key))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        claimed = [t for t in self.trials() if t.number < trial.number and t.user_attrs.get("candidate") == list(key)
                   and t.state in (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE)]
        if claimed:  # probed (or being probed) already: never twice; go to the best unprobed candidate
            trial.set_user_attr("duplicate_of", claimed[0].number)
            nxt = self.next_unprobed(_probed_keys(self.trials()) | {key})
            if nxt is not None:
                self.study.enqueue_trial(_params(self.space, nxt.combo, nxt.micro_batch_size), skip_if_exists=True)
            raise optuna.TrialPruned()
        ev = self.analytic(key)
        if not ev.fits:  # the analytic model prunes it: no probe spent
            return self._pruned_by_the_model(trial, ev)
        if self.ranked and numerics_of(ev.ctx.config) not in self.levels:  # --numerics keeps it out
            return self._pruned_by_the_model(trial, ev, f"--numerics {self.req.numerics}: changes numerics")
        return self._probed(trial, ev)

    def _pruned_by_the_model(self, trial, ev, numerics: str = "") -> float:
        trial.set_user_attr("fidelity", "analytic")
        trial.set_user_attr("status", "numerics" if numerics else "predicted not to fit" if ev.feasible else "infeasible")
        trial.set_user_attr("message", numerics or "; ".join(result_of(ev, self.req.margin).reasons)[:500])
        trial.set_user_attr("predicted_peak_bytes", ev.peak)
        trial.set_constraint("memory_shortfall_bytes", INFEASIBLE if numerics or not ev.feasible
                             else float(max(1, ev.peak - ev.usable)))
        return 0.0

    def _probed(self, trial, ev) -> float:
        """Probe the plan; its OOM is over the memory, a crash or timeout knows nothing (never the best)."""
        try:
            outcome = self.probe(result_of(ev, self.req.margin))
        except Exception as e:  # a probe's own failure is a result, recorded on the trial
            outcome = ProbeOutcome(fidelity=self.fidelity, status="error", message=f"{type(e).__name__}: {e}"[:1000])
        tps = ev.tokens_per_step / outcome.step_seconds if outcome.status == "ok" and outcome.step_seconds else 0.0
        for attr, value in (("fidelity", outcome.fidelity), ("status", outcome.status), ("probed", True),
                            ("message", outcome.message[:1000]), ("predicted_peak_bytes", ev.peak),
                            ("predicted_tokens_per_second", ev.tokens_per_second), ("peak_bytes", outcome.peak_bytes),
                            ("tokens_per_second", tps)):
            trial.set_user_attr(attr, value)
        if outcome.status == "ok":
            peak = outcome.peak_bytes if outcome.peak_bytes is not None else ev.peak
            trial.set_constraint("memory_shortfall_bytes", float(peak - ev.usable))
        else:
            trial.set_constraint("memory_shortfall_bytes", 1.0 if outcome.status == "oom" else INFEASIBLE)
        return tps

    def stop_reason(self, trials) -> str | None:
        """Why the study is done (None: go on): budget, every fitting candidate probed, the early
        stop of ``can_still_win``, or a sampler stuck on decided candidates."""
        import optuna
        from optuna.storages import RetryHeartbeatStaleTrialCallback

        req = self.req
        spent = sum(1 for t in trials if _counts(t))
        retries = [t for t in trials if t.state == optuna.trial.TrialState.WAITING
                   and (RetryHeartbeatStaleTrialCallback.retried_trial_number(t) is not None
                        or "retry_of" in t.user_attrs)]
        if spent >= req.probes and not retries:  # a dead worker's probe is owed: it never counted
            return f"probe budget: {spent} probes"
        done = _probed_keys(trials)
        left = [r for r in self.ranked if (r.combo, r.micro_batch_size) not in done]
        if not left:
            return "every candidate that fits was probed"
        ok = [t for t in trials if t.user_attrs.get("probed") and t.user_attrs.get("status") == "ok" and _feasible(t)
              and t.state == optuna.trial.TrialState.COMPLETE]
        if ok:
            best = max(t.user_attrs["tokens_per_second"] for t in ok)
            ratio = statistics.median(t.user_attrs["tokens_per_second"] / t.user_attrs["predicted_tokens_per_second"]
                                      for t in ok)
            if not any(can_still_win(r.tokens_per_second, best, ratio, req.band) for r in left):
                return (f"early: no unprobed candidate can beat {best:,.0f} tokens/s by more than the "
                        f"{req.band:.0%} band (measured/analytic ratio {ratio:.2f})")
        if len(trials) >= TRIALS_PER_PROBE_CAP * max(req.probes, 1):
            return "the sampler kept proposing decided candidates"
        return None

    def after_trial(self, study, frozen) -> None:
        import optuna

        trials = self.trials()
        if self.on_trial is not None and frozen.state != optuna.trial.TrialState.PRUNED:
            self.on_trial(_row(frozen), sum(1 for t in trials if _counts(t)))
        reason = self.stop_reason(trials)
        if reason:
            self.stopped = reason
            study.stop()
        else:
            self.enqueue_next(trials)

    def run(self) -> str:
        self.stopped = self.stop_reason(self.trials()) or (
            None if self.ranked else "nothing fits: the analytic model rejects every candidate")
        if self.ranked and self.stopped is None:
            self.enqueue_next(self.trials())
            self.study.optimize(self.objective, timeout=self.req.timeout, callbacks=[self.after_trial], catch=())
        return self.stopped or (f"timeout after {self.req.timeout:g} s" if self.req.timeout else "stopped")

    def result(self, stopped: str, notes: list[str]) -> TuneResult:
        import optuna

        skip = (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.WAITING)  # duplicates; queued, never run
        final = [t for t in self.trials() if t.state not in skip]
        rows = [_row(t) for t in final]
        measured = [r for r, t in zip(rows, final, strict=True)
                    if r.probed and r.status == "ok" and r.tokens_per_second and _feasible(t)]
        best = _best(measured, self.fidelity)
        best_plan = result_of(self.analytic(self.key_of(best.config)), self.req.margin) if best is not None else None
        return TuneResult(study_name=self.name, storage=self.url, fidelity=self.fidelity,
                          probes=sum(1 for r in rows if r.probed), stopped=stopped, best=best, best_plan=best_plan,
                          trials=rows, notes=notes)


def _ranked(outcome, policy: NumericsPolicy) -> tuple[list, set]:
    """The fitting candidates the study may probe, in the order to probe them: those of the numerics
    levels ``policy`` allows (planner/engine/ranking.py), suggest's ranking first (so the first
    probe is suggest's winner), then the rest by modelled speed."""
    cands = searched(outcome)
    allowed = allowed_levels(cands, policy)
    cands = [c for c in cands if c.numerics in allowed]
    first = order(cands) if cands else []
    chosen = {id(c) for c in first}
    return [c.item for c in first] + [c.item for c in cands if id(c) not in chosen], allowed


def _best(measured: list[TrialRow], fidelity: str) -> TrialRow | None:
    """The winner among measured trials, by the ranking's tie rule: within the band of the fastest,
    the simplest (the model's band for analytic trials; measurement noise for real ones)."""
    if not measured:
        return None
    band = TIE_BAND if fidelity == "analytic" else MEASURED_TIE_BAND
    cands = [Candidate(r, SimpleNamespace(**r.config), r.tokens_per_second or 0.0, r.peak_bytes or 0)
             for r in sorted(measured, key=lambda r: r.number)]
    return pick(cands, band).item


def _counts(t) -> bool:
    """A probe that counts against the budget and decides its candidate: its trial completed, or is
    running with its probe recorded. A worker killed after recording its probe and before Optuna
    finished the trial leaves a failed trial (and Optuna's retry a queued copy of its attributes):
    that probe's result never reached the study, so it is owed."""
    import optuna

    return bool(t.user_attrs.get("probed")) and t.state in (optuna.trial.TrialState.COMPLETE,
                                                            optuna.trial.TrialState.RUNNING)


def _probed_keys(trials) -> set:
    return {tuple(t.user_attrs["candidate"]) for t in trials if _counts(t)}


def _open_study(url: str, name: str, req: TuneRequest):
    """Create or load the study. Workers starting together race to create the schema and the
    study, and SQLite serialises writers: so a lost race (the study or a table just created by
    another worker, a locked database) is retried a few times, with a long lock timeout for SQLite.
    A URL that is not an Optuna storage, or a database that cannot be reached, is bad input at once."""
    import time

    import optuna
    import sqlalchemy.exc
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

    if url.startswith("sqlite"):
        _refuse_foreign_sqlite(url)
    kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else None
    races = (optuna.exceptions.DuplicatedStudyError, sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError)
    for attempt in range(5):
        try:
            storage = RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=req.heartbeat_seconds,
                                 grace_period=2 * req.heartbeat_seconds,
                                 heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3))
            if url.startswith("sqlite"):
                _serialise_sqlite(storage.engine)
            return optuna.create_study(storage=storage, study_name=name, direction="maximize", load_if_exists=True,
                                       sampler=optuna.samplers.TPESampler(seed=req.seed))
        except races as e:
            if attempt == 4 or not _is_race(e):
                raise PlannerInputError(f"--storage {url}: {e}",
                                        hint="Give a reachable Optuna storage URL, e.g. sqlite:///tune.db") from None
            time.sleep(0.5 * (attempt + 1))
        except (ValueError, ImportError, sqlalchemy.exc.ArgumentError, sqlalchemy.exc.SQLAlchemyError) as e:
            raise PlannerInputError(f"--storage {url}: {e}",
                                    hint="Give an Optuna storage URL, e.g. sqlite:///tune.db") from None
    raise AssertionError("unreachable")


def _refuse_foreign_sqlite(url: str) -> None:
    """A SQLite ``--storage`` file that exists and holds tables, but not Optuna's, is the user's
    own database: Optuna would add its tables to it, so it is refused (so is a file that is not
    SQLite). An empty or new file, or an Optuna study, is used."""
    import sqlite3
    from urllib.parse import unquote, urlparse

    raw = unquote(urlparse(url).path)  # sqlite:///rel.db -> /rel.db, sqlite:////abs.db -> //abs.db
    if len(raw) < 2:  # sqlite:// : in memory
        return
    path = Path(raw[1:])
    if not path.is_file() or path.stat().st_size == 0:
        return
    hint = "Give a new file (sqlite:///tune.db), or an Optuna study's."
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise PlannerInputError(f"--storage {url}: {path} is not an SQLite database ({e})", hint=hint) from None
    if tables and not {"studies", "trials"} <= tables:  # (optuna/storages/_rdb/models.py's table names)
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise PlannerInputError(f"--storage {url}: {path} is a database of another program (tables {shown}); "
                                "planner does not add Optuna's tables to it", hint=hint)


def _serialise_sqlite(engine) -> None:
    """Make every transaction on this SQLite engine take the write lock when it begins.

    Optuna hands a queued (WAITING) trial to a worker by reading its state and then setting it
    RUNNING, inside one transaction with ``SELECT ... FOR UPDATE`` (RDBStorage.set_trial_state_values).
    SQLite has no row locks and Python's sqlite3 opens a transaction only at the first write, so two
    workers can both read WAITING and both run the trial; the second to finish then fails with
    "Cannot tell a COMPLETE trial" (optuna/optuna#4621; measured here: 6 workers asking 60 queued
    trials got 7-9 duplicates per run). ``BEGIN IMMEDIATE`` makes the read and the write one atomic
    step, serialising workers on the database lock (which waits up to the 120 s timeout). This is
    SQLAlchemy's documented pysqlite recipe: the driver's own transaction handling is turned off
    (``isolation_level = None``) and the ``begin`` event emits the BEGIN. Connections pooled before
    the listeners existed are dropped so that every later one gets them."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


def _is_race(e: Exception) -> bool:
    """A lost race between workers (retry), not a database that is missing or unreachable (fail)."""
    import optuna

    if isinstance(e, optuna.exceptions.DuplicatedStudyError):
        return True
    text = str(e).lower()
    return any(k in text for k in ("locked", "already exists", "unique constraint", "duplicate"))


def _reclaim_orphans(study, after_seconds: float) -> list[int]:
    """Fail and re-enqueue every RUNNING trial that never recorded a heartbeat and started more than
    ``after_seconds`` ago (by this machine's clock against the creator's ``datetime_start``, both
    local time as Optuna writes them): its worker died before its first heartbeat, and Optuna's
    stale check, which only looks at trials with a heartbeat, would leave it RUNNING for ever and
    its candidate claimed. Reads Optuna's ``trial_heartbeats`` table (RDB storages only). Returns
    the numbers of the trials failed."""
    import datetime

    import optuna
    import sqlalchemy
    from optuna.storages import RDBStorage

    storage = study._storage
    backend = getattr(storage, "_backend", storage)  # Optuna wraps an RDBStorage in a cache
    if not isinstance(backend, RDBStorage):
        return []
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if not running:
        return []
    with backend.engine.connect() as con:
        beating = {row[0] for row in con.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}
    now = datetime.datetime.now()
    failed = []
    for t in running:
        if t._trial_id in beating or t.datetime_start is None or (now - t.datetime_start).total_seconds() < after_seconds:
            continue
        try:
            storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # it finished after all
            continue
        params = t.params or t.system_attrs.get("fixed_params")  # sampled, or queued and not yet sampled
        if params:
            study.enqueue_trial(params, user_attrs={"retry_of": t.number})
        failed.append(t.number)
    return failed


def _params(space, combo: int, mbs: int) -> dict:
    return {k: str(v) for k, v in space.combo(combo).items()} | {"micro_batch_size": mbs}


def _feasible(t) -> bool:
    """Every constraint of the frozen trial is satisfied (Optuna: feasible when all are <= 0)."""
    return all(v <= 0 for v in t.constraints.values())


def _row(t) -> TrialRow:
    a = t.user_attrs
    return TrialRow(number=t.number, state=t.state.name, config=dict(t.params), fidelity=a.get("fidelity", ""),
                    status=a.get("status", ""), probed=_counts(t),
                    predicted_peak_bytes=a.get("predicted_peak_bytes"),
                    predicted_tokens_per_second=a.get("predicted_tokens_per_second"), peak_bytes=a.get("peak_bytes"),
                    tokens_per_second=a.get("tokens_per_second"), message=a.get("message", ""),
                    feasible=_feasible(t))
