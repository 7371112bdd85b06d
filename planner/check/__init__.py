"""`planner check`: will this job fit, before it is queued? ``check(CheckRequest) -> CheckResult``."""

from planner.check.job_check import CheckRequest, CheckResult, check

__all__ = ["CheckRequest", "CheckResult", "check"]
