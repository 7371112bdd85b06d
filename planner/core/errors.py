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


#: A message stays readable whatever the input it quotes: each problem and the hint at most this
#: many characters, at most MAX_PROBLEMS problems (a value of a million characters, or a list
#: repeated ten thousand times, is named, not echoed).
MAX_PROBLEM_CHARS = 800
MAX_PROBLEMS = 20


def bounded(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    """``text``, cut to ``limit`` characters with the length it had when longer."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters in all)"


class PlannerError(Exception):
    """An error the user reads. ``problems`` holds every problem found at once; ``hint`` says what
    to do; ``exit_code`` is what the CLI exits with. Problems and hint are bounded in length
    (``bounded``), and a problem is never empty."""

    exit_code = EXIT_BAD_INPUT
    label = "error"

    def __init__(self, problems: str | list[str], hint: str = "") -> None:
        given = [problems] if isinstance(problems, str) else list(problems)
        kept = [bounded(p) if p.strip() else "(a problem with no description)" for p in given[:MAX_PROBLEMS]]
        if len(given) > MAX_PROBLEMS:
            kept.append(f"... and {len(given) - MAX_PROBLEMS:,} more problems")
        self.problems = kept or ["(a problem with no description)"]
        self.hint = bounded(hint)
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
