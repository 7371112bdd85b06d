"""Nothing crashes: every command's flags and every file reader, given hostile input, end in exit
0, 1 or 2 with a message, in bounded time: no traceback, no segfault, no hang (issue 19).

The classes issue 19 found are explicit cases (numbers past Python's 4,300-digit limit, nesting
that overflows json's recursion or crashes libyaml's C loader, FIFOs and directories given as
files, a non-SQLite calibration store, infinite timeouts, a plan file with no plans); the
generated cases (hypothesis) add up, with tests/test_check.py's two, to about 1,000 inputs in
the CI profile and 15,500 under PLANNER_HYPOTHESIS=thorough (benchmarks/full_suite.sh).

planner's own mutation fuzzer (tests/fuzzgen.py, issue 40) mutates real files of every kind
planner reads and runs the command that reads each: 1,500 cases in CI, 20,000 and 1,000 launches
of mutated plan folders in benchmarks/fuzz.py. The classes it found are explicit cases below: emit's plan reader (deep
nesting, a FIFO or device, a plan without its peak or with a GPU of 0 bytes), a key that is an
escape sequence or 100,000 characters long, a calibration row planner cannot use, a model_type
that is not a name.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner.check.frameworks import AXOLOTL, LLAMAFACTORY, MARKERS
from planner.check.job_files import known_keys
from planner.check.recipe_keys import recipe_keys
from planner.cli import app

from helpers import FULL_SUITE, examples

ROOT = Path(__file__).resolve().parent.parent
LLAMA = "meta-llama/Llama-3.1-8B"
runner = CliRunner()
BIG = "1" + "0" * 5000


def _ok(r, what) -> None:
    """A clear ending: exit 0/1/2, no exception but SystemExit, a message."""
    assert r.exception is None or isinstance(r.exception, SystemExit), (what, repr(r.exception))
    assert "Traceback" not in r.output, (what, r.output[-2000:])
    assert r.exit_code in (0, 1, 2), (what, r.exit_code, r.output[-2000:])
    assert r.output.strip(), what


def _files(tmp: Path) -> dict[str, Path]:
    cases = {
        "bigint.json": '{"per_device_train_batch_size": %s}' % BIG,
        "bigint.yaml": f"per_device_train_batch_size: {BIG}\n",
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deepmap.json": '{"a":' * 50_000 + "1" + "}" * 50_000,
        "deep.yaml": "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "dashes.yaml": "- " * 100_000 + "x\n",
        "apostrophe.yaml": "a: it's\nb: " + "[" * 100_000 + "]" * 100_000 + "\n",  # a quote must not hide them
        "keys.yaml": "? " * 100_000 + "x\n",
        "nan.json": '{"per_device_train_batch_size": NaN, "learning_rate": Infinity}',
        "float.yaml": "per_device_train_batch_size: 1e400\n",
        "empty_plans.json": '{"plans": []}',
    }
    out = {}
    for name, text in cases.items():
        (tmp / name).write_text(text)
        out[name] = tmp / name
    return out


FILE_CASES = [(name, option) for name in ("bigint.json", "bigint.yaml", "deep.json", "deepmap.json")
              for option in ("--training-args", "--deepspeed-config", "--accelerate-config")]
FILE_CASES += [("nan.json", "--training-args"), ("float.yaml", "--training-args")]  # not integers


@pytest.mark.parametrize("name, option", FILE_CASES)
def test_hostile_job_files_exit_2(tmp_path, name, option):
    path = _files(tmp_path)[name]
    r = runner.invoke(app, ["check", "--model", LLAMA, "--gpus", "8xH100-80", option, str(path)])
    _ok(r, name)
    assert r.exit_code == 2 and r.output.startswith("error:"), r.output


def test_what_would_crash_or_hang_a_parser_is_refused_before_it(tmp_path):
    """libyaml's C loader segfaults on ~100,000 nested levels and reading a FIFO blocks forever:
    run in a child process with a time limit, so a crash or a hang fails the test, not the run."""
    files = _files(tmp_path)
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    script = (
        "import sys; from typer.testing import CliRunner; from planner.cli import app\n"
        "for path in sys.argv[1:]:\n"
        "    r = CliRunner().invoke(app, ['check', '--model', 'gpt2', '--gpus', '1xA100-40', '--training-args', path])\n"
        "    print(path.rsplit('/', 1)[-1], r.exit_code, ' '.join(r.output.split()), flush=True)\n")
    paths = [str(files[n]) for n in ("deep.yaml", "dashes.yaml", "keys.yaml", "apostrophe.yaml")] + [
        str(fifo), str(tmp_path), "/dev/zero"]
    done = subprocess.run([sys.executable, "-P", "-c", script, *paths], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(paths), done.stdout
    for line in lines:
        name, code, first = line.split(" ", 2)
        assert code == "2" and first.startswith("error:"), line
    assert all("nested deeper" in line for line in lines[:4])
    assert "not a regular file" in lines[4] and "directory" in lines[5]


@pytest.mark.parametrize("args, needle", [
    (["estimate", "--model", LLAMA, "--gpus", "8xH100-80", "--calibration", "{garbage}"], "not a database"),
    (["probe", "--model", "gpt2", "--gpus", "1xA100-40", "--timeout", "inf"], "--timeout"),
    (["tune", "--model", "gpt2", "--gpus", "1xA100-40", "--timeout", "inf"], "--timeout"),
    (["emit", "--plan", "{empty}", "--out", "{out}"], "error"),
    (["check", "--model", LLAMA, "--gpus", "8xH100-80", "--training-args", "{long}"], "error"),
    (["estimate", "--model", "{long}", "--gpus", "1xA100-40"], "too long"),
    (["check", "--model", "gpt2", "--gpus", "1xA100-40", "--job-dir", "{long}"], "too long"),
    (["estimate", "--model", "gpt2", "--gpus", "1xA100-40", "--calibration", "{long}"], "too long"),
    (["estimate", "--model", "gpt2", "--gpus", "{long}"], "error"),
])
def test_hostile_flags_exit_2(tmp_path, args, needle):
    files = _files(tmp_path)
    (tmp_path / "garbage").write_text("this is not a SQLite file")
    values = {"garbage": str(tmp_path / "garbage"), "out": str(tmp_path / "out"), "long": "a" * 5000 + ".json",
              "empty": str(files["empty_plans.json"])}
    r = runner.invoke(app, [a.format(**values) if a.startswith("{") else a for a in args])
    _ok(r, args)
    assert r.exit_code == 2 and needle in r.output, r.output


# Generated flags: every planning flag of estimate and check, given values from a hostile pool.
NASTY = st.sampled_from(["0", "-1", "1e400", "inf", "-inf", "nan", "", " ", "x" * 300, "9" * 40, "1.5", "none",
                         "true", "../../etc/passwd", "\x7f", "a" * 5000, "1xA100-40", "8xH100-80", "bf16-mixed", "zero3", "lora"])
FLAGS = ["--gpus", "--seq-len", "--micro-batch-size", "--grad-accum", "--margin", "--host-memory-gb",
         "--optimizer", "--precision", "--checkpointing", "--sharding", "--offload", "--loss", "--attention",
         "--adapter", "--lora-rank", "--lora-alpha", "--lora-dropout", "--lora-targets", "--inter-node-gbps"]


@settings(max_examples=examples(4000, ci=350), deadline=None, suppress_health_check=list(HealthCheck))
@given(flags=st.lists(st.tuples(st.sampled_from(FLAGS), NASTY), max_size=4),
       model=st.sampled_from([LLAMA, "gpt2", "", "x" * 200, "../nope", "Qwen/Qwen2.5-0.5B"]))
def test_generated_flags_end_cleanly(flags, model):
    """``planner estimate`` (the flags every planning command shares) through the CLI."""
    args = ["estimate", "--model", model]
    if not any(f == "--gpus" for f, _ in flags):
        args += ["--gpus", "1xA100-40"]
    for flag, value in flags:
        args += [flag, value]
    _ok(runner.invoke(app, args), args)


# Generated files: the real keys of each reader, hostile values, nested sections.
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                   st.sampled_from(["auto", "none", "cpu", "nvme", "bf16", "fp16", "no", "FSDP", "DEEPSPEED", "NO",
                                    "MULTI_GPU", "1", "2", "3", "true", "all-linear", "", "x" * 50]),
                   st.text(max_size=8))
READERS = {
    "--accelerate-config": ("a.yaml", sorted(known_keys()["accelerate"])),
    "--deepspeed-config": ("ds.json", sorted(known_keys()["deepspeed_zero"]) + ["zero_optimization", "bf16", "fp16",
                                                                                "bfloat16", "train_batch_size",
                                                                                "train_micro_batch_size_per_gpu"]),
    "--training-args": ("t.yaml", sorted(known_keys()["training_args"]) + ["use_peft", "lora_r", "load_in_4bit",
                                                                             "load_in_8bit", "lora_modules_to_save",
                                                                             "lora_target_modules", "max_seq_length"]),
    "--runtime-args": ("runtime.json", ["dtype", "seq_len", "lora", "quantization", "attn_implementation", "r",
                                        "load_in_4bit", "load_in_8bit", "target_modules", "use_dora", "optimizer",
                                        "checkpointing"]),
    # the framework files, through --training-args, each with one of the keys that tell the
    # framework apart (planner/check/frameworks.py MARKERS)
    "--training-args llamafactory": ("lf.yaml", sorted(recipe_keys()[LLAMAFACTORY][1])),
    "--training-args axolotl": ("ax.yaml", sorted(recipe_keys()[AXOLOTL][1])),
}


def _tree(keys):
    key = st.sampled_from(keys) | st.text(max_size=6)
    return st.recursive(VALUES, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(key, kids, max_size=4),
                        max_leaves=10).map(lambda t: t if isinstance(t, dict) else {keys[0]: t})


@pytest.mark.heavy
@settings(max_examples=examples(8000, ci=250), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), option=st.sampled_from(sorted(READERS)))
def test_generated_job_files_end_cleanly(tmp_path_factory, data, option):
    """Every reader through ``planner.check`` (the CLI turns PlannerInputError into exit 2 and a
    result into 0 / 1; the alternatives' search is left out: it reads nothing)."""
    from planner.check import CheckRequest, check
    from planner.core.errors import PlannerInputError

    name, keys = READERS[option]
    tree = data.draw(st.dictionaries(st.sampled_from(keys), VALUES | _tree(keys), max_size=6))
    if " " in option:  # a framework file: one of its marker keys, so it is read as that framework's
        framework = option.split()[1]
        tree[data.draw(st.sampled_from(MARKERS[framework]))] = data.draw(VALUES | _tree(keys))
    path = tmp_path_factory.getbasetemp() / name
    path.write_text(json.dumps(tree, allow_nan=True) if name.endswith(".json") else yaml.safe_dump(tree))
    field = option.split()[0].removeprefix("--").replace("-", "_")
    try:
        result = check(CheckRequest(model="gpt2", gpus="8xH100-80", alternatives=0, **{field: path}))
    except PlannerInputError as e:
        assert e.problems and all(isinstance(p, str) and p for p in e.problems), tree
    else:
        assert result.estimate.memory["peak"] > 0 and result.estimate.time.tokens_per_second > 0, tree


@pytest.mark.parametrize("text", ["stage: sft\nflash_attn: {a: 1}\n", "base_model: x\nfsdp_config: true\n",
                                  "base_model: x\nattn_implementation: {a: 1}\n"])
def test_framework_files_with_values_of_the_wrong_type_end_cleanly(tmp_path, text):
    """Crashes the generated framework files found (TypeError: a mapping where LLaMA-Factory's
    flash_attn or an attn_implementation name belongs, a boolean fsdp_config): each is now exit 2
    with the key named."""
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    out = CliRunner().invoke(app, ["check", "--model", "gpt2", "--gpus", "1xA100-80", "--training-args", str(path)])
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert any(k in out.output for k in ("flash_attn", "fsdp_config", "attn_implementation")), out.output


# -- the mutation fuzzer (tests/fuzzgen.py) and the classes it found, one regression case each ----

@pytest.mark.heavy
def test_mutated_files_end_cleanly():
    """The first 1,000 cases of seed 0 (the full suite: 3,000) of planner's own mutation fuzzer
    (every file kind planner reads, through the command that reads it; benchmarks/fuzz.py runs the
    thorough profile, the planner launch on mutated plan folders included: its classes are the
    cases below) in a child process: its address space bounded, so a case that would exhaust memory
    is a failure it reports, and planner imported where it is installed."""
    count = "3000" if FULL_SUITE else "1000"
    done = subprocess.run([sys.executable, "-P", str(ROOT / "benchmarks" / "fuzz.py"), "--count", count],
                          capture_output=True, text=True, timeout=900, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 failures in 0 classes" in done.stdout, done.stdout[-2000:]


def _emitted_plan(tmp_path: Path) -> dict:
    tiny = str(ROOT / "tests" / "data" / "tiny-llama")
    r = runner.invoke(app, ["suggest", "--model", tiny, "--gpus", "1xA100-80", "--seq-len", "64",
                            "--out", str(tmp_path / "seed")])
    assert r.exit_code == 0, r.output
    return json.loads((tmp_path / "seed" / "plan.json").read_text())


@pytest.mark.parametrize("change, needle", [
    (lambda p: "[" * 5000 + "]" * 5000, "nested deeper"),  # json recursed past Python's limit
    (lambda p: p["plans"][0]["memory"].pop("peak") and p, 'holds no "peak"'),  # a KeyError in emit
    (lambda p: p["plans"][0]["hardware"].update(gpu_memory_bytes=0) or p, "gpu_memory_bytes"),  # a division by 0
])
def test_a_mutated_plan_file_is_bad_input(tmp_path, change, needle):
    """Classes the fuzzer found in emit's plan reader: each is exit 2 with the reason."""
    data = change(_emitted_plan(tmp_path))
    path = tmp_path / "plan.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    r = runner.invoke(app, ["emit", "--plan", str(path), "--out", str(tmp_path / "out")])
    _ok(r, needle)
    assert r.exit_code == 2 and needle in r.output, r.output


def test_user_text_never_acts_on_the_terminal(tmp_path):
    """A key holding an escape sequence (it would clear the screen) is named in the warning as its
    escape, in a message as in a screen."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "\x1b[2J": 1, "bf16": {"enabled": True}}))
    r = runner.invoke(app, ["check", "--model", LLAMA, "--gpus", "8xH100-80", "--deepspeed-config", str(path)])
    _ok(r, "escape")
    assert "\x1b" not in r.output and "\\x1b[2J" in r.output, r.output
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps({"\x1b]0;title\x07": 1}))
    r = runner.invoke(app, ["check", "--model", LLAMA, "--gpus", "8xH100-80", "--runtime-args", str(path)])
    assert r.exit_code == 2 and "\x1b" not in r.output and "\x07" not in r.output and "\\x1b]0;title" in r.output


@pytest.mark.parametrize("option, name", [("--deepspeed-config", "ds.json"), ("--runtime-args", "runtime.json")])
def test_a_huge_key_is_named_in_bounded_length(tmp_path, option, name):
    """A key of 100,000 characters: the warning (DeepSpeed ignores it) or the error (runtime.json
    refuses it) quotes it cut, with its length."""
    path = tmp_path / name
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "k" * 100_000: 1}))
    r = runner.invoke(app, ["check", "--model", LLAMA, "--gpus", "8xH100-80", option, str(path)])
    _ok(r, option)
    assert len(r.output) < 12_000 and "characters in all" in r.output, r.output[:3000]


@pytest.mark.parametrize("key, value, needle", [
    ("flops_scale", {"bf16": 0.0}, "flops_scale"),  # divided by zero in strategies/rates.py
    ("context_bytes", 10**400, "context_bytes"),
    ("gpu", {"a": 1}, "gpu"),
])
def test_a_calibration_row_planner_cannot_use_is_bad_input(tmp_path, key, value, needle):
    import fuzzgen

    body = json.dumps(fuzzgen.CORRECTIONS | {key: value}).encode()
    store = tmp_path / "store.sqlite"
    store.write_bytes(fuzzgen.store_bytes(body))
    r = runner.invoke(app, ["estimate", "--model", "gpt2", "--gpus", "1xA100-80", "--calibration", str(store)])
    _ok(r, key)
    assert r.exit_code == 2 and "is not planner's" in r.output and needle in r.output, r.output


def test_a_model_type_of_the_wrong_type_is_bad_input(tmp_path):
    (tmp_path / "m").mkdir()
    config = json.loads((ROOT / "tests/data/tiny-llama/config.json").read_text()) | {"model_type": {"a": 1}}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    r = runner.invoke(app, ["estimate", "--model", str(tmp_path / "m"), "--gpus", "1xA100-80"])
    _ok(r, "model_type")
    assert r.exit_code == 2 and "model_type" in r.output, r.output


def test_emit_refuses_a_fifo_or_a_device_without_reading_it(tmp_path):
    """emit read its plan file whatever it was: a FIFO blocked forever, /dev/zero filled memory.
    In a child with a time limit, so a hang fails the test, not the run."""
    fifo = tmp_path / "plan.json"
    os.mkfifo(fifo)
    script = ("import sys; from typer.testing import CliRunner; from planner.cli import app\n"
              "for path in sys.argv[1:]:\n"
              "    r = CliRunner().invoke(app, ['emit', '--plan', path, '--out', path + '.out'])\n"
              "    print(r.exit_code, ' '.join(r.output.split()), flush=True)\n")
    done = subprocess.run([sys.executable, "-P", "-c", script, str(fifo), "/dev/zero", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("2 error:") for line in lines), done.stdout
    assert "not a regular file" in lines[0] and "not a regular file" in lines[1] and "directory" in lines[2]


@pytest.fixture(scope="module")
def launch_folder(tmp_path_factory):
    """planner's files of a one-GPU plan of the tiny Llama, and the tiny model folder."""
    import fuzzgen

    sys.path.insert(0, str(ROOT / "tests" / "tools"))
    from tiny_model import make_tiny_model

    work = tmp_path_factory.mktemp("launch-fuzz")
    return dict(fuzzgen.launch_seeds(work)), make_tiny_model(work / "tiny-model")


@pytest.mark.parametrize("change, needle", [
    ({"report_to": {"a": 1}}, "refuses the plan's arguments"),  # TypeError in the Trainer's __init__
    ({"report_to": None}, "refuses the plan's arguments"),  # ValueError there
    ({"logging_steps": "x"}, "logging_steps: 'x' is not a"),  # TypeError deep in trainer.train()
    ({"per_device_train_batch_size": None}, "per_device_train_batch_size: null"),  # TypeError in the dataset
    ({"max_grad_norm": 10**400}, "max_grad_norm"),  # OverflowError in the step
])
def test_the_launch_refuses_mutated_training_arguments_as_bad_input(tmp_path, capsys, launch_folder, change,
                                                                   needle):
    """Classes the launch fuzz (benchmarks/fuzz.py --launch) found: each is exit 2 with the field
    named, before the model trains."""
    from planner.launch.train import main

    files, model = launch_folder
    job = tmp_path / "job"
    job.mkdir()
    for name, data in files.items():
        (job / name).write_bytes(data)
    args = json.loads(files["training_args.json"]) | change
    (job / "training_args.json").write_text(json.dumps(args))
    with pytest.raises(SystemExit) as done:
        main(["--job-dir", str(job), "--model", str(model), "--data", "sample", "--max-steps", "1", "--no-save",
              "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and needle in err and "Traceback" not in err, err[-2000:]


def test_the_launch_shows_a_path_with_an_escape_sequence_as_text(tmp_path, capsys):
    from planner.launch.train import main

    with pytest.raises(SystemExit) as done:
        main(["--job-dir", str(tmp_path / "no\x1b[2Jsuch"), "--model", "x", "--data", "sample"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "\x1b" not in err and "no\\x1b[2Jsuch" in err, err
