"""Variable-length data (planner/core/lengths.py, planner/engine/lengths_file.py): the batching
statistics against exhaustive enumeration, the reader's formats and refusals, and what padded
batching does to a plan: the peak at the longest micro-batch, time at the expected one, tokens/s
of the samples' own tokens, every fitting size timed by the search, and the launch pads."""

import itertools
import json
import os
import statistics
from math import isclose

import pytest
from typer.testing import CliRunner

from planner.catalog.gpus import parse_gpus
from planner.catalog.models import resolve_model
from planner.cli import app
from planner.core.errors import EXIT_BAD_INPUT, PlannerInputError
from planner.core.lengths import Batching, Lengths, Shape, shape
from planner.engine.estimate import estimate, evaluate
from planner.engine.lengths_file import read_lengths
from planner.engine.space import build_space
from planner.schema.estimate import EstimateRequest
from planner.strategies import TrainingConfig

SMALL = Lengths(((3, 2), (5, 1), (11, 3)))  # six samples: 3, 3, 5, 11, 11, 11 tokens


def _draws(lengths: Lengths):
    return [t for t, n in lengths.counts for _ in range(n)]


@pytest.mark.parametrize("draws", [1, 2, 3, 4])
def test_the_longest_of_independent_draws_is_the_enumerated_expectation(draws):
    """E[L_b] and E[L_b^2] of the longest of ``draws`` samples drawn with replacement, against every
    ordered tuple of samples (6^draws, each equally likely)."""
    samples = _draws(SMALL)
    longest = [max(t) for t in itertools.product(samples, repeat=draws)]
    assert isclose(SMALL.longest_of(draws), statistics.fmean(longest), rel_tol=1e-12)
    assert isclose(SMALL.longest_of(draws, 2), statistics.fmean(x * x for x in longest), rel_tol=1e-12)


def test_truncation_caps_every_longer_sample():
    capped = SMALL.capped(5)
    assert capped.counts == ((3, 2), (5, 4)) and capped.samples == SMALL.samples
    assert isclose(capped.mean, (3 * 2 + 5 * 4) / 6) and SMALL.capped(100) == SMALL


def test_each_batching_shapes_its_micro_batch():
    """Packed rows are the cap long; padded-max rows the cap, of which the samples' are real;
    padded rows the longest of the micro-batch (one row: the sample itself), the peak's the
    longest sample; every sample at least the cap long is packing's shape in every batching."""
    assert shape(Batching.PACKED, 8, SMALL, 4) == (s := shape(Batching.PACKED, 8, None, 4)) and s.kernel == 8
    capped = SMALL.capped(8)
    assert shape(Batching.PADDED_MAX, 8, SMALL, 4) == Shape(8, 8, 8, capped.mean)
    one = shape(Batching.PADDED, 8, SMALL, 1)
    assert one.memory == 8 and isclose(one.kernel, capped.mean) and isclose(one.real, capped.mean)
    assert isclose(one.attention, sum(t * t * n for t, n in capped.counts) / sum(t * n for t, n in capped.counts))
    assert shape(Batching.PADDED, 20, SMALL, 2).memory == 11  # nothing truncated: the longest sample
    for batching in Batching:
        assert shape(batching, 3, SMALL, 4) == shape(Batching.PACKED, 3, None, 4)


def test_the_reader_takes_counts_histograms_and_tokenized_json_lines(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("# one count per sample\n3\n3\n5\n\n11\n11\n11\n")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("11 3\n3 2\n5 1\n")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [{"input_ids": [1, 2, 3], "text": "x"}, {"length": 3},
                                                      {"num_tokens": 5}, {"n_tokens": 11}, {"token_count": 11},
                                                      {"input_ids": list(range(11))}]) + "\n")
    for path in (plain, pairs, rows):
        assert read_lengths(path).counts == SMALL.counts, path.name


