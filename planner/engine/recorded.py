"""Answers remembered by what produced them read: a configuration view that records its reads,
and a decision trie over those reads.

A rule's refusal (planner/engine/refusals.py) and a strategy's ledger rows (``RowMemo``, below)
are pure functions of the model, the hardware and the configuration values they read, in the
order they read them. Computed once over a ``Recording`` view, the values read become one path of
a ``ReadTrie`` whose leaf is the answer; a later configuration that reads the same values along
the path gets the same answer without computing it; one that leaves the trie is computed as
usual. Exact by construction: the trie never answers for values the computation did not read. A
computation that reads anything but the configuration's fields and properties (a method, a dump)
is not remembered; a path that disagrees with the trie (reads that depend on something else)
turns the trie off.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from planner.core.ledger import LedgerDraft, RowDraft
from planner.core.specs import HardwareSpec, ModelSpec
from planner.strategies import PlanContext, PlanLayout, Strategy, TrainingConfig
from planner.strategies.base import LAYOUT_INPUTS

#: What a computation may read and be remembered by: the fields, and the properties computed from them.
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


class Node:
    __slots__ = ("name", "branches")

    def __init__(self, name: str) -> None:
        self.name = name
        self.branches: dict[Any, Any] = {}


class ReadTrie:
    """Answers by the values read to reach them: each path a sequence of (name, value) reads, each
    leaf an answer (any object but a ``Node`` or None)."""

    def __init__(self) -> None:
        self.root: Any = None
        self.on = True

    def lookup(self, read: Callable[[str], Any]) -> Any:
        """The answer along the values ``read(name)`` gives, when the trie has one; else None."""
        node = self.root
        while type(node) is Node:
            node = node.branches.get(read(node.name))
        return node if self.on else None

    def record(self, reads: list[tuple[str, Any]], answer: Any) -> None:
        """One path: the values read, in order, to ``answer``."""
        if not reads:  # whatever the configuration: the leaf is the root
            self.root = answer
            return
        parent: Node | None = None
        key: Any = None
        node = self.root
        for name, value in reads:
            if node is None:
                node = Node(name)
                self._attach(parent, key, node)
            if type(node) is not Node or node.name != name:
                self.on = False  # the reads depend on something the trie cannot see
                return
            parent, key, node = node, value, node.branches.get(value)
        if node is not None:  # the same values once gave another answer, or were read on
            self.on = node == answer and self.on
            return
        self._attach(parent, key, answer)

    def _attach(self, parent: Node | None, key: Any, child: Any) -> None:
        if parent is None:
            self.root = child
        else:
            parent.branches[key] = child


@dataclass(frozen=True)
class SharedLayoutContext(PlanContext):
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


class HookMemo:
    """One hook's answers (a function of a plan context), remembered by the configuration values
    the hook read, for one model on one hardware; ``answer`` gives the remembered one, or computes
    it over a recording view. Answers are shared, never edited."""

    def __init__(self, hook: Callable[[PlanContext], Any], model: ModelSpec, hardware: HardwareSpec,
                 layouts: dict) -> None:
        self.hook, self.model, self.hardware, self.layouts = hook, model, hardware, layouts
        self.trie = ReadTrie()

    def answer(self, config: TrainingConfig) -> Any:
        known = self.trie.lookup(config.__getattribute__)
        if known is not None:
            return known
        view = Recording(config)
        value = self.hook(SharedLayoutContext(self.model, self.hardware, view, self.layouts))
        if view.safe and self.trie.on:
            self.trie.record(view.reads, value)
        return value


class RowMemo(HookMemo):
    """One strategy's ledger rows (its ``apply`` hook), remembered by the configuration values the
    hook read. Rows are final as written and no hook reads another's
    (tests/test_strategies_contract.py), so a remembered tuple of rows is the hook's answer
    wherever the same values are read."""

    def __init__(self, strategy: Strategy, model: ModelSpec, hardware: HardwareSpec, layouts: dict) -> None:
        super().__init__(partial(_rows, strategy), model, hardware, layouts)

    def rows(self, config: TrainingConfig) -> tuple[RowDraft, ...]:
        """The strategy's rows for ``config``: remembered, or written now over a recording view."""
        return self.answer(config)


def _rows(strategy: Strategy, ctx: PlanContext) -> tuple[RowDraft, ...]:
    draft = LedgerDraft()
    strategy.apply(ctx, draft)
    return tuple(draft.rows)
