"""build_sink: a ``sink:`` mapping from YAML becomes the right sink, or a ConfigError
that names the entry and the key."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from crawlhub.core.errors import ConfigError
from crawlhub.sinks import JsonlSink, KafkaSink, PostgresSink, RedisStreamSink, SqliteSink
from crawlhub.sinks.base import BatchResult
from crawlhub.sinks.config import build_sink


class ListSink:
    """A user sink by import path: keeps what it is given."""

    def __init__(self, name: str = "list", label: str = "") -> None:
        self.name = name
        self.label = label
        self.rows: list[dict[str, Any]] = []

    async def open(self) -> None: ...

    async def write_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        self.rows.extend(records)
        return BatchResult(inserted=len(records))

    async def close(self) -> None: ...


def test_each_type_builds_its_sink() -> None:
    settings = {
        "data_dir": "/data",
        "redis_url": "redis://r:6379/0",
        "postgres_url": "postgresql+asyncpg://u@p/db",
        "kafka_bootstrap_servers": "k:9092",
    }
    jsonl = build_sink({"type": "jsonl"}, config=settings, name="shops")
    assert isinstance(jsonl, JsonlSink) and jsonl.path == Path("/data/sinks/shops.jsonl")
    pg = build_sink({"type": "postgres", "table": "t"}, config=settings)
    assert isinstance(pg, PostgresSink) and pg.config.url == "postgresql://u@p/db"
    rs = build_sink({"type": "redis_stream", "stream": "s"}, config=settings)
    assert isinstance(rs, RedisStreamSink) and rs.config.url == "redis://r:6379/0"
    kafka = build_sink({"type": "kafka", "topic": "t"}, config=settings)
    assert isinstance(kafka, KafkaSink) and kafka.config.bootstrap_servers == "k:9092"
    lite = build_sink({"type": "sqlite"}, config=settings, name="shops")
    assert isinstance(lite, SqliteSink) and lite.path == Path("/data/sinks/shops.db")


def test_a_sqlite_table_name_sql_could_misread_is_refused() -> None:
    for table in ("no such", 'a"b', "x;drop table y", "1st"):
        with pytest.raises(ConfigError) as info:
            build_sink({"type": "sqlite", "path": "/tmp/items.db", "table": table})
        assert info.value.key == "table"


def test_jsonl_is_the_default_type_and_relative_paths_sit_in_the_data_dir(tmp_path: Path) -> None:
    sink = build_sink({"path": "out/items.jsonl"}, config={"data_dir": str(tmp_path)})
    assert isinstance(sink, JsonlSink) and sink.path == tmp_path / "out/items.jsonl"


def test_user_sink_by_import_path_gets_the_other_keys() -> None:
    sink = build_sink({"type": "tests.sinks.test_build_sink:ListSink", "label": "x"})
    assert isinstance(sink, ListSink) and sink.label == "x"


def test_unknown_type_names_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown sink type 'mongo'") as info:
        build_sink({"type": "mongo"})
    assert info.value.key == "type"


def test_bad_value_names_the_sink_and_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        build_sink({"type": "redis_stream", "name": "out", "url": "redis://x", "stream": "s",
                    "maxlen": 0})
    assert (info.value.entry, info.value.key) == ("sink 'out'", "maxlen")


def test_missing_connection_says_which_setting_fills_it() -> None:
    with pytest.raises(ConfigError, match="postgres_url") as info:
        build_sink({"type": "postgres", "table": "t"})
    assert info.value.key == "url"


def test_unknown_key_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        build_sink({"type": "jsonl", "path": "x.jsonl", "flush": True})
    assert info.value.key == "flush"


def test_several_postgres_tables_need_a_route_field() -> None:
    with pytest.raises(ConfigError, match="route_field"):
        build_sink({"type": "postgres", "url": "postgresql://x/y",
                    "tables": [{"table": "a"}, {"table": "b"}]})


def test_tables_inherit_the_top_level_key_unless_they_set_their_own() -> None:
    sink = build_sink({"type": "postgres", "url": "postgresql://x/y", "key": "sku",
                       "route_field": "_t", "tables": [{"table": "a"}, {"table": "b", "key": "id"}]})
    assert isinstance(sink, PostgresSink)
    assert [t.key for t in sink.config.tables] == [["sku"], ["id"]]


def test_import_path_that_is_not_a_sink_is_refused() -> None:
    with pytest.raises(ConfigError, match="not a sink"):
        build_sink({"type": "pathlib:PurePath"})
