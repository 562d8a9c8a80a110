"""A report's figures, drawn together: in several processes when that pays.

Drawing is most of a report's time (a PNG takes 0.15-0.7 s, mostly matplotlib's text
and layout work), and each figure is independent of the others. Sections therefore
put a ``PendingFigure`` (how to build the figure, its alt text and caption) where the
figure goes; ``resolve`` then draws them all, in forked worker processes (up to one
per CPU) when forking is safe, else one after the other, and puts each ``<figure>``
in its place. The PNGs are the same either way.
"""

from __future__ import annotations

import multiprocessing
import signal
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable

from matplotlib.figure import Figure

from harness.processes import fork_is_safe, forking, usable_cpus, worker_pool
from pagebench.reports.figures import to_data_uri
from pagebench.reports.html import figure

MIN_PARALLEL = 4  # fewer figures are drawn in this process (starting and ending 2 workers: ~35 ms)

# The builders being drawn: forked workers inherit this list and get only an index
# (builders are often closures, which do not pickle).
_BUILDERS: list[Callable[[], Figure]] = []


@dataclass(frozen=True)
class PendingFigure:
    """A figure of the page, drawn by ``resolve``."""

    build: Callable[[], Figure]  # makes the figure (in a worker process, maybe)
    alt: str
    caption: str | None = None


def resolve(parts: list[str | PendingFigure]) -> list[str]:
    """``parts`` with every ``PendingFigure`` drawn into its ``<figure>`` HTML, in order."""
    pending = [part for part in parts if isinstance(part, PendingFigure)]
    uris = iter(draw([part.build for part in pending]))
    return [figure(next(uris), part.alt, part.caption) if isinstance(part, PendingFigure)
            else part for part in parts]


def draw(builders: list[Callable[[], Figure]]) -> list[str]:
    """Each builder's figure as a PNG data URI (``figures.to_data_uri``), in order."""
    workers = parallel_workers(len(builders))
    if workers < 2:
        return [to_data_uri(build()) for build in builders]
    global _BUILDERS
    _BUILDERS = builders
    try:
        context = multiprocessing.get_context("fork")
        pool = worker_pool(workers, context, initializer=signal.signal,
                           initargs=(signal.SIGINT, signal.SIG_IGN))
        try:
            with forking():  # the workers start at the first of map's submits
                uris = list(pool.map(_draw_one, range(len(builders))))
        except BrokenProcessPool:  # a worker died (killed, out of memory): draw them here
            pool.shutdown(wait=False)
            return [to_data_uri(build()) for build in builders]
        except BaseException:  # Ctrl-C (workers ignore it: this process says "interrupted")
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return uris
    finally:
        _BUILDERS = []


def _draw_one(index: int) -> str:
    return to_data_uri(_BUILDERS[index]())


def parallel_workers(num_figures: int) -> int:
    """How many processes to draw ``num_figures`` figures in: 1 (this one) unless there are
    enough figures, several CPUs, and forking is safe here.

    Safe: ``harness.processes.fork_is_safe``, and this is not a daemonic worker (which may
    not have children).
    """
    if (num_figures < MIN_PARALLEL or not fork_is_safe()
            or multiprocessing.current_process().daemon):
        return 1
    return min(usable_cpus(), num_figures)
