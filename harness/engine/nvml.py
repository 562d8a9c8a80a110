"""GPU telemetry: a sampler thread over NVML (``nvidia-ml-py``, imported as ``pynvml``).

While a system runs on a GPU, ``NvmlSampler`` records every ``interval_s``: memory used,
GPU and memory utilisation, power, SM and memory clocks, temperature, and the board's
energy counter. ``stop()`` returns a ``TelemetrySummary`` (energy over the run, from the
energy counter when the GPU has one, else the integral of the power samples) and
``rows()`` the samples, which the run writes to ``nvml_samples.csv`` for the report.

No GPU, no NVML library, no permission: the sampler is ``available == False`` and
says why in ``note``; nothing raises. A metric the GPU does not support is left empty.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class TelemetrySummary:
    """What the samples add up to; ``available`` False means there are none, and ``note`` why."""

    available: bool
    note: str | None = None
    device_name: str | None = None
    duration_s: float = 0.0
    num_samples: int = 0
    energy_j: float | None = None
    energy_source: str | None = None  # "energy counter" | "power integral"
    mean_power_w: float | None = None
    max_power_w: float | None = None
    mean_gpu_util_pct: float | None = None
    mean_mem_util_pct: float | None = None
    max_memory_used_gib: float | None = None
    mean_sm_clock_mhz: float | None = None
    max_temperature_c: float | None = None

    def as_dict(self, generated_tokens: int | None = None) -> dict[str, Any]:
        """JSON-able summary; with ``generated_tokens``, energy per output token too."""
        out = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}
        if generated_tokens is not None:
            out["generated_tokens"] = generated_tokens
            out["energy_per_output_token_j"] = (
                round(self.energy_j / generated_tokens, 6)
                if self.energy_j is not None and generated_tokens else None)
        return out


def _unavailable(note: str) -> TelemetrySummary:
    return TelemetrySummary(available=False, note=note)


@dataclass
class _Handle:
    nvml: Any
    handle: Any
    name: str


def _open(device: Any) -> tuple[_Handle | None, str | None]:
    """An NVML handle for ``device`` (torch device, CUDA index or None = 0), or (None, why)."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed: no GPU telemetry"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML unavailable ({type(exc).__name__}: {exc}): no GPU telemetry"
    index = 0
    if device is not None and not isinstance(device, int):
        if getattr(device, "type", "cuda") != "cuda":
            return None, f"device {device} is not a CUDA device: no GPU telemetry"
        index = device.index if device.index is not None else 0
    elif isinstance(device, int):
        index = device
    handle = None
    try:  # CUDA ordinals can differ from NVML's (CUDA_VISIBLE_DEVICES): match by PCI bus id
        import torch

        props = torch.cuda.get_device_properties(index)
        bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except Exception:
        handle = None
    if handle is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        ordinals = [v.strip() for v in visible.split(",") if v.strip()]
        if index < len(ordinals) and ordinals[index].isdigit():
            index = int(ordinals[index])
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            return None, f"NVML has no device {index} ({exc}): no GPU telemetry"
    try:
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        name = "unknown GPU"
    return _Handle(pynvml, handle, name), None


def _read(call, *args) -> Any:
    try:
        return call(*args)
    except Exception:  # NotSupported, NoPermission, GPU lost: leave the field empty
        return None


class NvmlSampler:
    """Samples one GPU in a daemon thread between ``start()`` and ``stop()``."""

    def __init__(self, device: Any = None, *, interval_s: float = 0.1) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = float(interval_s)
        self._nv, self.note = _open(device)
        self.available = self._nv is not None
        self._samples: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = 0.0
        self._energy0_mj: int | None = None
        self._summary: TelemetrySummary | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        if self.running or not self.available:
            return
        self._samples = []
        self._summary = None
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._energy0_mj = _read(self._nv.nvml.nvmlDeviceGetTotalEnergyConsumption, self._nv.handle)
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="pagebench-nvml", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        nv, h = self._nv.nvml, self._nv.handle
        row: dict[str, Any] = {"time_s": time.perf_counter() - self._t0}
        mem = _read(nv.nvmlDeviceGetMemoryInfo, h)
        row["memory_used_mib"] = mem.used / 2**20 if mem is not None else None
        util = _read(nv.nvmlDeviceGetUtilizationRates, h)
        row["gpu_util_pct"] = float(util.gpu) if util is not None else None
        row["mem_util_pct"] = float(util.memory) if util is not None else None
        power = _read(nv.nvmlDeviceGetPowerUsage, h)  # milliwatts
        row["power_w"] = power / 1e3 if power is not None else None
        sm = _read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        row["sm_clock_mhz"] = float(sm) if sm is not None else None
        memclk = _read(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        row["mem_clock_mhz"] = float(memclk) if memclk is not None else None
        temp = _read(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        row["temperature_c"] = float(temp) if temp is not None else None
        energy = _read(nv.nvmlDeviceGetTotalEnergyConsumption, h)  # millijoules since driver load
        row["energy_j"] = ((energy - self._energy0_mj) / 1e3
                           if energy is not None and self._energy0_mj is not None else None)
        self._samples.append(row)

    def stop(self) -> TelemetrySummary:
        """Stop sampling (idempotent) and summarise."""
        if not self.available:
            return _unavailable(self.note or "NVML unavailable")
        if self._summary is not None and not self.running:
            return self._summary
        if self.running:
            self._stop.set()
            self._thread.join(timeout=max(1.0, 5 * self.interval_s))
            self._thread = None
            self._sample()  # the final reading closes the energy interval
        self._summary = summarize(self._samples, self._nv.name)
        return self._summary

    def rows(self) -> list[dict[str, Any]]:
        """The samples so far (a copy)."""
        return [dict(r) for r in self._samples]

    def __enter__(self) -> "NvmlSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def summarize(samples: list[dict[str, Any]], device_name: str | None = None) -> TelemetrySummary:
    """Summary of sample rows: energy from the counter if present, else the power integral."""
    if not samples:
        return TelemetrySummary(available=True, device_name=device_name, note="no samples")

    def values(key: str) -> list[float]:
        return [r[key] for r in samples if r.get(key) is not None]

    def mean(key: str) -> float | None:
        v = values(key)
        return sum(v) / len(v) if v else None

    def peak(key: str) -> float | None:
        v = values(key)
        return max(v) if v else None

    duration = samples[-1]["time_s"] - samples[0]["time_s"]
    energy, source = None, None
    counter = values("energy_j")
    if len(counter) >= 2:
        energy, source = counter[-1] - counter[0], "energy counter"
    else:
        powered = [(r["time_s"], r["power_w"]) for r in samples if r.get("power_w") is not None]
        if len(powered) >= 2:
            energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(powered, powered[1:]))
            source = "power integral"
    memory = peak("memory_used_mib")
    note = None if energy is not None else "the GPU reports neither an energy counter nor power"
    return TelemetrySummary(
        available=True, note=note, device_name=device_name, duration_s=duration,
        num_samples=len(samples), energy_j=energy, energy_source=source,
        mean_power_w=mean("power_w"), max_power_w=peak("power_w"),
        mean_gpu_util_pct=mean("gpu_util_pct"), mean_mem_util_pct=mean("mem_util_pct"),
        max_memory_used_gib=memory / 1024 if memory is not None else None,
        mean_sm_clock_mhz=mean("sm_clock_mhz"), max_temperature_c=peak("temperature_c"),
    )


__all__ = ["NvmlSampler", "TelemetrySummary", "summarize"]
