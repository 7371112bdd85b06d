"""Which combinations the strategies' rules refuse, remembered by what the rules read.

A search refuses most combinations by a rule (strategies' ``check`` hooks: "bitsandbytes optimizer
under FSDP2", "adapter with offload"), each at the cost of a candidate's context, layout and every
check (~20 us). A check is a pure function of the model, the hardware and the configuration values
it reads, in the order it reads them. So a combination the memo does not know is checked over a
recording view of its configuration, up to the first refusal (once: that check serves its
evaluation, ``Shared``); when refused, the values read become one path of a decision trie whose
leaf is the refusal's code. A later combination that reads the same values along the path is
refused with the same code without building anything; one that leaves the trie is checked and
evaluated as usual. The layout a check reads is the search's shared one, with the fields that
decide it (``LAYOUT_INPUTS``) read through the view. Exact by construction: the trie never
answers for values its checks did not read. A check that reads anything but the configuration's fields and
properties (a method, a dump) is not remembered; a path that disagrees with the trie (a check whose
reads depend on something else) turns the memo off. tests/test_search_dominance.py compares its
answers with ``check_config`` on random combinations.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import Shared, check_config, size_free_key
from planner.strategies import PlanContext, PlanLayout, TrainingConfig
from planner.strategies.base import LAYOUT_INPUTS

#: What a check may read and be remembered by: the fields, and the properties computed from them.
READABLE = frozenset(TrainingConfig.model_fields) | frozenset(
    name for cls in TrainingConfig.__mro__ for name, value in vars(cls).items() if isinstance(value, property))


class Recording:
    """A configuration that records the first read of each field or property, in order (a value
    read is then kept on the view, so a later read of it costs what a plain attribute does)."""

    def __init__(self, config: TrainingConfig) -> None:
        self._config, self.safe = config, True
        self.reads: list[tuple[str, Any]] = []

    @property
    def unwrapped(self) -> TrainingConfig:
        """The configuration itself (reads of it are not recorded)."""
        return self._config

    @property
    def seen(self) -> set[str]:
        return {name for name, _ in self.reads}

    def __getattr__(self, name: str) -> Any:  # (only for names not yet read: see above)
        value = getattr(self._config, name)
        if name not in READABLE:
            self.safe = False
        else:
            self.reads.append((name, value))
            self.__dict__[name] = value
        return value


class _Node:
    __slots__ = ("name", "branches")

    def __init__(self, name: str) -> None:
        self.name = name
        self.branches: dict[Any, _Node | str] = {}


@dataclass(frozen=True)
class _SharedLayoutContext(PlanContext):
    """A context over a recording view whose layout is the shared one for its ``LAYOUT_INPUTS``
    (computed once per distinct tuple of them): those fields, which decide the layout, are read
    through the view when the layout is first asked for, so a path records them."""

    layouts: dict = field(default_factory=dict, compare=False)

    @cached_property
    def layout(self) -> PlanLayout:
        key = tuple(getattr(self.config, f) for f in LAYOUT_INPUTS)
        if key not in self.layouts:
            self.layouts[key] = PlanContext(self.model, self.hardware, self.config.unwrapped).layout
        return self.layouts[key]


class RefusalMemo:
    """The rule refusals seen so far for one model on one hardware (one search's space).
    ``shared``: the search's evaluations' ``Shared``, where ``check`` leaves each check it makes
    (and its context) for the evaluation that follows, so no combination is checked twice."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, shared: Shared | None = None) -> None:
        self.model, self.hardware, self.shared = model, hardware, shared
        self.root: _Node | str | None = None
        self.on = True

    def refusal(self, values: Mapping[str, Any], config: Callable[[], TrainingConfig]) -> str | None:
        """The code of the rule that refuses the configuration, when the trie knows it; else None
        (it may be feasible, or refused along a path not seen yet). ``values``: its fields;
        ``config``: builds it, for a property the trie reads."""
        node, built = self.root, None
        while type(node) is _Node:
            if node.name in values:
                value = values[node.name]
            else:
                built = built or config()
                value = getattr(built, node.name)
            node = node.branches.get(value)
        return node if self.on and isinstance(node, str) else None

    def check(self, config: TrainingConfig) -> str | None:
        """The code of the first rule that refuses ``config`` (None: feasible), from
        ``check_config`` up to its first refusal over a recording view: a refusal's path is
        recorded; with ``shared``, the check and its context are left there."""
        view = Recording(config)
        ctx = (PlanContext(self.model, self.hardware, view) if self.shared is None
               else _SharedLayoutContext(self.model, self.hardware, view, self.shared.layouts))
        check = check_config(ctx, first_only=True)
        if self.shared is not None:
            self.shared.checks[size_free_key(config)] = (check, ctx)
        if check.codes and self.on and view.safe:
            self._record(view.reads, check.codes[0])
        return check.codes[0] if check.codes else None

    def _record(self, reads: list[tuple[str, Any]], code: str) -> None:
        """A refusal's path: the values its checks read, in order."""
        if not reads:  # refused whatever the configuration: the leaf is the root
            self.root = code
            return
        parent: _Node | None = None
        key: Any = None
        node = self.root
        for name, value in reads:
            if node is None:
                node = _Node(name)
                self._attach(parent, key, node)
            if type(node) is not _Node or node.name != name:
                self.on = False  # the checks read something the trie cannot see
                return
            parent, key, node = node, value, node.branches.get(value)
        if node is not None:  # the same values once refused with another code, or read on
            self.on = node == code and self.on
            return
        self._attach(parent, key, code)

    def _attach(self, parent: _Node | None, key: Any, child: "_Node | str") -> None:
        if parent is None:
            self.root = child
        else:
            parent.branches[key] = child
