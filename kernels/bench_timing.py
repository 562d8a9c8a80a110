"""How the kernel benchmark times a call: CUDA-graph replay with a cold L2, and beside it
the eager, event-timed launch.

The engine replays CUDA graphs, so the figure that prices a decode step is the kernel's
time inside a graph, not the time of one Python call. The first H200 run
(benchmarks/gpu/2026-12-04-h200) timed eager calls with ``triton.testing.do_bench``; its
paged and contiguous kernels took 0.10-0.31 ms wherever the kernel itself needs less than
~0.3 ms -- the wrapper's host time -- and, near that line, one mode or the other from run
to run (issue 33). ``GraphTimer`` does what the field's benchmarks do
(``triton.testing.do_bench_cudagraph``, FlashInfer's ``bench_gpu_time_with_cudagraph``):

* graph ``G1`` holds ``n`` launches of the call, each after an L2 flush; graph ``G0`` the
  same ``n`` flushes alone. Both are replayed ``rounds`` times, interleaved, each replay
  timed with CUDA events; one round's figure is ``(t(G1) - t(G0)) / n``, and the result is
  the median over rounds (``spread``: (max - min) / median of the rounds);
* the flush *reads* a buffer of ``max(256 MiB, 4 x L2)`` (256 MiB: do_bench's flush buffer;
  the H200 has 60 MB of L2), so the call starts with none of its data in L2. do_bench
  zero-fills its buffer instead, which leaves the L2 full of dirty lines that the timed
  call then writes back; read lines are clean and evicting them costs the call nothing;
* ``n`` gives each graph about ``TARGET_GRAPH_MS`` of calls (``MIN_LAUNCHES`` to
  ``MAX_LAUNCHES``), from an eager estimate.

``launch_us`` is the eager figure beside it: ``do_bench`` median of one Python call with
events around it (L2 zero-filled before each), in microseconds -- what the 2026-12-04
figures measured, kernel plus whatever host time the GPU waited for.

On CPU there are no graphs: a timed loop, median of ``cpu_repeats`` after one warm-up, and
the results say ``"timings": "cpu"``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

FLUSH_MIN_BYTES = 256 << 20  # triton.testing.do_bench's L2 flush buffer (get_empty_cache_for_benchmark)
TARGET_GRAPH_MS = 5.0  # calls per graph: enough that event resolution (~1 us) is noise
MIN_LAUNCHES, MAX_LAUNCHES = 3, 50
ROUNDS = 10  # replays of each graph; the median round is the figure


@dataclass(frozen=True)
class Timing:
    """One callable's figures: ``ms`` the headline (graph-timed on CUDA, timed loop on CPU)."""

    ms: float | None  # None: the graph could not be captured (``error`` says why)
    launch_us: float | None = None  # eager, event-timed (CUDA only)
    launches: int | None = None  # calls per graph
    spread: float | None = None  # (max - min) / median over the rounds
    error: str | None = None


class CpuTimer:
    """Median milliseconds of ``repeats`` calls after one warm-up (CPU)."""

    def __init__(self, repeats: int) -> None:
        self.repeats = repeats

    def __call__(self, fn: Callable[[], object], graph: bool = True) -> Timing:
        fn()
        samples = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return Timing(statistics.median(samples))


class GraphTimer:
    """CUDA-graph-timed calls with a cold L2, plus the eager launch figure (module docstring)."""

    def __init__(self, device: torch.device, warmup_ms: int = 10, rep_ms: int = 50, rounds: int = ROUNDS) -> None:
        from pagebench.kernels.bandwidth import READ_BLOCK, READ_ITERS

        self.device, self.warmup_ms, self.rep_ms, self.rounds = device, warmup_ms, rep_ms, rounds
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        self.flush_bytes = max(FLUSH_MIN_BYTES, 4 * l2)
        self._flush_src = torch.empty(self.flush_bytes // 2, dtype=torch.float16, device=device).normal_()
        per_program = READ_BLOCK * READ_ITERS
        self._flush_programs = -(-self._flush_src.numel() // per_program)
        self._flush_out = torch.empty(self._flush_programs, dtype=torch.float32, device=device)
        self.flush()  # compiled and loaded now: no module load may happen during a capture
        torch.cuda.synchronize()

    def flush(self) -> None:
        """Read the flush buffer once (evicts every line of the call's data from L2)."""
        from pagebench.kernels.bandwidth import READ_BLOCK, READ_ITERS, _read_kernel

        _read_kernel[(self._flush_programs,)](self._flush_src, self._flush_out, self._flush_src.numel(),
                                              BLOCK=READ_BLOCK, ITERS=READ_ITERS, num_warps=8)

    def launch_us(self, fn: Callable[[], object]) -> float:
        import triton.testing

        return 1e3 * float(triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))

    def __call__(self, fn: Callable[[], object], graph: bool = True) -> Timing:
        """Both figures of ``fn``; ``graph=False`` (calls that sync or cannot be captured) gives
        the eager figure as ``ms`` too, and says so in ``error``."""
        launch = self.launch_us(fn)  # compiles and warms up as well
        if not graph:
            return Timing(launch / 1e3, launch, error="eager only (not graph-capturable)")
        try:
            ms, launches, spread = self._graph_ms(fn, launch / 1e3)
        except Exception as exc:  # noqa: BLE001 - the eager figure stays; the row says why the graph one is absent
            torch.cuda.synchronize()
            return Timing(None, launch, error=f"graph: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
        return Timing(ms, launch, launches, spread)

    def _capture(self, body: Callable[[], None]) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        enabled = gc.isenabled()
        gc.disable()  # a collected Triton kernel would unload its module mid-capture (see triton.testing)
        try:
            with torch.cuda.graph(graph):
                body()
        finally:
            if enabled:
                gc.enable()
        return graph

    def _graph_ms(self, fn: Callable[[], object], estimate_ms: float) -> tuple[float, int, float]:
        n = max(MIN_LAUNCHES, min(MAX_LAUNCHES, int(TARGET_GRAPH_MS / max(estimate_ms, 1e-3))))

        def with_calls() -> None:
            for _ in range(n):
                self.flush()
                fn()

        def flushes_only() -> None:
            for _ in range(n):
                self.flush()

        g1, g0 = self._capture(with_calls), self._capture(flushes_only)
        g1.replay()
        g0.replay()
        torch.cuda.synchronize()
        pairs = []
        for _ in range(self.rounds):
            times = []
            for g in (g0, g1):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            pairs.append((times[1], times[0]))
        del g1, g0
        median, spread = per_call_ms(pairs, n)
        return median, n, spread


def per_call_ms(pairs: list[tuple[float, float]], n: int) -> tuple[float, float]:
    """(median, spread) per call from rounds of (ms of the graph with calls, ms of the graph of
    flushes alone), each graph ``n`` calls long; an error when the median is not above 0."""
    rounds = [(with_calls - flushes) / n for with_calls, flushes in pairs]
    median = statistics.median(rounds)
    if median <= 0:
        raise RuntimeError(f"the call's time is below the replay noise ({median * 1e3:.2f} us)")
    return median, (max(rounds) - min(rounds)) / median
