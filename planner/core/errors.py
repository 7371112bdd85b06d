"""Errors a user can cause, and the exit codes the CLI maps them to.

Exit codes (documented in README and ``--help``):
    0  the plan fits
    1  the plan does not fit, or the combination is infeasible
    2  bad input: a flag, a spec or a file the planner cannot use
    3  planner probe: the probe itself failed (crash, timeout)
"""

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2
EXIT_PROBE_FAILED = 3  # planner probe: the probe itself failed (crash, timeout)


class PlannerInputError(Exception):
    """Bad user input. ``problems`` holds every problem found at once; ``hint`` says what to do."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: str | list[str], hint: str = "") -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.hint = hint
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = "\n".join(self.problems)
        return f"{text}\n{self.hint}" if self.hint else text
