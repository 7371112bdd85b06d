"""How a run batches its sequences, and what the lengths of the user's samples make of it.

Three ways a trainer fills a micro-batch of ``b`` sequences with a cap of ``s`` tokens:

- ``packed``: samples concatenated and cut into rows of exactly ``s`` tokens (TRL ``packing``,
  torchtune ``packed``, LLaMA-Factory ``packing``, axolotl ``sample_packing``; the planner launch):
  every position is a real token, the kernels run ``b x s`` tokens, attention at length ``s``.
- ``padded``: one sample per row, truncated to ``s``, each micro-batch padded to its longest row
  (transformers' ``DataCollatorWithPadding`` and TRL's collators, ``padding="longest"``; the
  default of TRL's SFTTrainer, ``packing=False``): the kernels run ``b x L_b`` tokens, where
  ``L_b`` is the longest of the batch's ``b`` samples, padding included (SDPA computes the padded
  positions under its mask).
- ``padded-max``: one sample per row, every row padded to ``s`` (``padding="max_length"``, axolotl
  ``pad_to_sequence_len``): the kernels run ``b x s`` tokens, of which the samples' are real.

Memory is planned at the longest micro-batch a run will meet, since that one sets the peak:
``s`` when packed or padded to the cap; when padded to the longest, the longest sample of the
user's lengths (capped at ``s``): over an epoch some micro-batch holds it. Time is planned at the
expected micro-batch: the samples are drawn independently (a shuffled loader), so ``L_b`` is the
maximum of ``b`` draws from the lengths' distribution, ``P(L_b <= x) = F(x)^b``, and the step's
real tokens are ``b x`` the mean sample length. Attention's FLOPs per row grow with the square of
its length, so its per-token length is ``E[L_b^2] / E[L_b]``.
"""

from dataclasses import dataclass
from enum import StrEnum
from math import fsum


class Batching(StrEnum):
    PACKED = "packed"
    PADDED = "padded"
    PADDED_MAX = "padded-max"


#: What each batching means, in the words a plan's reader sees.
BATCHING_WORDS = {
    Batching.PACKED: "packed sequences (no padding)",
    Batching.PADDED: "one sample per sequence, each micro-batch padded to its longest",
    Batching.PADDED_MAX: "one sample per sequence, padded to the full length",
}


@dataclass(frozen=True)
class Lengths:
    """The token counts of a dataset's samples: ``counts`` holds (tokens, samples) pairs, tokens
    ascending and distinct, every count positive; ``source`` says where they came from."""

    counts: tuple[tuple[int, int], ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.counts:
            raise ValueError("no sample lengths")
        tokens = [t for t, _ in self.counts]
        if tokens != sorted(set(tokens)) or tokens[0] < 1 or any(n < 1 for _, n in self.counts):
            raise ValueError("lengths must be distinct positive token counts, ascending, each with a positive count")

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.counts)

    @property
    def longest(self) -> int:
        return self.counts[-1][0]

    def capped(self, cap: int) -> "Lengths":
        """The lengths a trainer sees after truncating every sample to ``cap`` tokens."""
        kept = [(t, n) for t, n in self.counts if t < cap]
        cut = sum(n for t, n in self.counts if t >= cap)
        return Lengths(tuple(kept + ([(cap, cut)] if cut else [])), self.source)

    def rounded(self, multiple: int) -> "Lengths":
        """The lengths a collator padding every row to a multiple of ``multiple`` makes (each up to
        the next multiple; monotone, so a batch's longest row is its longest sample's, rounded)."""
        if multiple <= 1:
            return self
        merged: dict[int, int] = {}
        for t, n in self.counts:
            up = -(-t // multiple) * multiple
            merged[up] = merged.get(up, 0) + n
        return Lengths(tuple(sorted(merged.items())), self.source)

    @property
    def mean(self) -> float:
        """Mean tokens per sample."""
        return fsum(t * n for t, n in self.counts) / self.samples

    def longest_of(self, draws: int, power: int = 1) -> float:
        """``E[L^power]`` of ``L``, the longest of ``draws`` independent samples:
        ``sum_x x^power (F(x)^draws - F(x-)^draws)``, F the lengths' cumulative distribution."""
        total, below, out = self.samples, 0, []
        for t, n in self.counts:
            above = below + n
            out.append(t ** power * ((above / total) ** draws - (below / total) ** draws))
            below = above
        return fsum(out)


@dataclass(frozen=True)
class Shape:
    """One micro-batch's sequence lengths, as each part of the plan reads them (tokens per
    sequence): ``memory`` the longest micro-batch's rows (the peak's), ``kernel`` the expected
    rows the kernels run (padding included), ``attention`` attention's per-token length,
    ``real`` the expected real tokens of a row (what tokens/s counts)."""

    memory: int
    kernel: float
    attention: float
    real: float


def shape(batching: Batching, cap: int, lengths: Lengths | None, micro_batch_size: int, multiple: int = 1) -> Shape:
    """A micro-batch of ``micro_batch_size`` rows at most ``cap`` tokens long, under ``batching``,
    of samples with ``lengths`` (None: every sample at least ``cap`` long, the longest batch's
    shape for every batch); padded rows padded up to a ``multiple`` of tokens (a sequence split
    over ranks: strategies/sequence_parallel.py ``pad_multiple``), which the kernels run and the
    real tokens do not count."""
    if lengths is None or batching == Batching.PACKED:
        return Shape(cap, cap, cap, cap)
    seen = lengths.capped(cap)
    if batching == Batching.PADDED_MAX:
        return Shape(cap, cap, cap, seen.mean)
    padded = seen.rounded(multiple)
    kernel = padded.longest_of(micro_batch_size)
    return Shape(padded.longest, kernel, padded.longest_of(micro_batch_size, 2) / kernel, seen.mean)
