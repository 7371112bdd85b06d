"""Properties the memory model must hold for every configuration (hypothesis)."""


from hypothesis import assume, given, settings
from hypothesis import strategies as st

from planner.catalog.models import catalog
from planner.core.ledger import Phase
from planner.strategies import TECHNIQUES
from planner.strategies.checkpointing import Checkpointing

from helpers import examples, run

MODELS = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-0.5B", "google/gemma-2-2b", "microsoft/Phi-3-mini-4k-instruct",
          "openai-community/gpt2", "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-0.6B"]
GPUS = ["1xA100-80", "1xH100-80", "8xH100-80", "2x8xH100-80", "4xRTX4090-24", "1xMI300X"]
SETTINGS = settings(max_examples=examples(150))

configs = st.fixed_dictionaries({  # every registered technique, every value
    **{s.field: st.sampled_from(s.choices) for s in TECHNIQUES},
    "micro_batch_size": st.integers(1, 16),
    "grad_accum": st.integers(1, 8),
    "seq_len": st.sampled_from([128, 512, 1000, 2048, 4096]),
})


def required(r) -> int:
    """Peak GPU bytes the configuration needs (paged state fills whatever is left, so exclude it)."""
    return r.memory["peak"] - (r.paged.resident_bytes if r.paged else 0)


def reserve_in(r, phase) -> int:
    """Bytes of the caching allocator's GPU reserve rows alive in ``phase`` (a pool may be held in
    some phases only: a stream's pool, the whole 4-bit base's load lifting each phase)."""
    return sum(row.bytes for row in r.ledger if row.term == "allocator_reserve" and row.location == "gpu"
               and phase in row.phases)


def held(r) -> int:
    """The tensors and the CUDA context at their own peak: the largest phase less its reserve (the
    peak's phase may be another one, lifted by a reserve the tensors' phase does not hold)."""
    paged = r.paged.resident_bytes if r.paged else 0
    return max(r.phase_peaks[p] - reserve_in(r, p) for p in r.phase_peaks) - paged


def reserve_fraction(r) -> float:
    """The reserve the allocated peak scales (the rows held in every phase: the fragmentation
    fraction and the techniques' own, strategies.reserve_extra) over the allocated peak."""
    scaled = sum(row.bytes for row in r.ledger if row.term == "allocator_reserve" and row.location == "gpu"
                 and set(row.phases) == set(Phase))
    return scaled / r.allocated_peak_bytes


def checkpoint_inputs(r) -> int:
    """Bytes of the masks checkpointed layers keep as inputs (0 without eager masks or checkpointing)."""
    return sum(row.bytes for row in r.ledger if row.label == "attention masks (checkpoint inputs)")


def activation_bytes(r, phase) -> int:
    return sum(row.bytes for row in r.ledger if row.term == "activations" and phase in row.phases)


@SETTINGS
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS), cfg=configs,
       more_batch=st.integers(0, 8), more_seq=st.sampled_from([0, 1, 128, 2048]))
def test_memory_never_decreases_as_batch_or_sequence_grow(model, gpus, cfg, more_batch, more_seq):
    # (TiledMLP's tiles are ceil(sequence / hidden): one token more can add a tile and shrink each,
    # as DeepSpeed's recipe cuts them; test_one_token_more_can_add_a_tile_and_lower_the_peak)
    assume(str(cfg["tiled_mlp"]) == "none" or more_seq == 0)
    small = run(model, gpus, **cfg)
    big = run(model, gpus, **(cfg | {"micro_batch_size": cfg["micro_batch_size"] + more_batch,
                                     "seq_len": cfg["seq_len"] + more_seq}))
    assert big.memory["peak"] >= small.memory["peak"]
    assert required(big) >= required(small)
    for phase in small.phase_peaks:
        # (the load's moment, a QLoRA base's whole 4-bit copy in the allocator's cache, is a phase of
        # its own only while it tops training's: where it no longer does, the bigger plan's peak holds it)
        assert big.phase_peaks.get(phase, big.memory["peak"]) >= small.phase_peaks[phase] or big.paged


@SETTINGS
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS), cfg=configs,
       sizes=st.lists(st.integers(1, 32), min_size=3, max_size=3, unique=True).map(sorted))
