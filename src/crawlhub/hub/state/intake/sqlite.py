"""The intake ledger in the hub's SQLite file: unpushed records, owners' heartbeats and
frontier gates, one transaction per step (mixed into ``SqliteHubState``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from crawlhub.hub.state.intake.base import ALREADY_ROUTED, GATE_HELD, NEW, TOOK_OVER, Intake

INTAKE_SCHEMA = """
CREATE TABLE IF NOT EXISTS unpushed (task_uuid TEXT PRIMARY KEY, since REAL NOT NULL,
                                     owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS alive (instance TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS gates (gate TEXT PRIMARY KEY, task_uuid TEXT NOT NULL,
                                  inherited INTEGER NOT NULL DEFAULT 0);
"""
_IN = 500  # values per "IN (...)" lookup (SQLite's bound-variable limit)


def select_in(conn: sqlite3.Connection, sql: str, values: Sequence[str]) -> list[Any]:
    """The rows of ``sql`` (one ``IN ({})`` placeholder) for all ``values``, asked
    ``_IN`` at a time."""
    rows: list[Any] = []
    for start in range(0, len(values), _IN):
        chunk = values[start:start + _IN]
        rows += conn.execute(sql.format(",".join("?" * len(chunk))), chunk).fetchall()
    return rows


class SqliteIntake:
    """Intake ledger on the hub's SQLite file (mixed into ``SqliteHubState``)."""

    _db: Any  # opened with INTAKE_SCHEMA in its schema
    retention: float

    async def intake_beat(self, owner: str, now: float) -> None:
        """``owner`` (a hub process) is alive at ``now``."""
        await self._db.transaction(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO alive(instance, at) VALUES (?, ?)", (owner, now)))

    async def intake_begin(self, items: Sequence[Intake], now: float, owner: str
                           ) -> list[str]:
        """Record ``items`` unpushed, owned by ``owner``, where their uuid is new (see
        the module docstring for the answers), in one transaction; ``owner`` beats."""
        rows = [(i.uuid, i.entry_text(), i.gate) for i in items]
        expires = now + self.retention

        def begin(conn: sqlite3.Connection) -> list[str]:
            conn.execute("INSERT OR REPLACE INTO alive(instance, at) VALUES (?, ?)",
                         (owner, now))
            known = {u for (u,) in select_in(
                conn, "SELECT task_uuid FROM ledger WHERE task_uuid IN ({})",
                list({u for u, _, _ in rows}))}
            out: list[str] = []
            fresh: list[tuple[str, str]] = []
            taken: set[str] = set()  # recorded by this call (not in "unpushed" yet)
            for uuid, raw, gate in rows:
                if uuid in known or uuid in taken:
                    out.append(ALREADY_ROUTED)
                    continue
                flag = NEW
                if gate:
                    held = conn.execute("SELECT task_uuid FROM gates WHERE gate = ?",
                                        (gate,)).fetchone()
                    if held is not None and held[0] == "":
                        flag = TOOK_OVER
                    elif held is not None and (held[0] in taken or conn.execute(
                            "SELECT 1 FROM unpushed WHERE task_uuid = ?",
                            (held[0],)).fetchone()):
                        flag = GATE_HELD
                out.append(flag)
                if flag == GATE_HELD:
                    continue
                fresh.append((uuid, raw))
                taken.add(uuid)
                if gate:
                    conn.execute("INSERT OR REPLACE INTO gates(gate, task_uuid, inherited)"
                                 " VALUES (?, ?, ?)", (gate, uuid, int(flag == TOOK_OVER)))
            conn.executemany(
                "INSERT OR REPLACE INTO ledger(task_uuid, entry, deadline, expires)"
                " VALUES (?, ?, NULL, ?)", [(u, raw, expires) for u, raw in fresh])
            conn.executemany(
                "INSERT OR REPLACE INTO unpushed(task_uuid, since, owner) VALUES (?, ?, ?)",
                [(u, now, owner) for u, _ in fresh])
            return out

        return await self._db.transaction(begin)  # type: ignore[no-any-return]

    async def intake_free(self, items: Sequence[Intake]) -> list[bool]:
        """One read: True where the item's uuid is not in the ledger and its gate has no
        row (nobody holds it, nobody released it untaken)."""
        uuids = list({i.uuid for i in items})
        gates = list({i.gate for i in items if i.gate})

        def free(conn: sqlite3.Connection) -> tuple[set[str], set[str]]:
            known = {u for (u,) in select_in(
                conn, "SELECT task_uuid FROM ledger WHERE task_uuid IN ({})", uuids)}
            held = {g for (g,) in select_in(
                conn, "SELECT gate FROM gates WHERE gate IN ({})", gates)}
            return known, held

        known, held = await self._db.run(free)
        return [i.uuid not in known and not (i.gate and i.gate in held) for i in items]

    async def intake_commit(self, items: Sequence[Intake],
                            counters: Sequence[tuple[str, str, int]] = ()) -> None:
        """``items`` are pushed: they wait for their results (and deadlines) now; their
        gates are free; the counters are added."""
        rows = [(i.uuid, i.deadline, i.gate or "") for i in items]

        def commit(conn: sqlite3.Connection) -> None:
            conn.executemany("DELETE FROM unpushed WHERE task_uuid = ?", [(u,) for u, _, _ in rows])
            conn.executemany("UPDATE ledger SET deadline = ? WHERE task_uuid = ?",
                             [(d, u) for u, d, _ in rows if d is not None])
            conn.executemany("DELETE FROM gates WHERE gate = ? AND task_uuid = ?",
                             [(g, u) for u, _, g in rows if g])
            if counters:
                conn.executemany(
                    "INSERT INTO counters(outbound, field, value) VALUES (?, ?, ?)"
                    " ON CONFLICT(outbound, field) DO UPDATE SET value = value + excluded.value",
                    list(counters))

        await self._db.transaction(commit)

    async def intake_abort(self, items: Sequence[Intake], *, release: bool) -> None:
        """``items`` were not pushed: forget their records. ``release``: their gates were
        (or may have been) admitted by the frontier, so the next task for the same URL
        takes the gate over and is pushed; else the gates go."""

        def abort(conn: sqlite3.Connection) -> None:
            for item in items:
                if conn.execute("DELETE FROM unpushed WHERE task_uuid = ?",
                                (item.uuid,)).rowcount:
                    conn.execute("DELETE FROM ledger WHERE task_uuid = ?", (item.uuid,))
                if item.gate:
                    if release:
                        conn.execute("UPDATE gates SET task_uuid = '' WHERE gate = ?"
                                     " AND task_uuid = ?", (item.gate, item.uuid))
                    else:
                        conn.execute("DELETE FROM gates WHERE gate = ? AND task_uuid = ?",
                                     (item.gate, item.uuid))

        await self._db.transaction(abort)

    async def intake_claim(self, now: float, dead_before: float, owner: str,
                           limit: int = 500) -> list[Intake]:
        """Unpushed records whose owner has not beaten since ``dead_before`` (its process
        died), made ``owner``'s; ``owner`` beats."""

        def claim(conn: sqlite3.Connection) -> list[tuple[str, int]]:
            conn.execute("INSERT OR REPLACE INTO alive(instance, at) VALUES (?, ?)",
                         (owner, now))
            conn.execute("DELETE FROM alive WHERE at < ?", (dead_before - 3600,))
            rows = conn.execute(
                "SELECT u.task_uuid, l.entry, (SELECT max(inherited) FROM gates AS g"
                " WHERE g.task_uuid = u.task_uuid) FROM unpushed AS u LEFT JOIN ledger AS l"
                " ON l.task_uuid = u.task_uuid LEFT JOIN alive AS a ON a.instance = u.owner"
                " WHERE a.at IS NULL OR a.at < ? ORDER BY u.since LIMIT ?",
                (dead_before, limit)).fetchall()
            conn.executemany("DELETE FROM unpushed WHERE task_uuid = ?",
                             [(u,) for u, raw, _ in rows if raw is None])
            conn.executemany("UPDATE unpushed SET since = ?, owner = ? WHERE task_uuid = ?",
                             [(now, owner, u) for u, raw, _ in rows if raw is not None])
            return [(raw, inherited) for _, raw, inherited in rows if raw is not None]

        out = []
        for raw, inherited in await self._db.transaction(claim):
            intake = Intake.loads(raw)
            intake.inherited = bool(inherited)
            out.append(intake)
        return out
