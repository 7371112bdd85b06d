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
from typing import Any

from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import Shared, check_config, size_free_key
from planner.engine.recorded import Node, ReadTrie, Recording, SharedLayoutContext
from planner.strategies import PlanContext, TrainingConfig


class RefusalMemo:
    """The rule refusals seen so far for one model on one hardware (one search's space).
    ``shared``: the search's evaluations' ``Shared``, where ``check`` leaves each check it makes
    (and its context) for the evaluation that follows, so no combination is checked twice."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, shared: Shared | None = None) -> None:
        self.model, self.hardware, self.shared = model, hardware, shared
        self.trie = ReadTrie()

    @property
    def on(self) -> bool:
        return self.trie.on

    def refusal(self, values: Mapping[str, Any], config: Callable[[], TrainingConfig]) -> str | None:
        """The code of the rule that refuses the configuration, when the trie knows it; else None
        (it may be feasible, or refused along a path not seen yet). ``values``: its fields;
        ``config``: builds it, for a property the trie reads. (The trie's walk, inline: the
        search asks this of every combination.)"""
        node, built = self.trie.root, None
        while type(node) is Node:
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
               else SharedLayoutContext(self.model, self.hardware, view, self.shared.layouts))
        check = check_config(ctx, first_only=True)
        if self.shared is not None:
            self.shared.checks[size_free_key(config)] = (check, ctx)
        if check.codes and self.on and view.safe:
            self.trie.record(view.reads, check.codes[0])
        return check.codes[0] if check.codes else None
