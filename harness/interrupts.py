"""Ctrl-C during a run: finish the current step, then write what has run, marked incomplete.

The first SIGINT only sets a flag that the engine loop checks after each step, so
no manager or recorder is left half-updated; a second SIGINT raises
``KeyboardInterrupt`` at once (the run still writes the systems that finished).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator


class InterruptFlag:
    """``reason`` is None until Ctrl-C; pass ``flag.check`` as the engine's stop hook."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def check(self) -> str | None:
        return self.reason


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[InterruptFlag]:
    """Turn the first Ctrl-C into ``flag.reason = "interrupted"`` for the duration."""
    flag = InterruptFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be installed from the main thread
        return

    def on_sigint(signum, frame) -> None:
        flag.reason = "interrupted"
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C aborts at once
        print("\ninterrupt: finishing the current step and writing what has run "
              "(Ctrl-C again to abort)", file=sys.stderr, flush=True)

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
