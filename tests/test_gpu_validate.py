"""The GPU validation command (benchmarks/gpu_validate.sh) runs end to end on the CPU, as it will
in a GPU window: every case gets a row (run, skipped or refused, with the reason), the launch
trains as planned (the GPU run's QLoRA twin is skipped on the CPU), at most 8 files come back, and the summary is the last thing
printed. Its parts: the forked probe runner, the phase clock's skip rule, the emulated card's
memory budget."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from planner.probes.forked import run_forked  # noqa: E402

from helpers import FULL_SUITE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from validation.cases import CASES  # noqa: E402

EXPECTED_FILES = {"env.json", "probes.csv", "probes.jsonl", "calibration-cpu.sqlite", "calibrate.json",
                  "launch.json", "validation.png", "log.txt"}
#: CI's cases (``--only``): one per code path the CPU runs (full fine-tuning with checkpointing,
#: LoRA, QLoRA's and the paged optimizer's CUDA-only skips, FSDP2 as one rank of 8, the chunked
#: loss, torch's own allocator, the extrapolated 8B) and the launch; the full suite runs all (ZeRO-3's
#: measured run, about 40 s of a CPU, is CI's in tests/test_measured.py lora-zero3-fake-4-ranks).
CI_ONLY = ("1b-adamw-ckpt-full,1b-lora-attention,1b-qlora,1b-paged-adamw-8bit,1b-fsdp2-rank-of-8,"
           "1b-chunked-loss,full-4x1024-torch-alloc,8b-8bit-pure-full-extrapolated,launch")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    env = os.environ | {"OUT": str(out), "PY": sys.executable, "PLANNER_VALIDATE_WORK": str(out.parent / "work"),
                        "OMP_NUM_THREADS": "1"}
    only = [] if FULL_SUITE else [f"--only={CI_ONLY}"]
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_validate.sh"), "--cpu", *only], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    return out, proc


def _selected() -> list:
    import gpu_validate

    only = gpu_validate.Only("" if FULL_SUITE else CI_ONLY)
    return [c for c in CASES if only.case(c.key)]


@pytest.mark.heavy
def test_the_cpu_mode_runs_its_cases_and_the_launch(cpu_run):
    """Every case in the full suite, CI_ONLY in CI: each row ok or skipped for the reason the CPU
    gives, the launch run and checked live, the phases on time, the summary printed last."""
    out, proc = cpu_run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == EXPECTED_FILES  # at most 8 files come back from a GPU window
    rows = list(csv.DictReader((out / "probes.csv").open()))
    cases = _selected()
    assert [r["key"] for r in rows] == [c.key for c in cases]
    for row, case in zip(rows, cases):
        if not case.cpu:
            assert row["status"] == "skipped" and row["message"] == "needs CUDA"
        elif any(n in case.needs for n in ("liger", "bnb_paged", "torchao_fp8")):  # CUDA-only libraries
            assert row["status"] == "skipped" and "smoke test failed" in row["message"], row
        else:
            assert row["status"] == "ok", row
            assert float(row["measured_step_s"]) > 0 and row["time_status"] == "cpu: not the plan's GPU"
            # the launch's allocator setting, or the one a case asks for (torch's default: "")
            assert row["allocator_conf"] == ("expandable_segments:True" if case.allocator_conf is None
                                             else case.allocator_conf)
    records = [json.loads(line) for line in (out / "probes.jsonl").read_text().splitlines()]
    assert len(records) == len(cases)
    # what ran is what the case asks (test_measured.py's engine cases leave these to CI here): the
    # peft-wrapped model, QLoRA's linears quantized by bitsandbytes, FSDP2 over a fake group of 8
    for record in records:
        config, notes = record["case"]["config"], (record.get("comparison") or {}).get("notes", [])
        if record["status"] != "ok":
            continue
        if "adapter" in config:
            assert any(n.startswith(f"{config['adapter']}: peft r16") for n in notes), notes
        if config.get("adapter") == "qlora":
            assert any("quantized to NF4" in n for n in notes), notes
        if config.get("sharding") == "fsdp" and record["gpus"].startswith("8x"):
            assert any("fake process group of 8 ranks" in n for n in notes), notes
    launches = json.loads((out / "launch.json").read_text())
    assert [x["name"] for x in launches] == ["suggested", "suggested-qlora", "suggested-dpo", "suggested-kto",
                                             "suggested-grpo"]
    launch, *others = launches
    assert launch["rc"] == 0 and launch["differences"] == [], launch.get("log_tail", launch)
    assert "the live run is the plan" in launch["live_verdict"]
    assert all(x["rc"] is None and x["error"] == "skipped: --cpu runs one launch" for x in others)
    env = json.loads((out / "env.json").read_text())
    assert set(env["phases"]) == set("ABCDE") and all(p["ended_before_deadline"] for p in env["phases"].values())
    assert env["smoke"]["deepspeed"]["ok"] and env["smoke"]["peft"]["ok"] and env["smoke"]["bnb_8bit"]["ok"]
    # the host rates: torch's CPU AdamW measured (the GPU ones need CUDA), stored for calibrate
    assert env["host_rates"]["torch_cpu_adamw"]["params_per_s"] > 0
    from planner.catalog.calibration import CalibrationStore

    stored = CalibrationStore(out / "calibration-cpu.sqlite").host_rates("cpu")
    assert stored is not None and stored.cpu_optimizer_params_per_s["torch"] > 0
    assert stored.page_migration_bytes_per_s is None  # not measured: never guessed
    # the summary is what is printed last: the table, the errors, the surprises, the launches
    tail = proc.stdout.strip().splitlines()[-8:]
    assert tail[-1].startswith("gpu_validate: exit 0")
    assert any(line.startswith("predicted to fit but OOM: 0") for line in tail)
    assert any(line.startswith("launch suggested: rc 0") for line in tail)


def test_a_case_that_cannot_finish_in_its_phase_is_skipped_with_the_reason(tmp_path):
    import gpu_validate
    from validation.report import Records

    from planner.probes.device import DeviceInfo

    now = time.monotonic()
    clock = gpu_validate.Clock(start=now - 100, deadline=now + 10)  # phase B ended long ago
    records = Records(tmp_path)
    runner = gpu_validate.CaseRunner("cpu", "cpu", DeviceInfo(available=True, name="cpu"), {}, tmp_path / "s.sqlite",
                                     clock, records)
    runner.run(CASES[0], "B")
    assert records.rows[0]["status"] == "skipped" and "phase B has 0 s" in records.rows[0]["message"]
    # the pace of earlier cases scales what a case is expected to take (within 0.5x-3x)
    clock.ratios = [2.0, 2.0, 10.0]
    assert clock.expect(10.0) == 20.0
    clock.ratios = [100.0]
    assert clock.expect(10.0) == 30.0


#: The grandchild's sleep, a duration no other process on the machine is likely to sleep for
#: (``pgrep`` sees every process: a plain ``sleep 300`` elsewhere would read as a survivor).
GRANDCHILD_SLEEP = "300.0713"


def _sleep_forever(_: str) -> None:
    subprocess.Popen(["sleep", GRANDCHILD_SLEEP])  # a grandchild in the child's process group
    time.sleep(300)


def test_forked_children_answer_fail_and_time_out():
    ok = run_forked(lambda payload: {"echo": payload, "pid": os.getpid()}, "x", 30)
    assert ok.status == "ok" and ok.value["echo"] == "x" and ok.value["pid"] != os.getpid()
    failed = run_forked(lambda _: 1 / 0, "", 30)
    assert failed.status == "crashed" and "ZeroDivisionError" in failed.stderr_tail
    died = run_forked(lambda _: os.kill(os.getpid(), signal.SIGKILL), "", 30)
    assert died.status == "crashed" and died.returncode == -signal.SIGKILL
    start = time.perf_counter()
    slow = run_forked(_sleep_forever, "", 2)
    assert slow.status == "timeout" and time.perf_counter() - start < 15
    # the group was signalled; the kernel delivers the signal and init reaps the orphaned grandchild
    # on its own time (a loaded machine takes a moment): it must be gone within seconds
    gone_by = time.perf_counter() + 5
    while (leftover := subprocess.run(["pgrep", "-f", f"sleep {GRANDCHILD_SLEEP}"], capture_output=True,
                                      text=True).stdout.split()) \
            and time.perf_counter() < gone_by:
        time.sleep(0.05)
    assert not leftover, "the timed-out child's process group was not killed"


def test_forking_is_refused_once_cuda_started(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="started CUDA"):
        run_forked(lambda _: None, "", 5)


def test_a_launch_that_could_not_start_fails_the_run_and_one_skipped_for_time_does_not():
    import gpu_validate

    assert gpu_validate._launch_failed({"rc": 1})
    assert gpu_validate._launch_failed({"rc": None, "error": "planner suggest exited 2: error: ..."})
    assert gpu_validate._launch_failed({"rc": "timeout"})
    assert not gpu_validate._launch_failed({"rc": 0})
    assert not gpu_validate._launch_failed({"rc": None, "error": "skipped: 12 s left in phase C"})


def test_a_launch_its_phase_cannot_hold_is_skipped_not_started(tmp_path):
    import gpu_validate
    from validation import launches

    class Launches:  # the folder is built; no plan may be written for a launch that cannot finish
        LAUNCHES = launches.LAUNCHES

        def build_folder(self, work, device):
            return work, "ref", 0.0

        def write_plan(self, *args):
            raise AssertionError("a launch was started with too little time left")

    now = time.monotonic()
    # 100 s budget, phase C ends at 74.5 s: 40 s left, less than either launch needs on a GPU
    clock = gpu_validate.Clock(start=now - 34.5, deadline=now + 65.5)
    results: list = []
    gpu_validate._launch_both(Launches(), "cuda", "H100-SXM-80", clock, tmp_path, results,
                              tmp_path / "launch.json", gpu_validate.Only(""))
    # (the launches an earlier H100 window ran, benchmarks/results/H100-SXM-80, go last)
    assert [r["name"] for r in results] == ["suggested-dpo", "suggested-kto", "suggested-grpo", "suggested",
                                            "suggested-qlora"]
    assert all(r["error"].startswith("skipped: needs ~") for r in results)
    assert not any(gpu_validate._launch_failed(r) for r in results)


def test_a_launch_killed_for_time_leaves_no_worker_holding_the_gpu():
    """accelerate's workers are the launch script's grandchildren: the whole process group goes."""
    from validation.launches import _kill_group

    proc = subprocess.Popen(["bash", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    worker = int(proc.stdout.readline())
    started = time.monotonic()
    _kill_group(proc)
    assert time.monotonic() - started < 10
    proc.wait(timeout=5)
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)
