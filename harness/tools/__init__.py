"""The tools room: commands beside the main run. ``python -m harness.tools.calibrate`` (fit
the sim's cost model on measured steps), ``harness.tools.hostcost`` (block-table cost vs
batch), ``harness.tools.traces`` (fetch public traces)."""
