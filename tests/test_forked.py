"""planner/engine/forked.py: a function run in a forked child returns what it returns in the
parent, raises what it raises, and a child no longer wanted is stopped."""

import os
import time

import pytest

from planner.core.errors import PlannerInputError
from planner.engine import forked
from planner.engine.forked import Forked


def _pid_and_sum(*numbers: int) -> tuple[int, int]:
    return os.getpid(), sum(numbers)


def _refuse(message: str) -> None:
    raise PlannerInputError(message)


def test_the_result_comes_from_a_child_process():
    job = Forked(_pid_and_sum, 1, 2, 3)
    pid, total = job.result()
    assert total == 6 and pid != os.getpid()


def test_an_error_in_the_child_is_raised_in_the_parent():
    with pytest.raises(PlannerInputError, match="no room"):
        Forked(_refuse, "no room").result()


def _marked() -> str | None:
    return os.environ.get("PLANNER_TEST_FORKED")


def test_in_child_runs_before_the_function_in_the_child_only():
    job = Forked(_marked, in_child=lambda: os.environ.__setitem__("PLANNER_TEST_FORKED", "child"))
    assert job.result() == "child" and "PLANNER_TEST_FORKED" not in os.environ


def test_without_fork_the_function_runs_in_the_parent_when_asked(monkeypatch):
    monkeypatch.setattr(forked.os, "cpu_count", lambda: 1)
    job = Forked(_pid_and_sum, 5)
    assert job.result() == (os.getpid(), 5)


def test_close_stops_a_child_whose_result_is_not_wanted():
    job = Forked(time.sleep, 60)
    pid = job._pid
    assert pid is not None
    start = time.perf_counter()
    job.close()
    assert time.perf_counter() - start < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped


def _die() -> int:
    if os.environ.get("PLANNER_TEST_FORKED_PARENT") != str(os.getppid()):
        return 7  # (in the parent: the function's own answer)
    os._exit(9)  # in the child: dies without an answer


def test_a_child_that_dies_has_its_work_done_in_the_parent(monkeypatch):
    monkeypatch.setenv("PLANNER_TEST_FORKED_PARENT", str(os.getpid()))
    assert Forked(_die).result() == 7


def test_the_result_is_kept():
    job = Forked(_pid_and_sum, 2, 3)
    assert job.result() == job.result() and job.result()[1] == 5