def test_memory_is_convex_in_the_micro_batch(model, gpus, cfg, sizes):
    """Beyond two micro-batch sizes, the GPU bytes a plan needs (``required``) lie on or above the
    line through them, to the rows' rounding, unless a choice says its memory is a staircase
    (``Choice.convex``: Liger's chunked loss): the search proves a size too large from that line
    without evaluating it (planner/engine/search.py ``_first_proven_miss``)."""
    from planner.engine.search import CHORD_SLACK_BYTES
    from planner.strategies import memory_convex

    assume(memory_convex(cfg))
    a, b, c = (required(run(model, gpus, **(cfg | {"micro_batch_size": size}))) for size in sizes)
    chord = b + (sizes[2] - sizes[1]) * (b - a) / (sizes[1] - sizes[0])
    assert c >= chord - CHORD_SLACK_BYTES, (sizes, a, b, c, chord)
    # the search's sizes share a global batch: the accumulation falls as the micro-batch grows, and
    # memory reads it only as one micro-batch per step or several
    if cfg["grad_accum"] > 1:
        other = run(model, gpus, **(cfg | {"micro_batch_size": sizes[2], "grad_accum": 2 + cfg["grad_accum"]}))
        assert required(other) == c


def test_the_chunked_loss_is_a_staircase():
    """Why the chunked loss says its memory is not convex: Liger's chunk is a power of two of tokens,
    so a size just past a doubling puts the line through it above a larger size's memory."""
    from planner.engine.search import CHORD_SLACK_BYTES
    from planner.strategies import memory_convex

    cfg = dict(loss="chunked", precision="fp16-mixed", optimizer="adamw", grad_accum=2, seq_len=128)
    assert not memory_convex(dict(run("meta-llama/Llama-3.1-8B", "1xA100-80", **cfg).config))
    a, b, c = (required(run("meta-llama/Llama-3.1-8B", "1xA100-80", **cfg, micro_batch_size=n)) for n in (3, 25, 27))
    assert c < b + (27 - 25) * (b - a) / (25 - 3) - CHORD_SLACK_BYTES


@SETTINGS
@given(model=st.sampled_from(MODELS), cfg=configs,
       sizes=st.sampled_from([("2xH100-80", "4xH100-80"), ("4xH100-80", "8xH100-80"), ("8xH100-80", "2x8xH100-80"),
                              ("2x8xH100-80", "4x8xH100-80"), ("2xH100-80", "4x8xH100-80")]))
def test_more_shards_never_increase_per_gpu_memory(model, cfg, sizes):
    assume(cfg["sharding"] != "none")
    fewer, more = (run(model, g, host_memory_gb=100_000, **cfg) for g in sizes)
    # (a tensor-parallel degree of every GPU is refused, its layout degenerate: compared where both run)
    assume(cfg["tensor_parallel"] == "none" or fewer.feasible and more.feasible)
    assert required(more) <= required(fewer)


@SETTINGS
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS), cfg=configs)
def test_checkpointing_never_increases_activations(model, gpus, cfg):
    """Checkpointing adds one thing no-checkpointing frees after the forward: the eager attention
    masks every checkpointed layer keeps as an input until its backward (at 128 tokens in fp32,
    64 KiB at the first layer's backward, more than the recompute saves). Beyond those, fewer
    activations and no higher peak. An adapter refuses selective checkpointing (strategies/adapter.py
    ALLOWS), so with one only full and none are compared."""
    # (tensor parallelism refuses adapters, strategies/tensor_parallel.py: with one, the first layer's
    # moment, holding the kept unit's prefetched all-gather, can be the peak without checkpointing,
    # where the adapter's backward temporaries are counted under full checkpointing only)
    assume(cfg["tensor_parallel"] == "none" or cfg["adapter"] == "none")
    # (offload moves what full checkpointing keeps, and is refused without it: compared without it)
    none, selective, full = (run(model, gpus, **(cfg | {"checkpointing": c, "checkpoint_offload": "none"}))
                             for c in Checkpointing)
    # (a plan the rules refuse is never offered: selective checkpointing over a tiled MLP, say)
    assume(none.feasible and full.feasible)
    if not selective.feasible:
        selective = full
    masks = checkpoint_inputs(selective)
    assert masks == checkpoint_inputs(full) and checkpoint_inputs(none) == 0
    if cfg.get("adapter", "none") != "none":
        selective = full
    for phase in Phase:
        assert activation_bytes(full, phase) <= activation_bytes(selective, phase) <= activation_bytes(none, phase) + masks
    # the tensors the peak holds (the allocator's reserve aside: measured on an H100, checkpointing's
    # recompute keeps a larger reserve, strategies/checkpointing.py ``reserve``)
    assert held(full) <= held(selective) <= held(none) + masks
    assert reserve_fraction(full) >= reserve_fraction(selective) - 1e-6 >= reserve_fraction(none) - 2e-6


