"""Arrival processes: Poisson, Gamma (bursty), offline, and trace timestamps."""

from __future__ import annotations

import numpy as np

from harness.errors import ConfigError
from harness.workloads.spec import ArrivalSpec

# The finest time the simulated clock must tell apart: 1/200 of the sim's default step
# overhead (conf/engine/sim.yaml: step_overhead_s 0.002).
CLOCK_RESOLUTION_S = 1e-5
# The latest arrival at which a float64 clock still resolves CLOCK_RESOLUTION_S
# (2**53 of them: about 2,850 years); later, a step no longer advances the clock.
MAX_ARRIVAL_S = 2.0**53 * CLOCK_RESOLUTION_S


def generate_arrivals(spec: ArrivalSpec, n: int, rng: np.random.Generator,
                      where: str = "workload.arrival") -> np.ndarray:
    """``n`` sorted arrival times in seconds (float64) from a generative process; the first is 0.

    Gamma gaps have shape k = 1/cv^2 and scale 1/(rate*k): mean 1/rate, CV = cv
    (cv = 1 is Poisson; larger is burstier).
    """
    if spec.process == "offline":
        return np.zeros(n)
    if spec.process == "trace":
        raise ConfigError(
            f"{where}.process: 'trace' replays trace timestamps, and this workload has none; "
            "use poisson, gamma or offline (e.g. workload.arrival.process=poisson workload.arrival.rate=2)")
    assert spec.rate is not None  # ArrivalSpec checked it
    if spec.rate > 1 / CLOCK_RESOLUTION_S:
        raise ConfigError(
            f"{where}.rate: {spec.rate:g} requests/s puts arrivals closer than the clock's "
            f"{CLOCK_RESOLUTION_S:g} s resolution; for requests that all arrive at once use "
            f"{where}.process=offline")
    if spec.process == "poisson":
        gaps = rng.exponential(1.0 / spec.rate, size=max(n - 1, 0))
    else:
        assert spec.cv is not None
        shape = 1.0 / spec.cv**2
        gaps = rng.gamma(shape, 1.0 / (spec.rate * shape), size=max(n - 1, 0))
    with np.errstate(over="ignore"):  # a rate of 1e-300: inf, refused below
        times = np.concatenate([[0.0], np.cumsum(gaps)])[:n]
    if n and not times[-1] <= MAX_ARRIVAL_S:
        raise ConfigError(
            f"{where}.rate: {spec.rate:g} requests/s spreads {n:,} requests over {times[-1]:g} s, "
            f"beyond what the clock resolves (at most {MAX_ARRIVAL_S:.3g} s, to "
            f"{CLOCK_RESOLUTION_S:g} s); use a larger rate")
    return times


def replay_arrivals(spec: ArrivalSpec, timestamps_s: np.ndarray, origin_s: float | None = None,
                    where: str = "workload.arrival") -> np.ndarray:
    """Trace timestamps (seconds, non-decreasing) as arrival times starting at 0.

    ``origin_s`` is the time that becomes 0 (default: the first timestamp). Then
    times are multiplied by ``time_scale``, or rescaled so that the mean rate,
    (n - 1) / span, equals ``target_rate``.
    """
    times = np.asarray(timestamps_s, dtype=np.float64)
    if times.size == 0:
        return times
    origin = times[0] if origin_s is None else min(origin_s, times[0])
    times = times - origin
    with np.errstate(over="ignore"):  # infinite times are refused when the workload is finalized
        return _rescaled(spec, times, where)


def _rescaled(spec: ArrivalSpec, times: np.ndarray, where: str) -> np.ndarray:
    if spec.time_scale is not None:
        times = times * spec.time_scale
    elif spec.target_rate is not None:
        span = times[-1] - times[0]
        if times.size < 2 or span <= 0:
            raise ConfigError(
                f"{where}.target_rate: cannot rescale {times.size} request(s) that all arrive at the same "
                "time; use time_scale or a generative process instead")
        times = times * (((times.size - 1) / span) / spec.target_rate)
    return times
