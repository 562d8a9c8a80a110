"""A SIGTERM (or Ctrl-C) that arrives while the interpreter shuts down, after the run wrote
everything, is ignored: the exit status is the run's, with no traceback (a KeyboardInterrupt
raised in an exit hook) and no silent death by the signal (status 143)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = f"""
import atexit, os, signal, sys, time
sys.path.insert(0, {str(ROOT)!r})
# registered before terminate_as_interrupt's hook, so it runs after it, during shutdown
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(0.5)))
from harness.run.interrupts import terminate_as_interrupt
terminate_as_interrupt()
print("run done")
"""


def test_sigterm_during_shutdown_leaves_the_exit_status_alone():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "run done\n", "")
