"""What a job process needs from crawlhub: pause / continue / exit, counters, log lines
and task events for its run's timeline. No crawlhub service is needed, nothing heavy is
imported; without a runner (no ``CRAWLHUB_*`` environment) a job runs as always.

    from crawlhub import sdk

    control = sdk.control()
    for item in work:
        if not control.wait_while_paused():   # blocks while paused; False: exit asked
            break                             # stop cleanly, progress saved
        with sdk.task("fetch-page"):
            handle(item)
        sdk.count("items")

The runner rewrites the control file when the job's desired state changes; this module
reads it at most every :data:`CHECK_EVERY` seconds (one ``stat``, a read only when the
file changed). A job waiting out a pause in :meth:`Control.wait_while_paused` (or
:meth:`Control.until_running`) acknowledges it (the ack file); a job that holds still
another way calls :meth:`Control.acknowledge` itself. A pause not acknowledged within
:data:`~crawlhub.core.jobprotocol.ACK_WAIT` seconds is enforced by the runner: it stops the
job's processes (SIGSTOP) until continued. Counters go to the counters file at most every
:data:`FLUSH_EVERY` seconds, so counting every item costs a dict update. The file formats and the stdout
messages are in :mod:`crawlhub.core.jobprotocol`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from crawlhub.core.jobprotocol import (
    ENV_ACK_FILE,
    ENV_CONTROL_FILE,
    ENV_COUNTERS_FILE,
    ENV_JOB,
    ENV_RUN,
    EXIT,
    PAUSE,
    RUN,
    STATES,
    read_json,
    write_json_atomic,
)

__all__ = [
    "CHECK_EVERY", "FLUSH_EVERY", "Control", "Counters", "Manual", "control", "count",
    "counters", "flush", "job", "log", "process_counters", "run", "set_counter",
    "set_counters", "task", "under_runner",
]

#: Seconds a control read is trusted before the control file is looked at again.
CHECK_EVERY = 0.05
#: Seconds between two writes of the counters file (at most).
FLUSH_EVERY = 0.5
#: Seconds between two looks at the state while waiting out a pause.
WAIT_STEP = 0.05
LEVELS = ("debug", "info", "warning", "error", "critical")

Number = int | float


def job() -> str | None:
    """The job's name when a runner started this process, else None."""
    return os.environ.get(ENV_JOB) or None


def run() -> str | None:
    """The run's code when a runner started this process, else None."""
    return os.environ.get(ENV_RUN) or None


def under_runner() -> bool:
    """Whether a crawlhub runner started this process (it gave a control file)."""
    return bool(os.environ.get(ENV_CONTROL_FILE))


