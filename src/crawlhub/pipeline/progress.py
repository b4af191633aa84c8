"""Progress of running pipelines as text and as a Rich progress bar (for the CLI).

Both read ``Pipeline.progress()`` snapshots; nothing here changes a run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")

Snapshot = dict[str, Any]


def describe_progress(snap: Snapshot) -> str:
    """``[job] list 12/40 requests, queue 3/100, workers 2/2, backlog 7, written 900``."""
    total = snap.get("requests_total")
    done = f"{snap['requests_done']}/{total}" if total else str(snap["requests_done"])
    return (
        f"[{snap['job']}] {snap['stage']} {done} requests, queue {snap['queue']}/"
        f"{snap['queue_size']}, workers {snap['active_workers']}/{snap['workers']}, "
        f"backlog {snap['write_backlog']}, written {snap['written']}"
    )


class ProgressBars:
    """One Rich progress bar per job, fed with snapshots: ``bars.update(snapshot)``."""

    def __init__(self, console: Console | None = None) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.fields[job]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> ProgressBars:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, snap: Snapshot) -> None:
        detail = (f"{snap['stage']} | queue {snap['queue']}/{snap['queue_size']} | "
                  f"workers {snap['active_workers']}/{snap['workers']} | "
                  f"backlog {snap['write_backlog']} | written {snap['written']}")
        job = str(snap["job"])
        task = self._tasks.get(job)
        if task is None:
            task = self._tasks[job] = self.progress.add_task(
                job, total=snap.get("requests_total"), job=job, detail=detail
            )
        self.progress.update(task, completed=snap["requests_done"],
                             total=snap.get("requests_total"), detail=detail)


async def show_progress(
    snapshots: Callable[[], Sequence[Snapshot]],
    work: Awaitable[T],
    *,
    console: Console | None = None,
    interval: float = 0.25,
) -> T:
    """Await ``work`` while drawing ``snapshots()`` as progress bars every ``interval`` s."""
    task = asyncio.ensure_future(work)
    with ProgressBars(console) as bars:
        while not task.done():
            for snap in snapshots():
                bars.update(snap)
            await asyncio.wait({task}, timeout=interval)
        for snap in snapshots():
            bars.update(snap)
    return task.result()
