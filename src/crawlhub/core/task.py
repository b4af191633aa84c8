"""The Task record: a JSON object (a dict) plus the built-in keys the hub owns.

Outside crawlhub (queues, Redis lists, Kafka, logs) a task is JSON; inside it is a dict.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from crawlhub.core.jsoncodec import MAX_DEPTH, check_depth

#: Keys the hub adds and owns; user params must not use these names (SPEC §1).
BUILTIN_KEYS: tuple[str, ...] = (
    "task_uuid",
    "outbound",
    "routed_count",
    "retry_times",
    "group_retry_times",
    "retry_limits",
    "submitter",
    "submit_time",
    "rt",
    "priority",
    "token_scope",
)
BUILTIN_KEY_SET = frozenset(BUILTIN_KEYS)

#: Key of a worker's result code in a result message.
RESULT_KEY = "task_result"


#: Ids cut from 4 KiB of the OS's randomness at a time: one system call per 256 ids
#: instead of one each (~0.4 us an id here, ~1.1 us with a call each). A deque: taking
#: one is atomic, so threads may share it; a forked child starts with none of its
#: parent's.
_ids: deque[str] = deque()
os.register_at_fork(after_in_child=_ids.clear)


def new_task_uuid() -> str:
    """32 random hex digits, the form of ``uuid4().hex`` (128 bits of ``os.urandom``)."""
    try:
        return _ids.popleft()
    except IndexError:
        digits = os.urandom(4096).hex()
        _ids.extend(digits[start:start + 32] for start in range(32, len(digits), 32))
        return digits[:32]


class Task(dict[str, Any]):
    """A task: a plain dict with typed accessors for the built-in keys.

    Being a dict keeps routing cheap (selectors read it directly) and keeps the JSON
    form identical to what taskHUB spiders already read.
    """

    __slots__ = ()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Task:
        return cls(data)

    def ensure_identity(self, submitter: str, *, now: float | None = None,
                        checked: bool = False) -> Task:
        """Give a new task its uuid, submitter, submit time and zeroed counters.

        Raises :class:`~crawlhub.core.jsoncodec.TooDeepError` for a task nested more than
        :data:`~crawlhub.core.jsoncodec.MAX_DEPTH` levels: what the hub takes in it must be able
        to hand out again (lease answers, dry runs), so it refuses it here. ``checked``:
        the caller has checked the depth already (``Hub.submit``, in its one pass over
        each task: :func:`~crawlhub.core.jsoncodec.json_shape`).
        """
        if not checked:
            check_depth(self, "the task", MAX_DEPTH)
        given = self.get("task_uuid")
        if not given or not isinstance(given, str | int | float) or isinstance(given, bool):
            self["task_uuid"] = new_task_uuid()  # absent, or not usable as an id
        elif not isinstance(given, str):
            self["task_uuid"] = str(given)
        self.setdefault("submitter", submitter)
        if not self.get("submit_time"):
            self["submit_time"] = _stamp(now if now is not None else time.time())
        self.setdefault("routed_count", 0)
        self.setdefault("retry_times", 0)
        self.setdefault("group_retry_times", 0)
        self["rt"] = bool(self.get("rt", False))
        return self

    @property
    def task_uuid(self) -> str:
        return str(self.get("task_uuid") or "")

    @property
    def outbound(self) -> str | None:
        value = self.get("outbound")
        return str(value) if value else None

    @property
    def retry_times(self) -> int:
        return _int(self.get("retry_times"))

    @property
    def routed_count(self) -> int:
        return _int(self.get("routed_count"))


_last_stamp: tuple[int, str] = (-1, "")


def _stamp(now: float) -> str:
    """``submit_time`` text, formatted once per second (it is set on every task)."""
    global _last_stamp
    second = int(now)
    if _last_stamp[0] != second:
        _last_stamp = (second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second)))
    return _last_stamp[1]


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