# -- control ------------------------------------------------------------------------------
class Control:
    """A job's desired state: ``run``, ``pause`` (hold still, lose nothing) or ``exit``
    (stop cleanly). Read it as often as you like: :attr:`state` answers from memory and
    asks its source again at most every :data:`CHECK_EVERY` seconds.

    Sources: a control file (:meth:`from_file`, what a runner gives a process), a callable
    (:meth:`from_callable`, an in-process run fed by its runner), or none (always run).
    """

    def __init__(self, source: Callable[[], str | None] | None = None, *,
                 check_every: float = CHECK_EVERY, ack_file: str | Path | None = None
                 ) -> None:
        self._source = source
        self.check_every = check_every
        self._state = RUN
        self._checked = -1e18
        #: where :meth:`acknowledge` writes (None: nobody asks for acknowledgements)
        self.ack_file = Path(ack_file) if ack_file else None
        self._acked: tuple[str, float] | None = None

    @classmethod
    def from_file(cls, path: str | Path, *, check_every: float = CHECK_EVERY,
                  ack_file: str | Path | None = None) -> Control:
        """The state in a control file ``{"state": ..., "changed_at": ...}``. Each look is
        one ``stat``; the file is read only when its inode, size or mtime changed. A
        missing or unreadable file keeps the last state known (at first: run).
        ``ack_file``: where a pause is acknowledged; by default the runner's
        (``$CRAWLHUB_ACK_FILE``) when ``path`` is the runner's control file."""
        if ack_file is None and str(path) == os.environ.get(ENV_CONTROL_FILE):
            ack_file = os.environ.get(ENV_ACK_FILE) or None
        return cls(_FileSource(Path(path)), check_every=check_every, ack_file=ack_file)

    def acknowledge(self) -> None:
        """Tell the runner the job holds still in the state it reads now (a pause: it
        will not stop the job's processes). Call it once no new work is started and what
        was in flight is done; ``wait_while_paused`` calls it. Cheap to call again: each
        state change is written once. Without an ack file (no runner) nothing happens."""
        state = self.state
        if self.ack_file is None or state != PAUSE:
            return
        changed_at = getattr(self._source, "changed_at", 0.0)
        if self._acked == (state, changed_at):
            return
        try:
            write_json_atomic(self.ack_file, {"state": state, "changed_at": changed_at,
                                              "at": time.time()})
            self._acked = (state, changed_at)
        except OSError:
            pass  # the runner stops the process instead: paused all the same

    @classmethod
    def from_callable(cls, get_state: Callable[[], str | None], *,
                      check_every: float = 0.0) -> Control:
        """The state ``get_state()`` returns (None or an unknown word: no change)."""
        return cls(get_state, check_every=check_every)

    def __repr__(self) -> str:
        return f"<Control {self.state}>"

    @property
    def state(self) -> str:
        source = self._source
        if source is None:
            return self._state
        now = time.monotonic()
        if now - self._checked >= self.check_every:
            self._checked = now
            state = source()
            if state is not None and state in STATES:
                self._state = state
        return self._state

    @property
    def running(self) -> bool:
        return self.state == RUN

    @property
    def paused(self) -> bool:
        return self.state == PAUSE

    @property
    def exit_requested(self) -> bool:
        return self.state == EXIT

    def wait_while_paused(self, timeout: float | None = None) -> bool:
        """Block while the job is paused. False when exit was requested (stop now,
        cleanly); True otherwise: running again, or ``timeout`` seconds ran out while still
        paused (:attr:`paused` tells which)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (verdict := self._verdict(deadline)) is None:
            time.sleep(WAIT_STEP)
        return verdict

    async def until_running(self, timeout: float | None = None) -> bool:
        """:meth:`wait_while_paused` for asyncio code: waits without blocking the loop."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (verdict := self._verdict(deadline)) is None:
            await asyncio.sleep(WAIT_STEP)
        return verdict

    def _verdict(self, deadline: float | None) -> bool | None:
        """What a wait answers now (False: exit; True: running, or paused past
        ``deadline``), or None: still paused, wait on."""
        state = self.state
        if state != PAUSE:
            return state != EXIT
        self.acknowledge()
        if deadline is not None and time.monotonic() >= deadline:
            return True
        return None


class Manual(Control):
    """A control set by hand (:meth:`set`): for in-process runs and tests."""

    def __init__(self, state: str = RUN) -> None:
        super().__init__(None)
        self.set(state)

    def set(self, state: str) -> None:
        if state not in STATES:
            raise ValueError(f"unknown control state {state!r}: use one of {', '.join(STATES)}")
        self._state = state


