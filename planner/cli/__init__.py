"""The command line (thin): options become one request, one function plans, one renderer prints."""

from planner.cli.app import app, main

__all__ = ["app", "main"]
