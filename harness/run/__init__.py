"""The run room: one serving run of several systems on one workload (``serve``): systems in
worker processes (``processes``), progress, interrupts, the run directory's lock, results and
their reuse across a sweep, rejected requests, and GPU telemetry (``nvml``)."""
