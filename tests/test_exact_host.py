"""When host RAM decides the numerics, suggest says with how much an exact plan fits
(planner/engine/exact_host.py), and the promise holds: suggest with that --host-memory-gb ranks that
very plan first, and with the common size below the least one named no exact plan fits.

Situations: Llama-3.1-8B full fine-tuning on 1xA100-40 and 1xRTX4090-24 with the default host RAM
(2x GPU memory: 86 and 64 GB), where only approximations fit (8/4-bit states, bf16-pure), and on
8xH100-80, where an exact plan fits and nothing is said."""

import pytest

from planner.engine.nothing_fits import HOST_SIZES_GB
from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies import summary

LLAMA = "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize("gpus", ["1xA100-40", "1xRTX4090-24"])
def test_the_host_ram_named_makes_that_exact_plan_the_winner(gpus):
    first = suggest(SuggestRequest(model=LLAMA, gpus=gpus, top=1))
    assert first.fits and not first.exact_fits, first.plans[0].config
    h = first.exact_host
    assert h is not None and h.least_host_memory_gb <= h.host_memory_gb
    again = suggest(SuggestRequest(model=LLAMA, gpus=gpus, top=1, host_memory_gb=h.host_memory_gb))
    assert again.exact_fits and again.exact_host is None
    winner = again.plans[0]
    assert summary(winner.config) == h.summary
    assert winner.time.tokens_per_second == pytest.approx(h.tokens_per_second, rel=1e-9)
    assert winner.host_memory["peak"] <= winner.host_usable_bytes
    below = max(s for s in HOST_SIZES_GB if s < h.least_host_memory_gb)
    short = suggest(SuggestRequest(model=LLAMA, gpus=gpus, top=1, host_memory_gb=below))
    assert not short.exact_fits and short.exact_host is not None


def test_nothing_is_said_when_an_exact_plan_fits():
    result = suggest(SuggestRequest(model=LLAMA, gpus="8xH100-80", top=1))
    assert result.exact_fits and result.exact_host is None
