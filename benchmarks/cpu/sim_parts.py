"""CPU seconds of a run's parts: ``python -m harness`` with timers around the engine's
functions (the scheduler, fast-forward, the executor's pricing, the managers' calls) and
the run's own work (step tables, phase columns, CSV writing).

Runs in this process, on whichever pagebench its imports find: from a checkout of the
regrouped layout as is, from an older commit with ``PYTHONPATH=<its tree>`` and that tree
as the working directory (top-level ``allocators`` and ``harness.run`` as a module).
Each part is timed with ``time.process_time`` (CPU seconds of this process: less moved by
other jobs on a shared machine than wall time) and counted; nested parts are included in
their callers. A timer costs about a microsecond a call: compare runs of the same script.

    python benchmarks/cpu/sim_parts.py workload=azure_conv workload.path=... jobs=1 \\
        report=false progress=false
"""

from __future__ import annotations

import atexit
import collections
import runpy
import sys
import time

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper that adds its CPU seconds to ``label``."""
    inner = getattr(owner, name, None)
    if inner is None:
        return

    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[label] += time.process_time() - start
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    """Time the parts of the engine and of the run, under either import layout."""
    import harness.engine.engine as engine
    from harness.engine.scheduler import Scheduler
    from harness.engine.sim_executor import SimExecutor
    try:  # the regrouped layout (8c73edd on)
        import harness.run.serve as serve
        from harness.metrics.summaries import RunRecorder
    except ImportError:  # before: harness/run.py and harness/metrics.py
        import harness.run as serve
        from harness.metrics import RunRecorder
    timed(engine, "_run_engine", "engine")
    timed(engine, "fast_forward", "fast_forward")
    timed(engine, "_tokens_digest", "tokens_digest")
    for name in ("schedule", "postprocess", "finish_decoded", "admission_while_decoding"):
        timed(Scheduler, name, f"scheduler.{name}")
    for name in ("execute", "decode_durations", "decoded_span", "phase_columns"):
        timed(SimExecutor, name, f"executor.{name}")
    timed(RunRecorder, "record_step", "record_step")
    timed(RunRecorder, "step_table", "step_table")
    timed(RunRecorder, "request_table", "request_table")
    timed(serve, "write_table", "write_table")
    timed(serve, "_system_summary", "system_summary")


def report(out=sys.stderr) -> None:
    for label, seconds in sorted(SECONDS.items(), key=lambda item: -item[1]):
        calls = CALLS[label]
        print(f"PART {label:34s} {seconds:8.3f} s {calls:8d} calls {1e6 * seconds / calls:9.1f} us",
              file=out)


if __name__ == "__main__":
    instrument()
    atexit.register(report)
    sys.argv = ["harness", *sys.argv[1:]]
    runpy.run_module("harness", run_name="__main__")
