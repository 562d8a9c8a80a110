"""Ctrl-C or SIGTERM during a run: finish the current step, then write what has run, marked
incomplete.

SIGTERM is what a CI cancel, a SLURM preemption and ``timeout`` send: it is treated as
Ctrl-C (exit status 130 either way). The first signal only sets a flag that the engine
loop checks after each step, so no manager or recorder is left half-updated; a second
raises ``KeyboardInterrupt`` at once (the run still writes the systems that finished).
Outside a run (``terminate_as_interrupt``) SIGTERM raises ``KeyboardInterrupt`` as Ctrl-C
does, so that what handles Ctrl-C there (a sweep's report of the jobs that finished, drawn
at exit) handles it too.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_HOW = {signal.SIGINT: "interrupt", signal.SIGTERM: "terminated (SIGTERM)"}


class InterruptFlag:
    """``reason`` is None until Ctrl-C; pass ``flag.check`` as the engine's stop hook."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def check(self) -> str | None:
        return self.reason


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def terminate_as_interrupt() -> None:
    """From now on SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does,
    until the interpreter shuts down (``ignore_stop_signals_at_exit``)."""
    import atexit

    signal.signal(signal.SIGTERM, _raise_interrupt)
    atexit.register(ignore_stop_signals_at_exit)  # registered first: runs last


def ignore_stop_signals_at_exit() -> None:
    """Ctrl-C or SIGTERM once the run is over and the interpreter shuts down: ignored. The
    outputs are written and the exit status is the run's; a KeyboardInterrupt raised there
    was a traceback, and a SIGTERM after Python's own handlers were gone killed the process
    silently with status 143."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[InterruptFlag]:
    """Turn the first Ctrl-C or SIGTERM into ``flag.reason = "interrupted"`` for the
    duration; a second of either raises ``KeyboardInterrupt``."""
    flag = InterruptFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag  # signal handlers can only be installed from the main thread
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def on_signal(signum, frame) -> None:
        if flag.reason is not None:  # the second: abort at once
            raise KeyboardInterrupt
        flag.reason = "interrupted"
        again = "Ctrl-C" if signum == signal.SIGINT else "signal"
        print(f"\n{_HOW[signum]}: finishing the current step and writing what has run "
              f"({again} again to abort)", file=sys.stderr, flush=True)

    for signum in STOP_SIGNALS:
        signal.signal(signum, on_signal)
    try:
        yield flag
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
