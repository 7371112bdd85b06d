"""The search's shortcuts against the plain exhaustive search, on a fixed corpus of situations.

For each situation (model x GPUs x request: adapters, sequence length, margin, numerics), runs
`planner suggest` twice in process: with the search's shortcuts (planner/engine/search.py
``_scan``: a combination is skipped when a simpler twin, no larger and at least as fast, fits;
planner/engine/refusals.py: a rule refusal seen along the same reads is not evaluated again;
planner/engine/recorded.py: a strategy's ledger rows seen along the same reads are reused; a
candidate whose model states alone exceed the GPU is cut there; only a combination's fastest
micro-batch size is timed, ``_scan_sized``) and without them (every candidate evaluated in
full). Everything the user sees must be equal: the plans (the
winner and the top 5, each in full), the trade-offs, the adapter option, the nearest misses and
the hardware suggestions when nothing fits, the assumptions. Only the counts of what was
evaluated may differ. Prints per situation the evaluations and seconds of both, and exits 1 on
any difference.

    .venv/bin/python benchmarks/search_corpus.py [--only SUBSTRING] [--workers 1]

tests/test_search_dominance.py runs a covering subset of the same corpus (``CORPUS``).
"""

import argparse
import contextlib
import re
import sys
import time

from planner.engine import estimate, refusals, search, space
from planner.engine.suggest import suggest
from planner.schema.suggest import SuggestRequest
from planner.strategies import PlanContext

LLAMA8, LLAMA1, LLAMA70 = "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-70B"
LLAMA405 = "meta-llama/Llama-3.1-405B"
QWEN05, QWEN7 = "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B"
GEMMA, MIXTRAL, GPT2 = "google/gemma-2-2b", "mistralai/Mixtral-8x7B-v0.1", "openai-community/gpt2"

#: (model, --gpus, other request fields). 66 situations: the README's cases, one GPU of every memory
#: class (and one without bf16: V100), several nodes, every adapter (--adapter any), long and short
#: sequences (from 32,768 tokens: every sequence-parallel layout and long-context lever), margins,
#: --numerics exact and any, host RAM given, and six where nothing fits.
CORPUS: list[tuple[str, str, dict]] = [
    (model, gpus, extra)
    for model, gpus in [
        (LLAMA8, "1xA100-40"), (LLAMA8, "8xH100-80"), (LLAMA70, "8xH100-80"), (LLAMA8, "1xRTX4090-24"),
        (LLAMA1, "1xH100-80"), (LLAMA1, "1xV100-32"), (QWEN05, "1xRTX4090-24"), (QWEN05, "8xH100-80"),
        (QWEN7, "4xA100-80"), (GEMMA, "1xL4-24"), (MIXTRAL, "8xH100-80"), (GPT2, "1xT4-16"),
    ]
    for extra in ({}, {"adapter": ["none", "lora", "qlora", "dora", "lora-int8"]}, {"seq_len": 8192},
                  {"numerics": "any", "margin": 0.1}, {"numerics": "exact", "host_memory_gb": 256})
] + [(model, gpus, {}) for model, gpus in [(LLAMA405, "1xRTX4090-24"), (LLAMA70, "1xA100-40"),
                                           (MIXTRAL, "1xRTX4090-24"), (LLAMA8, "1xT4-16")]] + [
    # long sequences: the sequence-parallel layouts and the long-context levers (checkpoint offload, tiled MLP)
    (LLAMA8, "8xH100-80", {"seq_len": 32768}), (QWEN05, "1xRTX4090-24", {"seq_len": 32768})]


def _visible(request: SuggestRequest) -> tuple[dict, int, int]:
    """What the user sees of a suggest result, less the counts of the search's work; evaluations
    and candidates skipped."""
    out = suggest(request).model_dump(mode="json")
    counts = out.pop("evaluated"), out.pop("dominated")
    out.pop("rejected")
    out["reasons"] = [r for r in out["reasons"] if not re.match(r"^[\d,]+ of [\d,]+ candidates fit", r)]
    return out, *counts


@contextlib.contextmanager
def plain_search():
    """The plain exhaustive search: no combination is anyone's twin, no refusal and no ledger row
    remembered, no evaluation cut at its GPU peak floor, every micro-batch size evaluated in full."""
    saved = space._TWINS, search.RefusalMemo, search.exhaustive, estimate.Shared.write, refusals.RefusalMemo.check

    def uncut(*args, cut=None, sizing=None, **kwargs):
        return saved[2](*args, **kwargs)

    def written(shared, strategy, ctx, draft):
        strategy.apply(ctx, draft)

    def checked(memo, values, config):  # (the nothing-fits probes' rule memo: every rule run)
        return estimate.check_config(PlanContext(memo.model, memo.hardware, config()), first_only=True)

    space._TWINS, search.RefusalMemo, search.exhaustive = (), lambda model, hardware, shared=None: None, uncut
    estimate.Shared.write, refusals.RefusalMemo.check = written, checked
    try:
        yield
    finally:
        space._TWINS, search.RefusalMemo, search.exhaustive, estimate.Shared.write, refusals.RefusalMemo.check = saved


def compare(model: str, gpus: str, extra: dict) -> tuple[list[str], dict]:
    """(the fields that differ, figures) for one situation."""
    request = SuggestRequest(model=model, gpus=gpus, **extra)
    t0 = time.perf_counter()
    fast, evaluated, skipped = _visible(request)
    t1 = time.perf_counter()
    with plain_search():
        plain, plain_evaluated, _ = _visible(request)
    t2 = time.perf_counter()
    differ = sorted(k for k in plain if fast.get(k) != plain[k])
    return differ, {"evaluated": evaluated, "skipped": skipped, "plain_evaluated": plain_evaluated,
                    "seconds": t1 - t0, "plain_seconds": t2 - t1, "fits": fast["fits"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--workers", type=int, default=1, help="search workers (1: one process, steadier figures)")
    args = ap.parse_args()
    if args.workers == 1:
        search.PARALLEL_MIN_CANDIDATES = 10**12
    failures, total, plain_total = 0, 0.0, 0.0
    print(f"{'situation':58s} {'fits':4s} {'evals':>6s} {'plain':>6s} {'s':>5s} {'plain s':>7s}  verdict")
    for model, gpus, extra in CORPUS:
        words = " ".join(f"{k}={'any' if k == 'adapter' else v}" for k, v in extra.items())
        name = f"{model.split('/')[1]} {gpus} {words}"
        if args.only not in name:
            continue
        differ, f = compare(model, gpus, extra)
        failures += bool(differ)
        total += f["seconds"]
        plain_total += f["plain_seconds"]
        print(f"{name[:58]:58s} {'yes' if f['fits'] else 'no':4s} {f['evaluated']:6d} {f['plain_evaluated']:6d} "
              f"{f['seconds']:5.2f} {f['plain_seconds']:7.2f}  {'DIFFER: ' + ', '.join(differ) if differ else 'same'}",
              flush=True)
    print(f"total {total:.1f} s against {plain_total:.1f} s for the plain search; {failures} situations differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
