"""Progress bars for systems that run in worker processes.

A worker cannot draw on the parent's terminal without garbling the other workers' lines,
so each one publishes its progress into shared memory (``shared_progress``: two doubles per
system, requests finished and the engine clock, written by ``publish``), and the parent,
which polls its workers anyway, redraws one tqdm bar per system from it (``ParallelBars``).
Writing two doubles costs the worker nothing next to an engine step; the engine calls its
progress hook at most twice a second.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


def shared_progress(mp_context: Any, num_systems: int) -> Any:
    """Shared memory for ``num_systems`` systems' progress: [done_0, clock_0, done_1, ...]."""
    return mp_context.RawArray("d", 2 * num_systems)


def publish(slots: Any, index: int, done: int, clock_s: float) -> None:
    """A worker's progress hook: system ``index`` has finished ``done`` requests at engine
    time ``clock_s``."""
    slots[2 * index + 1] = clock_s
    slots[2 * index] = done


class ParallelBars:
    """One tqdm bar per system, drawn by the parent from the workers' shared progress."""

    def __init__(self, names: list[str], total: int, slots: Any, clock: str = "sim") -> None:
        from tqdm import tqdm

        self.slots = slots
        self.clock = clock  # "sim": simulated time, "engine": measured
        self.bars = [tqdm(total=total, desc=f"{name:>8}", unit="req", file=sys.stderr,
                          position=i, leave=True, mininterval=0.5)
                     for i, name in enumerate(names)]

    def refresh(self) -> None:
        """Redraw every bar whose system made progress since the last call."""
        for i, bar in enumerate(self.bars):
            done, clock_s = int(self.slots[2 * i]), self.slots[2 * i + 1]
            if done != bar.n or clock_s:
                bar.n = done
                bar.set_postfix_str(f"{self.clock} t={clock_s:.0f}s", refresh=False)
                bar.refresh()

    @contextlib.contextmanager
    def printing(self) -> Iterator[None]:
        """Print other lines (a system's summary) without breaking the bars."""
        from tqdm import tqdm

        with tqdm.external_write_mode(file=sys.stderr):
            yield

    def close(self) -> None:
        self.refresh()
        for bar in reversed(self.bars):
            bar.close()
