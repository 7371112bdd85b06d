"""Errors a user or a probe can cause, and the exit codes the CLI maps them to.

Exit codes (documented in README and ``--help``):
    0  the plan fits
    1  the plan does not fit, or the combination is infeasible
    2  bad input: a flag, a spec or a file the planner cannot use
    3  planner probe: the probe itself failed (crash, timeout)

Every error the CLI reports is a ``PlannerError`` carrying its exit code; anything else is a bug
and surfaces as one.
"""

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2
EXIT_PROBE_FAILED = 3  # planner probe: the probe itself failed (crash, timeout)


class PlannerError(Exception):
    """An error the user reads. ``problems`` holds every problem found at once; ``hint`` says what
    to do; ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT_BAD_INPUT
    label = "error"

    def __init__(self, problems: str | list[str], hint: str = "") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.hint = hint
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = "\n".join(self.problems)
        return f"{text}\n{self.hint}" if self.hint else text


class PlannerInputError(PlannerError):
    """Bad user input: a flag, a spec or a file the planner cannot use (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class ProbeFailedError(PlannerError):
    """A probe's own failure: its child process crashed or ran past its timeout (exit 3)."""

    exit_code = EXIT_PROBE_FAILED
    label = "probe failed"
