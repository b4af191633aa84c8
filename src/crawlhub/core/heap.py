"""The cyclic garbage collector in crawlhub's long-running commands (``serve``,
``agent``, ``center``, ``crawl``, ``collect``).

Start-up allocates much and frees little (modules, models, routes, clients): the
collector would only scan it again and again, so it is paused while a command starts
(``with`` :func:`starting`; ``collect`` takes only what follows). Once started
(:func:`started`), what start-up built is moved out of its sight (``gc.freeze``: a full
collection then scans only what the command allocated since), and the youngest
generation is collected every :data:`YOUNG_THRESHOLD` allocations instead of 700: most
of what a download, a lease or a request allocates is freed by reference counting
before a collection would look at it. On the 2-core machine this took a download-center
agent's collector time from ~0.35 s (16% of its CPU) to ~0.04 s over 10,000 downloads
(``bench/center.py``, 2 agents), and the center's from 0.14 s to 0.04 s.

Only the process ``crawlhub``'s console script started does this (:func:`own`, from
``crawlhub.cli.main``): a command run inside another program (a test, a notebook)
leaves that program's collector as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Allocations between two collections of the youngest generation once a command runs
#: (CPython's default: 700). Cyclic garbage waits at most this many allocations longer.
YOUNG_THRESHOLD = 10_000

_owned = False


def own() -> None:
    """This process is ``crawlhub``'s own: its commands may tune the collector."""
    global _owned
    _owned = True


@contextmanager
def starting() -> Iterator[None]:
    """A long-running command starts: the collector pauses until :func:`started` (called
    inside the block) or until the block ends, however it ends."""
    if not _owned:
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()  # (already, after started())


def started() -> None:
    """The command has started: freeze what start-up built, collect the youngest
    generation every YOUNG_THRESHOLD allocations, and run the collector again. No
    ``gc.collect()`` first: it would cost start-up as much; what garbage there is stays."""
    if not _owned:
        return
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
    gc.enable()
