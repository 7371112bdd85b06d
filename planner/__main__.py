"""``python -m planner``: the command line."""

from planner.cli import main

main()
