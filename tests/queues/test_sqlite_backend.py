"""What only the SQLite backend promises: its file, its URL forms and its indexes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from crawlhub.core.errors import ConfigError, QueueError
from crawlhub.queues.sqlite import SqliteQueueBackend


async def test_relative_url_creates_parent_dirs_and_a_wal_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = SqliteQueueBackend("sqlite:///data/deep/queues.db")
    try:
        await backend.queue("jobs").push({"n": 1})
    finally:
        await backend.close()

    db = tmp_path / "data" / "deep" / "queues.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///queues.db", "queues.db"),
        ("sqlite:///data/q.db", "data/q.db"),
        ("sqlite:////var/lib/crawlhub/q.db", "/var/lib/crawlhub/q.db"),
        ("sqlite:///:memory:", ":memory:"),
    ],
)
async def test_url_forms_name_the_file(url: str, path: str) -> None:
    backend = SqliteQueueBackend(url)
    await backend.close()
    assert backend.path == path


@pytest.mark.parametrize("url", ["sqlite:/queues.db", "sqlite:///", "sqlite://host/q.db"])
def test_malformed_url_is_refused_with_the_right_form(url: str) -> None:
    with pytest.raises(ConfigError, match="sqlite:///relative/file.db"):
        SqliteQueueBackend(url)


async def test_in_memory_database_works_for_one_backend() -> None:
    backend = SqliteQueueBackend("sqlite:///:memory:")
    try:
        q = backend.queue("mem")
        await q.push({"n": 1})
        assert [m.payload for m in await q.lease(1)] == [{"n": 1}]
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("sql", "index"),
    [
        (
            "SELECT id FROM queue_messages WHERE queue = 'q' AND state = 0 "
            "ORDER BY priority DESC, id LIMIT 10",
            "queue_messages_ready",
        ),
        (
            "UPDATE queue_messages SET state = 0 "
            "WHERE queue = 'q' AND state = 1 AND lease_until <= 5",
            "queue_messages_leased",
        ),
        (
            "SELECT id FROM queue_messages WHERE queue = 'q' AND state = 2 "
            "ORDER BY dead_seq LIMIT 10",
            "queue_messages_dead",
        ),
    ],
)
async def test_queries_walk_an_index_not_the_table(tmp_path: Path, sql: str, index: str) -> None:
    backend = SqliteQueueBackend(f"sqlite:///{tmp_path}/q.db")
    try:
        await backend.queue("q").push({"n": 1})
    finally:
        await backend.close()

    with sqlite3.connect(tmp_path / "q.db") as conn:
        plan = " ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
    assert f"USING INDEX {index}" in plan
    assert "TEMP B-TREE" not in plan


async def test_use_after_close_raises_queue_error(tmp_path: Path) -> None:
    backend = SqliteQueueBackend(f"sqlite:///{tmp_path}/q.db")
    await backend.close()

    with pytest.raises(QueueError, match="after close"):
        await backend.queue("q").length()


async def test_a_pushed_batch_is_invisible_to_readers_until_its_single_commit(
    tmp_path: Path,
) -> None:
    # Deterministic: before every statement of the push (trace callback), another
    # connection counts the queue; it must see nothing until the one COMMIT has run.
    path = tmp_path / "q.db"
    backend = SqliteQueueBackend(f"sqlite:///{path}")
    seen: list[tuple[str, int]] = []
    try:
        await backend.queue("q").push({"n": "warm-up"})
        reader = sqlite3.connect(path, check_same_thread=False)

        def probe(statement: str) -> None:
            count = reader.execute(
                "SELECT COUNT(*) FROM queue_messages WHERE queue = 'q' AND state = 0"
            ).fetchone()[0]
            seen.append((statement.split()[0].upper(), count))

        await backend.run("trace", lambda conn: conn.set_trace_callback(probe))
        await backend.queue("q").push_many([({"n": i}, 0) for i in range(500)])
        await backend.run("untrace", lambda conn: conn.set_trace_callback(None))
        after = reader.execute("SELECT COUNT(*) FROM queue_messages WHERE queue = 'q'").fetchone()
        reader.close()
    finally:
        await backend.close()
    verbs = [verb for verb, _ in seen]
    assert verbs.count("BEGIN") == 1 and verbs.count("COMMIT") == 1
    assert verbs.index("BEGIN") < verbs.index("INSERT") < verbs.index("COMMIT")
    assert {count for _, count in seen} == {1}  # only the warm-up, up to and at the COMMIT
    assert after == (501,)
