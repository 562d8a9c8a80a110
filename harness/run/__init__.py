"""The run room: one serving run of several systems on one workload (``serve``): its plan
(``run_setup``: every spec built and checked before any work), progress, interrupts, the run
directory's lock, results and their reuse across a sweep, and rejected requests. Worker
processes are the shared ``harness.processes``; GPU telemetry is the engine's
(``harness.engine.nvml``)."""