@pytest.mark.parametrize("text, words", [
    ("", "no sample lengths"),
    ("12\nabc\n", ":2: 'abc' is not a token count"),
    ("12\n0\n", ":2: tokens must be a whole number from 1"),
    ("12 0\n", ":1: samples must be a whole number from 1"),
    ("4 5 6\n", "is not a token count"),
    ("{\"text\": \"hello\"}\n", ":1: no token count"),
    ("{\"length\": 2.5}\n", "not 2.5"),
    ("{\"length\": true}\n", "not True"),
    ("[1, 2]\n", "is not a token count"),
    ("{bad json\n", ":1: not a JSON object"),
    ("\u00b2\n", "is not a token count"),
])
def test_the_reader_names_the_bad_line(tmp_path, text, words):
    path = tmp_path / "lengths.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlannerInputError) as e:
        read_lengths(path)
    assert words in e.value.message and "planner does not tokenize" in e.value.message


def test_the_reader_refuses_what_is_not_a_text_file(tmp_path):
    binary = tmp_path / "lengths.bin"
    binary.write_bytes(b"\xff\xfe12\n")
    with pytest.raises(PlannerInputError, match="not UTF-8"):
        read_lengths(binary)
    with pytest.raises(PlannerInputError, match="a directory"):
        read_lengths(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(PlannerInputError, match="not a regular file"):  # (read, it would block)
        read_lengths(fifo)


def test_bad_lengths_exit_2_without_a_traceback(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("12\nnot a number\n")
    result = CliRunner().invoke(app, ["estimate", "--model", "meta-llama/Llama-3.2-1B", "--gpus", "1xA100-80",
                                      "--lengths", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT and "Traceback" not in result.output
    assert "lengths.txt:2" in result.output.replace("\n", "")


MODEL, GPUS = "meta-llama/Llama-3.2-1B", "1xA100-80"


def _lengths_file(tmp_path, counts) -> str:
    path = tmp_path / "lengths.txt"
    path.write_text("".join(f"{t} {n}\n" for t, n in counts))
    return str(path)


def test_samples_as_long_as_the_cap_plan_as_packed_rows(tmp_path):
    """Padding samples that all fill the cap pads nothing: the padded plan is the packed one."""
    lengths = _lengths_file(tmp_path, [(2048, 10), (4096, 3)])
    packed = estimate(EstimateRequest(model=MODEL, gpus=GPUS, micro_batch_size=4, seq_len=2048))
    for batching in (Batching.PADDED, Batching.PADDED_MAX):
        padded = estimate(EstimateRequest(model=MODEL, gpus=GPUS, micro_batch_size=4, seq_len=2048,
                                          batching=batching, lengths=lengths))
        assert padded.memory == packed.memory and padded.time == packed.time


def test_padding_holds_the_longest_batch_and_times_the_expected_one(tmp_path):
    """Short samples, padded: the peak is the packed plan's at the longest sample's length (the
    micro-batch that holds it); the kernels run the expected padded rows, more than the real
    tokens, so the step is shorter than at the longest length and the real tokens/s lower than the
    kernels' rate; padding to the cap runs every row at the cap."""
    counts = [(300, 50), (700, 30), (1500, 15), (1800, 5)]
    lengths = Lengths(tuple(counts))
    path = _lengths_file(tmp_path, counts)
    ask = dict(model=MODEL, gpus=GPUS, micro_batch_size=8, seq_len=4096, lengths=path)
    padded = estimate(EstimateRequest(**ask))  # (--lengths: padded unless --batching says otherwise)
    assert padded.config.batching == Batching.PADDED and padded.config.seq_len == 1800
    at_longest = estimate(EstimateRequest(model=MODEL, gpus=GPUS, micro_batch_size=8, seq_len=1800))
    assert padded.memory == at_longest.memory
    assert isclose(padded.config.kernel_seq_len, lengths.longest_of(8))
    assert isclose(padded.config.real_seq_len, lengths.mean) and padded.config.real_seq_len < padded.config.kernel_seq_len
    assert padded.time.step_seconds < at_longest.time.step_seconds
    real = padded.config.real_tokens_per_micro_batch * padded.config.grad_accum
    assert isclose(padded.time.tokens_per_second, real / padded.time.step_seconds)
    to_cap = estimate(EstimateRequest(**ask, batching=Batching.PADDED_MAX))
    packed = estimate(EstimateRequest(model=MODEL, gpus=GPUS, micro_batch_size=8, seq_len=4096))
    assert to_cap.memory == packed.memory and to_cap.time.step_seconds == packed.time.step_seconds
    assert isclose(to_cap.time.tokens_per_second, packed.time.tokens_per_second * lengths.mean / 4096)


def test_the_search_times_every_fitting_size_of_padded_batches(monkeypatch):
    """Padding to the longest of more samples pads more, so tokens/s may fall as the micro-batch
    grows: the sized search then records every size that fits, as the plain search does, and
    both rank alike."""
    from planner.core.numerics import NumericsPolicy
    from planner.engine import search
    from planner.engine.ranking import rank, searched

    lengths = Lengths(((200, 80), (800, 15), (4000, 5)))
    m, hw = resolve_model("Qwen/Qwen2.5-0.5B"), parse_gpus("1xRTX4090-24")
    space = build_space(1, 4096, {"adapter": ["none"]}, batching=Batching.PADDED, lengths=lengths)
    assert space.varying and space.seq_len == 4000
    monkeypatch.setattr("planner.engine.space._TWINS", ())
    monkeypatch.setattr(search, "RefusalMemo", lambda model, hardware, shared=None: None)
    monkeypatch.setattr(search, "PARALLEL_MIN_CANDIDATES", 10**12)
    sized = search.search_plans(space, m, hw)
    with monkeypatch.context() as plain_mode:
        plain_mode.setattr(search, "Sizing", lambda memory, time: None)
        plain = search.search_plans(space, m, hw)
    assert set(sized.fitting) == set(plain.fitting) and sized.rejected == plain.rejected
    by_combo: dict[int, list] = {}
    for r in plain.fitting:
        by_combo.setdefault(r.combo, []).append(r)
    falls = [rs for rs in by_combo.values() if max(rs, key=lambda r: r.tokens_per_second).micro_batch_size
             < max(r.micro_batch_size for r in rs)]
    assert falls  # some combination is fastest below its largest fitting size
    for policy in NumericsPolicy:
        a, b = rank(searched(sized), policy, 5), rank(searched(plain), policy, 5)
        assert [c.item for c in a.plans] == [c.item for c in b.plans]


def test_a_padded_candidate_is_its_own_evaluation():
    """The space's candidate carries its size's shape: evaluating it is evaluating the
    configuration built field by field."""
    lengths = Lengths(((100, 3), (900, 1)))
    space = build_space(1, 1024, batching=Batching.PADDED, lengths=lengths)
    m, hw = resolve_model(MODEL), parse_gpus(GPUS)
    techniques = next(space.technique_combos())
    for size in space.micro_batch_sizes[:4]:
        config = space.config(techniques, size)
        rows = shape(Batching.PADDED, 1024, lengths, size)
        built = TrainingConfig(**(config.model_dump() | {"kernel_seq_len": rows.kernel,
                                                          "attention_seq_len": rows.attention,
                                                          "real_seq_len": rows.real, "seq_len": rows.memory}))
        assert config == built
        a, b = evaluate(m, hw, config), evaluate(m, hw, built)
        assert (a.peak, a.step_seconds, a.tokens_per_second) == (b.peak, b.step_seconds, b.tokens_per_second)


def _check(tmp_path, recipe: dict, **flags):
    import yaml

    from planner.check import CheckRequest, check

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return check(CheckRequest(model=MODEL, gpus=GPUS, training_args=path, alternatives=0, **flags))


@pytest.mark.parametrize("recipe, batching", [
    ({"packing": True, "max_length": 1024}, Batching.PACKED),
    ({"packing": False, "max_length": 1024}, Batching.PADDED),
    ({"max_length": 1024}, Batching.PACKED),  # (a Trainer file does not say: the planner launch packs)
    ({"base_model": "x", "sequence_len": 1024}, Batching.PADDED),  # axolotl: sample_packing off
    ({"base_model": "x", "sequence_len": 1024, "pad_to_sequence_len": True}, Batching.PADDED_MAX),
    ({"base_model": "x", "sequence_len": 1024, "sample_packing": True}, Batching.PACKED),
    ({"stage": "sft", "finetuning_type": "full", "cutoff_len": 1024}, Batching.PADDED),  # LLaMA-Factory
    ({"stage": "pt", "finetuning_type": "full", "cutoff_len": 1024}, Batching.PACKED),  # packs pre-training
    ({"stage": "sft", "finetuning_type": "full", "cutoff_len": 1024, "neat_packing": True}, Batching.PACKED),
])
def test_check_reads_how_a_recipe_batches(tmp_path, recipe, batching):
    result = _check(tmp_path, recipe)
    assert result.estimate.config.batching == batching and result.estimate.config.seq_len == 1024


def test_check_refuses_padding_free_and_times_a_padded_job_with_its_lengths(tmp_path):
    from planner.core.errors import PlannerInputError

    with pytest.raises(PlannerInputError, match="padding_free true"):
        _check(tmp_path, {"packing": False, "padding_free": True, "max_length": 1024})
    counts = [(100, 60), (400, 30), (1024, 10)]
    recipe = {"packing": False, "max_length": 1024, "per_device_train_batch_size": 4}
    full = _check(tmp_path, recipe)
    with_lengths = _check(tmp_path, recipe, lengths=_lengths_file(tmp_path, counts))
    assert with_lengths.estimate.memory == full.estimate.memory  # (the longest sample fills the cap)
    assert isclose(with_lengths.estimate.config.kernel_seq_len, Lengths(tuple(counts)).longest_of(4))
    assert with_lengths.estimate.time.step_seconds < full.estimate.time.step_seconds


def test_tune_refuses_padded_lengths_it_would_not_measure(tmp_path):
    result = CliRunner().invoke(app, ["tune", "--model", MODEL, "--gpus", GPUS, "--lengths",
                                      _lengths_file(tmp_path, [(100, 3), (500, 1)]), "--out", str(tmp_path / "t")])
    assert result.exit_code == EXIT_BAD_INPUT and "Traceback" not in result.output
    assert "not the samples' own" in result.output


def test_a_padded_plan_rechecks_with_estimate_from_its_own_fields(tmp_path):
    """A suggested padded plan's configuration (as plan.json holds it, its shape included) is
    estimated again to the same memory and time, without the lengths file."""
    from planner.engine.suggest import suggest
    from planner.schema.suggest import SuggestRequest

    path = _lengths_file(tmp_path, [(120, 40), (600, 20), (1500, 4)])
    result = suggest(SuggestRequest(model=MODEL, gpus=GPUS, lengths=path, seq_len=2048, top=3))
    assert result.seq_len == 1500 and result.plans
    for p in result.plans:
        assert p.config.batching == Batching.PADDED and p.config.real_seq_len is not None
        again = estimate(EstimateRequest(model=MODEL, gpus=GPUS, **p.config.model_dump()))
        assert again.memory == p.memory and again.time == p.time


def test_check_says_when_the_longest_sample_is_shorter_than_the_files_length(tmp_path):
    recipe = {"packing": False, "max_length": 4096, "per_device_train_batch_size": 2}
    result = _check(tmp_path, recipe, lengths=_lengths_file(tmp_path, [(100, 5), (900, 1)]))
    assert result.estimate.config.seq_len == 900
    assert "max_length 4096; the longest sample of --lengths is shorter" in result.sources["seq_len"]
