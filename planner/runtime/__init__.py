"""The runtime: applies a plan inside a training process, where no configuration key says it.

Each technique that acts on the live model has a runtime module here, named by its strategy's
``runtime`` (strategies/__init__.py drives which run); each may define
- ``model_kwargs(config) -> dict``: keyword arguments of ``from_pretrained`` / ``from_config``;
- ``load_kwargs(config) -> dict``: keyword arguments only a launch's ``from_pretrained`` takes (a
  load sharded over the launcher's processes; the probes apply the same by hand);
- ``prepare(model, config, site, **fallbacks) -> str | None``: change the built model before it is
  wrapped (a note says what was applied, or why not);
- ``wrap(model, config, site) -> (model, str | None)``: replace the model by one that wraps it
  (peft's adapter model), after every ``prepare``.
Every user of a plan applies it the same way: the traced probe (fake tensors), the measured probe
(a real run) and the example trainer under ``accelerate launch``. torch, transformers and
accelerate are imported only when a function runs (DESIGN.md, the runtime layer).
"""

from enum import StrEnum
from importlib import import_module

from planner.strategies import REGISTRY


class Site(StrEnum):
    """Where a plan is applied."""

    TRACED = "traced"  # fake tensors on the CPU (probes/traced.py): what cannot run there is stood in for
    MEASURED = "measured"  # a real run built by the probe itself (probes/measured_setup.py)
    LAUNCH = "launch"  # under accelerate launch with the emitted files: accelerate applies what they say


def modules() -> list:
    """The runtime modules of the registered techniques, in registry order."""
    return [import_module(s.runtime) for s in REGISTRY if s.runtime]


def model_kwargs(config) -> dict:
    """``from_pretrained`` / ``from_config`` keyword arguments every technique asks for."""
    out: dict = {}
    for module in modules():
        if hasattr(module, "model_kwargs"):
            out |= module.model_kwargs(config)
    return out


def load_kwargs(config) -> dict:
    """``from_pretrained``'s keyword arguments in a launched process: ``model_kwargs`` and every
    technique's ``load_kwargs``."""
    out = model_kwargs(config)
    for module in modules():
        if hasattr(module, "load_kwargs"):
            out |= module.load_kwargs(config)
    return out


def prepare(model, config, site: Site, **fallbacks) -> list[str]:
    """Every technique's change to the built model, in registry order; the notes say what was done.
    ``fallbacks``: stand-ins a module may call where the real thing cannot run (the probes' chunked
    loss re-implementation)."""
    notes = []
    for module in modules():
        if hasattr(module, "prepare"):
            note = module.prepare(model, config, site, **fallbacks)
            if note:
                notes.append(note)
    return notes


def wrap(model, config, site: Site) -> tuple:
    """The model every technique's ``wrap`` makes of it (registry order), and their notes."""
    notes = []
    for module in modules():
        if hasattr(module, "wrap"):
            model, note = module.wrap(model, config, site)
            if note:
                notes.append(note)
    return model, notes