class _FileSource:
    """Reads a control file only when it changed (inode, size or mtime)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._state: str | None = None
        #: the ``changed_at`` of the state read (what an acknowledgement answers)
        self.changed_at = 0.0

    def __call__(self) -> str | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return self._state
        mark = (st.st_ino, st.st_size, st.st_mtime_ns)
        if mark != self._seen:
            data = read_json(self.path)
            if isinstance(data, dict) and data.get("state") in STATES:
                self._seen = mark
                self._state = str(data["state"])
                changed = data.get("changed_at")
                self.changed_at = float(changed) if isinstance(changed, int | float) else 0.0
        return self._state


_control: tuple[str, Control] | None = None
_singletons_lock = threading.Lock()


def control() -> Control:
    """This process's :class:`Control`: the runner's control file
    (``$CRAWLHUB_CONTROL_FILE``), or always ``run`` without one."""
    global _control
    path = os.environ.get(ENV_CONTROL_FILE, "")
    current = _control
    if current is not None and current[0] == path:
        return current[1]
    with _singletons_lock:
        if _control is None or _control[0] != path:
            _control = (path, Control.from_file(path) if path else Control())
        return _control[1]


# -- counters -----------------------------------------------------------------------------
class Counters:
    """Named numbers of a run (``items``, ``pages``, ``errors``...) written to ``path``
    as ``{"counters": {...}, "updated_at": t}``, atomically, at most every
    :data:`FLUSH_EVERY` seconds: by the counting thread when it counts past the interval,
    else by a daemon thread (so a job that counts then sleeps is still seen), and at exit.
    Without a path the numbers are only kept in memory. Thread-safe."""

    def __init__(self, path: str | Path | None, *, flush_every: float = FLUSH_EVERY) -> None:
        self.path = Path(path) if path else None
        self.flush_every = flush_every
        self._values: dict[str, Number] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._dirty = False
        self._flushed = time.monotonic()
        self._timer: threading.Thread | None = None

    def count(self, name: str, n: Number = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n
            self._dirty = True
        self._changed()

    def set(self, name: str, value: Number) -> None:
        with self._lock:
            self._values[name] = value
            self._dirty = True
        self._changed()

    def update(self, values: Mapping[str, Number]) -> None:
        with self._lock:
            self._values.update(values)
            self._dirty = True
        self._changed()

    def snapshot(self) -> dict[str, Number]:
        with self._lock:
            return dict(self._values)

    def flush(self) -> None:
        """Write the counters now (when there is a file and something changed)."""
        if self.path is None:
            return
        with self._write_lock:
            with self._lock:
                if not self._dirty:
                    return
                values, self._dirty = dict(self._values), False
                self._flushed = time.monotonic()
            try:
                write_json_atomic(self.path, {"counters": values, "updated_at": time.time()})
            except OSError:
                with self._lock:
                    self._dirty = True  # the next flush tries again

    def _changed(self) -> None:
        if self.path is None:
            return
        if time.monotonic() - self._flushed >= self.flush_every:
            self.flush()
        elif self._timer is None:
            self._start_timer()

    def _start_timer(self) -> None:
        with self._lock:
            if self._timer is not None:
                return
            self._timer = threading.Thread(target=self._flush_forever, daemon=True,
                                           name="crawlhub-counters")
        self._timer.start()
        atexit.register(self.flush)

    def _flush_forever(self) -> None:
        # writes what counting left unwritten once it is due (counting writes itself
        # when it passes the interval, so the two never write twice in one interval)
        while True:
            wait = self._flushed + self.flush_every - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            elif self._dirty:
                self.flush()
            else:
                time.sleep(self.flush_every)


_counters: tuple[str, Counters] | None = None


def process_counters() -> Counters:
    """This process's :class:`Counters`: the runner's counters file
    (``$CRAWLHUB_COUNTERS_FILE``), or in memory only without one."""
    global _counters
    path = os.environ.get(ENV_COUNTERS_FILE, "")
    current = _counters
    if current is not None and current[0] == path:
        return current[1]
    with _singletons_lock:
        if _counters is None or _counters[0] != path:
            if _counters is not None:
                _counters[1].flush()
            _counters = (path, Counters(path or None))
        return _counters[1]


def count(name: str, n: Number = 1) -> None:
    """Add ``n`` to counter ``name`` (cheap: call it per item)."""
    process_counters().count(name, n)


def set_counter(name: str, value: Number) -> None:
    """Set counter ``name`` to ``value``."""
    process_counters().set(name, value)


def set_counters(values: Mapping[str, Number]) -> None:
    """Set several counters at once."""
    process_counters().update(values)


def counters() -> dict[str, Number]:
    """This process's counters (a copy)."""
    return process_counters().snapshot()


def flush() -> None:
    """Write the counters file now (before a planned exit; ``atexit`` does it too)."""
    process_counters().flush()


# -- log lines and the task timeline ------------------------------------------------------
_task: contextvars.ContextVar[str | None] = contextvars.ContextVar("crawlhub_task",
                                                                   default=None)
_print_lock = threading.Lock()


def _emit(message: dict[str, object]) -> None:
    line = json.dumps(message, ensure_ascii=False, default=str)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log(message: str, *, level: str = "info", task: str | None = None) -> None:
    """One log line for the run's searchable log, as a JSON message on stdout; ``task``
    defaults to the task of the enclosing :func:`task` block."""
    level = level.lower()
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    _emit({"crawlhub": "log", "level": level, "task": task or _task.get(),
           "message": str(message)})


@contextlib.contextmanager
def task(code: str) -> Iterator[str]:
    """Mark a task of the run's timeline: ``running`` now, then ``succeeded``, or
    ``failed`` with the exception's text (the exception goes on)."""
    code = str(code)
    if not code:
        raise ValueError("a task needs a non-empty code")
    _emit({"crawlhub": "task", "task": code, "status": "running", "ts": time.time()})
    token = _task.set(code)
    try:
        yield code
    except BaseException as exc:
        _emit({"crawlhub": "task", "task": code, "status": "failed", "ts": time.time(),
               "detail": f"{type(exc).__name__}: {exc}"})
        raise
    else:
        _emit({"crawlhub": "task", "task": code, "status": "succeeded", "ts": time.time()})
    finally:
        _task.reset(token)
