"""Which combinations the strategies' rules refuse, remembered by what the rules read.

A search refuses most combinations by a rule (strategies' ``check`` hooks: "bitsandbytes optimizer
under FSDP2", "adapter with offload"), each at the cost of a candidate's context, layout and every
check (~20 us). A check is a pure function of the model, the hardware and the configuration values
it reads, in the order it reads them. So when a combination is refused, the checks are run once
more over a recording view of its configuration, up to the first refusal, and the values read
become one path of a decision trie whose leaf is the refusal's code. A later combination that
reads the same values along the path is refused with the same code without building anything;
one that leaves the trie is evaluated as usual. Exact by construction: the trie never answers for
values its checks did not read. A check that reads anything but the configuration's fields and
properties (a method, a dump) is not remembered; a path that disagrees with the trie (a check whose
reads depend on something else) turns the memo off. tests/test_search_dominance.py compares its
answers with ``check_config`` on random combinations.
"""

from collections.abc import Callable, Mapping
from typing import Any

from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import check_config
from strategies import PlanContext, TrainingConfig

#: What a check may read and be remembered by: the fields, and the properties computed from them.
READABLE = frozenset(TrainingConfig.model_fields) | frozenset(
    name for cls in TrainingConfig.__mro__ for name, value in vars(cls).items() if isinstance(value, property))


class Recording:
    """A configuration that records the first read of each field or property, in order."""

    __slots__ = ("_config", "reads", "seen", "safe")

    def __init__(self, config: TrainingConfig) -> None:
        self._config, self.safe = config, True
        self.reads: list[tuple[str, Any]] = []
        self.seen: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._config, name)
        if name not in READABLE:
            self.safe = False
        elif name not in self.seen:
            self.seen.add(name)
            self.reads.append((name, value))
        return value


class _Node:
    __slots__ = ("name", "branches")

    def __init__(self, name: str) -> None:
        self.name = name
        self.branches: dict[Any, _Node | str] = {}


class RefusalMemo:
    """The rule refusals seen so far for one model on one hardware (one search's space)."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec) -> None:
        self.model, self.hardware = model, hardware
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

    def learn(self, config: TrainingConfig) -> None:
        """Record the path of a configuration a rule refused (``check_config`` up to its first
        refusal, over a recording view)."""
        view = Recording(config)
        codes = check_config(PlanContext(self.model, self.hardware, view), first_only=True).codes
        if not (self.on and view.safe and codes):
            return
        if not view.reads:  # refused whatever the configuration: the leaf is the root
            self.root = codes[0]
            return
        parent: _Node | None = None
        key: Any = None
        node = self.root
        for name, value in view.reads:
            if node is None:
                node = _Node(name)
                self._attach(parent, key, node)
            if type(node) is not _Node or node.name != name:
                self.on = False  # the checks read something the trie cannot see
                return
            parent, key, node = node, value, node.branches.get(value)
        if node is not None:  # the same values once refused with another code, or read on
            self.on = node == codes[0] and self.on
            return
        self._attach(parent, key, codes[0])

    def _attach(self, parent: _Node | None, key: Any, child: "_Node | str") -> None:
        if parent is None:
            self.root = child
        else:
            parent.branches[key] = child
