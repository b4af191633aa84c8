"""What both intake backends share: the record of a task between its intake and its
push (:class:`Intake`), the answers of ``intake_begin``, frontier gate names and the
queue group a one-script push writes to."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from crawlhub.core import jsoncodec

NEW, TOOK_OVER, RECORDED_AGAIN, ALREADY_ROUTED, GATE_HELD = "N", "T", "R", "A", "D"


#: an entry's keys after its task, and their JSON, by their values (Intake.entry_around)
_tails: dict[tuple[str, float | None, str | None], bytes] = {}


@dataclass(slots=True)
class Intake:
    """One task on its way in: its ledger entry, and the frontier gate it holds (if any)."""

    task: dict[str, Any]
    outbound: str
    deadline: float | None
    gate: str | None = None
    #: the gate was taken over (see the module docstring); set by intake_claim
    inherited: bool = False
    #: the entry as encoded already (``dumpb_strict``), if it was
    raw: bytes | None = None

    @property
    def uuid(self) -> str:
        return str(self.task["task_uuid"])

    def dumps(self) -> str:
        """The ledger entry (the layout of hub/state.py, plus ``g``: the gate)."""
        return jsoncodec.dumps(self._entry())

    def entry_text(self) -> str:
        """The ledger entry as text: the one encoded already (``raw``), else encoded now."""
        return self.raw.decode() if self.raw is not None else self.dumps()

    def entry_bytes(self) -> bytes:
        """:meth:`entry_text` as UTF-8 bytes (``raw`` as it is)."""
        return self.raw if self.raw is not None else self.dumps().encode()

    def dumpb_strict(self, *, finite: bool = False) -> bytes:
        """The ledger entry as UTF-8 bytes; NaN and infinities raise ValueError instead
        of becoming null (``finite``: the task is known to hold neither, see
        ``jsoncodec.json_shape``), as does text UTF-8 cannot carry."""
        return jsoncodec.dumpb_strict(self._entry(), finite=finite and (
            self.deadline is None or math.isfinite(self.deadline)))

    def entry_around(self, task_json: bytes) -> bytes:
        """The entry :meth:`dumpb_strict` writes, around the task encoded already
        (``task_json``: finite, strict JSON of ``self.task``'s keys and values)."""
        key = (self.outbound, self.deadline, self.gate)
        tail = _tails.get(key)
        if tail is None:  # (a batch's tasks for one outbound share theirs: encoded once)
            if self.deadline is not None and not math.isfinite(self.deadline):
                raise ValueError("NaN and Infinity are not JSON; the deadline is not finite")
            if len(_tails) >= 256:
                _tails.clear()
            tail = _tails[key] = b",%b" % jsoncodec.dumpb({
                "o": self.outbound, "d": self.deadline,
                **({"g": self.gate} if self.gate else {})})[1:]
        return b'{"t":%b%b' % (task_json, tail)

    def _entry(self) -> dict[str, Any]:
        data: dict[str, Any] = {"t": self.task, "o": self.outbound, "d": self.deadline}
        if self.gate:
            data["g"] = self.gate
        return data

    @classmethod
    def loads(cls, raw: str | bytes) -> Intake:
        data = jsoncodec.loads(raw)
        return cls(task=data["t"], outbound=data["o"], deadline=data.get("d"),
                   gate=data.get("g"))


def gate_of(frontier: str, segment: int, key: str) -> str:
    return f"{frontier}\x1f{segment}\x1f{key}"


def parse_gate(gate: str) -> tuple[str, int, str]:
    frontier, segment, key = gate.split("\x1f", 2)
    return frontier, int(segment), key


@dataclass(slots=True)
class QueueGroup:
    """Tasks for one queue outbound on the ledger's Redis: its keys and names."""

    keys: list[str]  # ready payloads priorities stats seq
    queue: str
    outbound: str
    limit: int = 0  # the queue's configured delivery limit (0: none)
