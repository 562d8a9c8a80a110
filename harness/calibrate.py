"""Old path of ``python -m harness.tools.calibrate``, kept for one release (until pagebench 0.2)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("harness.tools.calibrate", run_name="__main__", alter_sys=True)
