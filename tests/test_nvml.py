"""NVML telemetry: a fake pynvml drives the sampler; without NVML there is a note, no crash."""

from __future__ import annotations

import sys
import time
import types

import pytest

from harness.engine.nvml import NvmlSampler, summarize


class _NotSupported(Exception):
    pass


def _fake_pynvml(*, energy: bool = True, power_w: float = 300.0) -> types.ModuleType:
    """A pynvml stand-in: 1 W-second of energy per 1/power_w seconds, as a real counter would."""
    nv = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    start = time.perf_counter()
    nv.calls = []
    nv.nvmlInit = lambda: nv.calls.append("init")
    nv.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    nv.nvmlDeviceGetHandleByPciBusId = lambda bus: (_ for _ in ()).throw(_NotSupported())
    nv.nvmlDeviceGetName = lambda h: b"Fake H200"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=40 * 2**30, total=141 * 2**30)
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87, memory=55)
    nv.nvmlDeviceGetPowerUsage = lambda h: int(power_w * 1000)
    nv.nvmlDeviceGetClockInfo = lambda h, kind: 1980 if kind == 1 else 2619
    nv.nvmlDeviceGetTemperature = lambda h, kind: 61

    def energy_mj(h):
        if not energy:
            raise _NotSupported("no energy counter")
        return int(1e9 + power_w * 1000 * (time.perf_counter() - start))

    nv.nvmlDeviceGetTotalEnergyConsumption = energy_mj
    return nv


@pytest.mark.parametrize("energy", [True, False], ids=["energy_counter", "power_integral"])
def test_sampler_records_every_metric_and_energy(monkeypatch, energy):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(energy=energy))
    sampler = NvmlSampler(0, interval_s=0.01)
    assert sampler.available and sampler.note is None
    sampler.start()
    time.sleep(0.2)
    summary = sampler.stop()
    rows = sampler.rows()
    assert summary.available and summary.num_samples == len(rows) >= 5
    assert summary.device_name == "Fake H200"
    assert summary.energy_source == ("energy counter" if energy else "power integral")
    # 300 W over the sampled interval
    assert summary.energy_j == pytest.approx(300.0 * summary.duration_s, rel=0.05 if energy else 1e-6)
    assert summary.mean_gpu_util_pct == 87 and summary.max_memory_used_gib == pytest.approx(40)
    assert summary.mean_sm_clock_mhz == 1980 and summary.max_temperature_c == 61
    assert set(rows[0]) >= {"time_s", "power_w", "gpu_util_pct", "mem_util_pct", "memory_used_mib",
                            "sm_clock_mhz", "mem_clock_mhz", "temperature_c", "energy_j"}
    per_token = summary.as_dict(generated_tokens=100)["energy_per_output_token_j"]
    assert per_token == pytest.approx(summary.energy_j / 100, rel=1e-3)
    assert sampler.stop() is summary  # idempotent


def test_missing_nvml_library_is_a_note_not_a_crash(monkeypatch):
    nv = _fake_pynvml()
    nv.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found"))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = NvmlSampler(0)
    assert not sampler.available and "NVML unavailable" in sampler.note
    sampler.start()
    summary = sampler.stop()
    assert not summary.available and summary.note == sampler.note
    assert summary.as_dict(10)["energy_per_output_token_j"] is None
    assert sampler.rows() == []


def test_missing_pynvml_module_is_a_note(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    with NvmlSampler(0) as sampler:
        pass
    assert not sampler.available and "nvidia-ml-py" in sampler.note


def test_cpu_device_gets_a_note(monkeypatch):
    import torch

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    sampler = NvmlSampler(torch.device("cpu"))
    assert not sampler.available and "not a CUDA device" in sampler.note


def test_summary_of_unsupported_metrics_is_empty_not_wrong():
    rows = [{"time_s": 0.0, "power_w": None, "energy_j": None},
            {"time_s": 1.0, "power_w": None, "energy_j": None}]
    summary = summarize(rows, "x")
    assert summary.energy_j is None and "neither" in summary.note
