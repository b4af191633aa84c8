"""``crawlhub queues``, ``lease``, ``ack`` and ``nack`` on the configured queue backend:
the built-in config with ``--data-dir`` (SQLite), or a config file naming Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from crawlhub.config import default_config
from crawlhub.queues import open_backend

from .conftest import Cli, one_line, table_rows, write_yaml


def push(url: str, prefix: str, queue: str, payloads: list[dict[str, Any]]) -> None:
    async def go() -> None:
        backend = open_backend(url, prefix=prefix)
        try:
            await backend.queue(queue).push_many([(p, 0) for p in payloads])
        finally:
            await backend.close()

    asyncio.run(go())


@pytest.fixture(params=["sqlite", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path, unique_name: str
          ) -> Iterator[tuple[list[str], str, str]]:
    """(CLI options naming the storage, queue URL, key prefix) on each backend."""
    if request.param == "sqlite":
        data_dir = tmp_path / "data"
        yield (["--data-dir", str(data_dir)], default_config(data_dir).storage.queues,
               "crawlhub:")
        return
    url = request.getfixturevalue("redis_url")
    prefix = f"{unique_name}:"
    config = write_yaml(tmp_path / "redis.yaml", {
        "data_dir": str(tmp_path / "data"),
        "storage": {"queues": url, "state": url, "redis_prefix": prefix}})
    yield ["-c", str(config)], url, prefix
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=500))
    if keys:
        client.delete(*keys)
    client.close()


def leased(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_lease_ack_and_nack_round_trip(cli: Cli, where: tuple[list[str], str, str]) -> None:
    opts, url, prefix = where
    push(url, prefix, "jobs", [{"n": i} for i in range(3)])
    first = leased(cli("lease", "jobs", "-n", "2", *opts).stdout)
    assert [(m["payload"], m["attempts"]) for m in first] == [({"n": 0}, 1), ({"n": 1}, 1)]
    ack = cli("ack", "jobs", first[0]["id"], *opts)
    assert ack.exit_code == 0 and ack.stdout.strip() == "acked 1 of 1"
    nack = cli("nack", "jobs", first[1]["id"], *opts)
    assert nack.exit_code == 0 and nack.stdout.strip() == "nacked 1 of 1"
    second = leased(cli("lease", "jobs", "-n", "10", *opts).stdout)
    assert sorted((m["payload"]["n"], m["attempts"]) for m in second) == [(1, 2), (2, 1)]
    dead = cli("nack", "jobs", "--dead", *(m["id"] for m in second), *opts)
    assert dead.stdout.strip() == "nacked 2 of 2"
    assert cli("lease", "jobs", *opts).stdout.strip() == ""


def test_finishing_an_id_that_is_not_leased_exits_1(cli: Cli,
                                                    where: tuple[list[str], str, str]) -> None:
    opts, url, prefix = where
    push(url, prefix, "jobs", [{"n": 1}])
    result = cli("ack", "jobs", "424242", *opts)
    assert result.exit_code == 1 and result.stdout.strip() == "acked 0 of 1"
    assert cli("nack", "jobs", "424242", *opts).exit_code == 1


def test_queues_shows_every_queue_with_its_counters(cli: Cli,
                                                    where: tuple[list[str], str, str]) -> None:
    opts, url, prefix = where
    long_name = "zongju_captcha_ts3_backlog"
    push(url, prefix, "jobs", [{"n": i} for i in range(3)])
    push(url, prefix, long_name, [{"n": 0}])
    [message] = leased(cli("lease", "jobs", *opts).stdout)
    cli("ack", "jobs", message["id"], *opts)
    result = cli("queues", *opts)
    assert result.exit_code == 0
    rows = table_rows(result.stdout)
    # columns: total, left, ready, leased, success, failed, retried, dead, max_attempts
    assert rows["jobs"] == ["3", "2", "2", "0", "1", "0", "0", "0", "10"]
    assert rows[long_name] == ["1", "1", "1", "0", "0", "0", "0", "0", "10"]


def test_the_queues_table_fits_80_columns_with_whole_headers_and_names(
        cli: Cli, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    push(default_config(data_dir).storage.queues, "crawlhub:", "default", [{"n": 1}])
    result = cli("queues", "--data-dir", str(data_dir))
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    header = next(line for line in result.stdout.splitlines() if "name" in line)
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "name", "total", "left", "ready", "leased", "success", "failed", "retried", "dead", "max"]
    assert "default" in table_rows(result.stdout)
    assert "max: max_attempts" in result.stdout


def test_the_redis_prefix_of_the_config_is_where_the_cli_looks(
        cli: Cli, tmp_path: Path, redis_url: str, unique_name: str) -> None:
    config = write_yaml(tmp_path / "other.yaml", {
        "storage": {"queues": redis_url, "state": redis_url,
                    "redis_prefix": f"{unique_name}-elsewhere:"}})
    push(redis_url, f"{unique_name}:", "jobs", [{"n": 1}])
    try:
        assert cli("lease", "jobs", "-c", str(config)).stdout.strip() == ""
    finally:
        client = redis.Redis.from_url(redis_url)
        for pattern in (f"{unique_name}:*", f"{unique_name}-elsewhere:*"):
            keys = list(client.scan_iter(match=pattern))
            if keys:
                client.delete(*keys)
        client.close()


def test_a_bad_config_exits_2_before_touching_any_queue(cli: Cli, tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "bad.yaml", {"storage": {"queues": "mysql://x"}})
    result = cli("lease", "jobs", "-c", str(config))
    assert result.exit_code == 2
    assert "storage" in one_line(result.stderr) and "queues" in one_line(result.stderr)


def test_an_invalid_queue_name_is_a_message_and_exit_1(cli: Cli, tmp_path: Path) -> None:
    for command in (["lease", "a b"], ["ack", "a b", "1"], ["nack", "{x}", "1"]):
        result = cli(*command, "--data-dir", str(tmp_path / "data"))
        assert result.exit_code == 1
        assert "queue name" in one_line(result.stderr)
        assert "Traceback" not in result.stderr


def test_an_unreachable_backend_is_a_message_naming_it_and_exit_1(cli: Cli,
                                                                  tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "down.yaml", {
        "storage": {"queues": "redis://127.0.0.1:1/0", "state": "redis://127.0.0.1:1/0"}})
    result = cli("queues", "-c", str(config))
    assert result.exit_code == 1
    assert "redis://127.0.0.1:1/0" in one_line(result.stderr)