@SETTINGS
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS), cfg=configs)
def test_ledger_terms_sum_to_the_peak(model, gpus, cfg):
    r = run(model, gpus, **cfg)
    terms = {k: v for k, v in r.memory.items() if k != "peak"}
    assert sum(terms.values()) == r.memory["peak"] == max(r.phase_peaks.values())
    assert all(row.bytes >= 0 for row in r.ledger)
    assert r.fits == (r.feasible and r.headroom_bytes >= 0 and r.host_memory["peak"] <= r.host_memory["capacity"])


@SETTINGS
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from(GPUS), cfg=configs)
def test_the_one_pass_peaks_equal_the_phase_by_phase_ones(model, gpus, cfg):
    """``gpu_peaks`` (one pass, the search's hot path) equals the GPU peak and the allocated peak
    (the rows less the NOT_ALLOCATED terms) taken phase by phase through ``resident``, on every
    ledger, moments and stream pools included."""
    from planner.catalog.gpus import parse_gpus
    from planner.catalog.models import resolve_model
    from planner.core.ledger import NOT_ALLOCATED, Location, gpu_peaks, phase_sum
    from planner.engine.estimate import evaluate
    from planner.strategies import TrainingConfig

    rows = evaluate(resolve_model(model), parse_gpus(gpus), TrainingConfig(**cfg)).ledger.rows
    tensors = [r for r in rows if r.term not in NOT_ALLOCATED]
    assert gpu_peaks(rows) == (max(phase_sum(rows, p, Location.GPU) for p in Phase),
                               max(phase_sum(tensors, p, Location.GPU) for p in Phase))


def test_8bit_states_are_smaller_than_32bit_for_every_catalog_model():
    pairs = [("adamw-8bit", "adamw"), ("paged-adamw-8bit", "paged-adamw"), ("lion-8bit", "lion")]
    for model in catalog():
        for precision in ("bf16-mixed", "bf16-pure"):
            for eight, full in pairs:
                a = run(model, "1xH200", optimizer=eight, precision=precision)
                b = run(model, "1xH200", optimizer=full, precision=precision)
                states = lambda r: sum(x.bytes for x in r.ledger if x.term == "optimizer_states")  # noqa: E731
                assert states(a) < states(b), (model, precision, eight)


def test_one_token_more_can_add_a_tile_and_lower_the_peak():
    """TiledMLP cuts a sequence into ceil(seq / hidden) tiles (DeepSpeed's recipe): Qwen3-0.6B's
    2,048 tokens are 2 tiles of 1,024, 2,049 are 3 of 683, so a layer's MLP backward holds a
    smaller tile's intermediates and the backward peak drops (the batch's growth never does: the
    tiles are per sequence)."""
    from planner.cost.activations import tiled_mlp_tile_tokens

    assert [tiled_mlp_tile_tokens(seq, 1, 1024) for seq in (2048, 2049)] == [1024, 683]
    cfg = dict(optimizer="adamw", precision="fp32", checkpointing="none", sharding="none", offload="none",
               loss="standard", tiled_mlp="tiled", micro_batch_size=1, grad_accum=1)
    short, longer = (run("Qwen/Qwen3-0.6B", "1xA100-80", **cfg, seq_len=seq) for seq in (2048, 2049))
    assert longer.phase_peaks[Phase.BACKWARD] < short.phase_peaks[Phase.BACKWARD]
    wider = run("Qwen/Qwen3-0.6B", "1xA100-80", **(cfg | {"micro_batch_size": 2}), seq_len=2048)
    assert wider.phase_peaks[Phase.BACKWARD] > short.phase_peaks[Phase.BACKWARD]
