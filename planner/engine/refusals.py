"""Which combinations the strategies' rules refuse, remembered rule by rule by what each reads.

A search checks every combination (strategies' ``check`` hooks, then the workload's: "bitsandbytes
optimizer under FSDP2", "adapter with offload"), and building a candidate's context and running
every check costs ~50 us. Each rule is a pure function of the model, the hardware and the
configuration values it reads, in the order it reads them, and it only adds to the ``Check`` it is
given (no rule reads another's findings). So each rule's finding (its codes, messages and
warnings) is remembered in a decision trie of its own over the values it read (a recording view:
planner/engine/recorded.py), and a combination's check is assembled from its rules' findings in
``check_config``'s order, up to the first refusal: a rule whose trie knows the values along its
path costs a walk of that path; only a rule that leaves its trie is run, over a recording view,
and learns the path. A rule reads few fields ("DDP on one GPU" reads the sharding only), so the
tries learn a space's rules from few runs of single rules (1,407 for the 43,200 combinations of
8B on 1xRTX4090-24 with every adapter), where one trie over a whole check's reads needed one
whole check per distinct prefix of values (6,806). The layout a rule
reads is the search's shared one, with the fields that decide it (``LAYOUT_INPUTS``) read through
the view. Exact by construction: a trie never answers for values its rule did not read. A rule
that reads anything but the configuration's fields and properties (a method, a dump) is not
remembered; a path that disagrees with its trie (reads that depend on something else) turns that
trie off, and its rule then runs every time. tests/test_search_dominance.py compares the
assembled checks with ``check_config`` on random combinations.
"""

from collections.abc import Callable, Mapping
from typing import Any

from planner.core.specs import HardwareSpec, ModelSpec
from planner.engine.estimate import Shared, check_workload
from planner.engine.recorded import Node, ReadTrie, Recording, SharedLayoutContext
from planner.strategies import REGISTRY, Check, TrainingConfig

#: ``check_config``'s rules, in its order: each strategy's ``check`` hook, then the workload's.
RULES: tuple[Callable, ...] = (*(s.check for s in REGISTRY), check_workload)

#: A rule's finding: (codes, messages, warnings) it added to a ``Check``.
Finding = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


class RefusalMemo:
    """The rules' findings seen so far for one model on one hardware (one search's space), one
    ``ReadTrie`` per rule. ``shared``: the search's evaluations' ``Shared``, whose layouts the
    rules read and where the search leaves each feasible combination's check for its evaluations."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, shared: Shared | None = None) -> None:
        self.model, self.hardware = model, hardware
        self.shared = shared if shared is not None else Shared()
        self.tries = tuple(ReadTrie() for _ in RULES)

    def check(self, values: Mapping[str, Any], config: Callable[[], TrainingConfig]) -> Check:
        """``check_config(..., first_only=True)`` of the configuration whose fields are ``values``:
        each rule's finding from its trie, or from running the rule now. ``config``: builds the
        configuration, for a property a trie reads and for a rule that runs (at most once)."""
        out, built = Check(), None
        for rule, trie in zip(RULES, self.tries, strict=True):
            node = trie.root
            while type(node) is Node:  # (the trie's walk, inline: every combination of a search comes here)
                if node.name in values:
                    value = values[node.name]
                else:
                    built = built or config()
                    value = getattr(built, node.name)
                node = node.branches.get(value)
            if node is None or not trie.on:
                built = built or config()
                node = self._learn(rule, trie, built)
            codes, messages, warnings = node
            if warnings:
                out.warnings += warnings
            if codes:
                out.codes += codes
                out.infeasible += messages
                return out
        return out

    def refused(self, values: Mapping[str, Any]) -> str | None:
        """The code of the first rule that refuses every configuration with these field values,
        when the tries know it from them alone: each rule before it found nothing to refuse
        along fields given, and it refuses along fields given. None: not known so far (a rule
        reads a field or a property not given, or values it has not seen yet)."""
        for trie in self.tries:
            node = trie.root
            while type(node) is Node:
                if node.name not in values:
                    return None
                node = node.branches.get(values[node.name])
            if node is None or not trie.on:
                return None
            if node[0]:
                return node[0][0]
        return None

    def _learn(self, rule: Callable, trie: ReadTrie, config: TrainingConfig) -> Finding:
        """``rule``'s finding for ``config``, run over a recording view; its path recorded."""
        view, found = Recording(config), Check()
        rule(SharedLayoutContext(self.model, self.hardware, view, self.shared.layouts), found)
        finding = (tuple(found.codes), tuple(found.infeasible), tuple(found.warnings))
        if view.safe and trie.on:
            trie.record(view.reads, finding)
        return finding

