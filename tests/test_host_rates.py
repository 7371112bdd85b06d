"""The host-side rates planner otherwise assumes, measured (planner/probes/host_rates.py): what the
CPU can measure here, what needs CUDA said so, and the calibration store's record of them."""

import pytest

torch = pytest.importorskip("torch")

from planner.catalog.calibration import CalibrationStore, HostRates  # noqa: E402
from planner.probes import host_rates  # noqa: E402


def test_torch_cpu_adamw_is_timed_and_updates_the_parameters():
    out = host_rates.measure(("torch_cpu_adamw",), cuda=False, params=1 << 16)["torch_cpu_adamw"]
    assert out["params"] == 1 << 16 and out["threads"] == torch.get_num_threads()
    for kind in ("fused", "foreach"):  # both kernels of torch 2.13 run on the host
        assert out[kind]["params_per_s"] == pytest.approx((1 << 16) / out[kind]["step_seconds"])
    assert out["params_per_s"] == out["fused"]["params_per_s"]  # the Trainer's adamw_torch_fused


def test_what_needs_cuda_says_so_and_a_failure_is_reported_not_raised(monkeypatch):
    out = host_rates.measure(("paged_migration", "pinned_link"), cuda=False)
    assert out["paged_migration"]["error"] == out["pinned_link"]["error"] == "skipped: needs CUDA"

    def broken(n=None):
        raise RuntimeError("no compiler")

    monkeypatch.setitem(host_rates.MEASUREMENTS, "deepspeed_cpu_adam", (broken, False))
    failed = host_rates.measure(("deepspeed_cpu_adam",), cuda=False)["deepspeed_cpu_adam"]
    assert failed["error"] == "RuntimeError: no compiler" and "seconds" in failed


def test_the_store_keeps_what_was_measured_and_nothing_else(tmp_path):
    figures = {"deepspeed_cpu_adam": {"params_per_s": 4.2e9}, "torch_cpu_adamw": {"error": "x"},
               "paged_migration": {"bytes_per_s": 2.1e10},
               "pinned_link": {"to_gpu_bytes_per_s": 5.4e10, "to_host_bytes_per_s": 5.5e10}}
    rates = HostRates.from_measured("H100-SXM-80", "NVIDIA H100 80GB HBM3", 16, figures, "2026-11-26T00:00:00")
    assert rates.cpu_optimizer_params_per_s == {"deepspeed": 4.2e9}
    assert rates.page_migration_bytes_per_s == 2.1e10 and rates.pinned_link_bytes_per_s == 5.4e10
    store = CalibrationStore(tmp_path / "c.sqlite")
    assert store.host_rates("H100-SXM-80") is None
    store.save_host_rates(rates)
    assert store.host_rates("H100-SXM-80") == rates
    none = HostRates.from_measured("cpu", "cpu", 2, {"paged_migration": {"error": "skipped: needs CUDA"}}, "")
    assert none.cpu_optimizer_params_per_s == {} and none.page_migration_bytes_per_s is None
