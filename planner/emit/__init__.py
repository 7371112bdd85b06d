"""Emit a plan as the files its users launch with (accelerate, DeepSpeed, Trainer, launch.sh,
plan.json, PLAN.md)."""

from planner.emit.files import (
    FILE_NAMES,
    build_files,
    emit,
    launch_script,
    load_plan_file,
    single_plan_result,
    write_files,
)

__all__ = ["FILE_NAMES", "build_files", "emit", "launch_script", "load_plan_file", "single_plan_result",
           "write_files"]
