"""The agent registry in a SQLite file (embedded mode): one table, one transaction per
call; several processes on one machine share the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from crawlhub.agents.registry.base import (
    DEFAULT_DEAD_AFTER,
    DEFAULT_RETENTION,
    AgentInfo,
    AgentStatus,
    Heartbeat,
)
from crawlhub.backends.backend import Backend
from crawlhub.backends.sqlite import SqliteDB
from crawlhub.core import jsoncodec
from crawlhub.core.clock import Clock, system_clock

_SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY,
    info TEXT NOT NULL,
    beat TEXT,
    seen REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS agents_seen ON agents(seen)
"""

Row = tuple[str, str | None, float]


class SqliteAgentRegistry:
    """:class:`~crawlhub.agents.registry.base.AgentRegistry` on one SQLite file."""

    def __init__(self, url: str | Backend, *, dead_after: float = DEFAULT_DEAD_AFTER,
                 retention: float = DEFAULT_RETENTION, clock: Clock = system_clock) -> None:
        self.url = str(url)
        self.dead_after = dead_after
        self.retention = retention
        self.clock = clock
        self._db = SqliteDB(url, schema=_SCHEMA, name=f"agent registry {url}")

    def _status(self, row: Row, now: float) -> AgentStatus:
        info, beat, seen = row
        return AgentStatus(
            info=AgentInfo.from_dict(jsoncodec.loads(info)),
            beat=None if beat is None else Heartbeat.from_dict(jsoncodec.loads(beat)),
            last_seen=float(seen), alive=now - float(seen) < self.dead_after)

    async def register(self, info: AgentInfo, *, at: float | None = None) -> None:
        now = self.clock() if at is None else at
        row = (info.agent_id, jsoncodec.dumps(info.as_dict()), now)
        sql = ("INSERT INTO agents(agent_id, info, beat, seen) VALUES (?, ?, NULL, ?)"
               " ON CONFLICT(agent_id) DO UPDATE SET info = excluded.info, beat = NULL,"
               + (" seen = excluded.seen" if at is None
                  else " seen = MAX(seen, excluded.seen)"))
        await self._db.transaction(lambda conn: conn.execute(sql, row))

    async def heartbeat(self, agent_id: str, beat: Heartbeat) -> bool:
        return (await self.heartbeat_many([(agent_id, beat)]))[0]

    async def heartbeat_many(self, beats: Sequence[tuple[str, Heartbeat]], *,
                             at: Sequence[float] | None = None) -> list[bool]:
        now = self.clock()
        rows = [(agent_id, jsoncodec.dumps(b.as_dict()), now if at is None else float(at[n]))
                for n, (agent_id, b) in enumerate(beats)]

        def _beat(conn: sqlite3.Connection) -> list[bool]:
            # a known agent's row always matches (True); an older stamp changes nothing:
            # the last sign of life never moves back
            return [conn.execute(
                "UPDATE agents SET beat = CASE WHEN ? >= seen THEN ? ELSE beat END,"
                " seen = MAX(seen, ?) WHERE agent_id = ?",
                (seen, beat, seen, agent_id)).rowcount > 0 for agent_id, beat, seen in rows]

        return await self._db.transaction(_beat) if rows else []

    async def unregister(self, agent_id: str) -> bool:
        def _drop(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM agents WHERE agent_id = ?",
                                (agent_id,)).rowcount > 0

        return await self._db.transaction(_drop)

    async def get(self, agent_id: str) -> AgentStatus | None:
        now = self.clock()

        def _get(conn: sqlite3.Connection) -> Row | None:
            return conn.execute("SELECT info, beat, seen FROM agents WHERE agent_id = ?",
                                (agent_id,)).fetchone()

        row = await self._db.run(_get)
        return None if row is None else self._status(row, now)

    async def agents(self) -> list[AgentStatus]:
        now = self.clock()
        cutoff = now - self.dead_after - self.retention

        def _list(conn: sqlite3.Connection) -> list[Row]:
            conn.execute("DELETE FROM agents WHERE seen <= ?", (cutoff,))
            return conn.execute(
                "SELECT info, beat, seen FROM agents ORDER BY agent_id").fetchall()

        return [self._status(row, now) for row in await self._db.transaction(_list)]

    async def live(self) -> list[str]:
        since = self.clock() - self.dead_after

        def _live(conn: sqlite3.Connection) -> list[str]:
            return [r[0] for r in conn.execute(
                "SELECT agent_id FROM agents WHERE seen > ? ORDER BY agent_id", (since,))]

        return await self._db.run(_live)

    async def forget_dead(self) -> int:
        cutoff = self.clock() - self.dead_after - self.retention

        def _forget(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM agents WHERE seen <= ?", (cutoff,)).rowcount

        return await self._db.transaction(_forget)

    async def close(self) -> None:
        await self._db.close()
