"""``crawlhub frontier key | stats | add`` against real stores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from typer.testing import CliRunner

from crawlhub.cli.frontier import app

runner = CliRunner()


@pytest.fixture
def config_file(tmp_path: Path, storage_url: str, unique_name: str) -> Iterator[Path]:
    path = tmp_path / "crawlhub.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"),
        "storage": {"frontier": storage_url, "redis_prefix": f"{unique_name}:"},
        "frontier": {"news": {"segment": "1d", "snapshot_interval": 0,
                              "key": {"drop_params": ["sid"]}}},
    }))
    yield path
    if storage_url.startswith("redis"):
        client = redis.Redis.from_url(storage_url)
        for key in client.scan_iter(match=f"{unique_name}:*"):
            client.delete(key)
        client.close()


def test_key_shows_the_key_and_why() -> None:
    result = runner.invoke(app, ["key", "HTTP://A.com:80/x?b=1&a=2&utm_source=z#top"])
    assert result.exit_code == 0, result.output
    assert "key:      http://a.com/x?a=2&b=1" in result.output
    assert "default port :80 of http dropped" in result.output
    assert "'utm_source' dropped (volatile_params 'utm_*')" in result.output
    assert "default rules" in result.output


def test_key_uses_the_rules_of_the_configured_frontier(config_file: Path) -> None:
    result = runner.invoke(app, ["key", "http://a.com/?sid=9&q=1", "-c", str(config_file),
                                 "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["key"] == "http://a.com/?q=1" and data["frontier"] == "news"
    assert any("drop_params 'sid'" in step for step in data["steps"])


def test_add_reads_json_lines_and_plain_urls_then_stats_shows_them(
    config_file: Path, tmp_path: Path
) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(
        "http://a.com/1\n"
        '{"url": "http://a.com/1#dup"}\n'
        '{"url": "http://a.com/2", "priority": 3, "meta": {"depth": 1}}\n'
        "\n# a comment\n"
    )
    result = runner.invoke(app, ["add", str(seeds), "--name", "news", "-c", str(config_file)])
    assert result.exit_code == 0, result.output
    assert "read 3, admitted 2, duplicates 1, invalid 0" in result.output
    stats = runner.invoke(app, ["stats", "-c", str(config_file), "--json"])
    assert stats.exit_code == 0, stats.output
    (frontier,) = json.loads(stats.output)
    assert frontier["name"] == "news"
    assert frontier["totals"]["admitted"] == 2 and frontier["totals"]["duplicates"] == 1
    table = runner.invoke(app, ["stats", "-c", str(config_file)])
    assert "admitted" in table.output and "total" in table.output


def test_add_reads_stdin_and_json_arrays(config_file: Path) -> None:
    lines = "".join(f"http://a.com/{i}\n" for i in range(2500))
    result = runner.invoke(app, ["add", "-", "-c", str(config_file)], input=lines)
    assert result.exit_code == 0, result.output
    assert "admitted 2500" in result.output
    array = json.dumps([{"url": "http://a.com/0"}, {"url": "http://a.com/new"}])
    result = runner.invoke(app, ["add", "-c", str(config_file)], input=array)
    assert "read 2, admitted 1, duplicates 1" in result.output


def test_add_reports_bad_lines_and_keeps_going(config_file: Path) -> None:
    text = '{"url": "http://a.com/ok"}\n{"broken\n{"nourl": 1}\nhttp://a.com:99999/\n'
    result = runner.invoke(app, ["add", "-c", str(config_file)], input=text)
    assert result.exit_code == 1
    assert "line 2: not valid JSON" in result.output
    assert "line 3: seed" in result.output and "has no 'url'" in result.output
    assert "http://a.com:99999/" in result.output
    assert "admitted 1" in result.output and "invalid 3" in result.output


def test_an_unknown_frontier_name_is_an_error(config_file: Path) -> None:
    result = runner.invoke(app, ["stats", "-c", str(config_file), "--name", "nope"])
    assert result.exit_code == 2
    assert "no frontier named 'nope'" in result.output


def test_add_refuses_lines_that_are_not_http_urls_with_their_line_numbers(
    config_file: Path,
) -> None:
    text = ("http://a.com/ok\n"
            "not a url\n"
            "ftp://x/y\n"
            '{"url": "javascript:void(0)"}\n'
            "https://b.com/ok\n"
            "http:///no-host\n")
    result = runner.invoke(app, ["add", "-c", str(config_file)], input=text)
    assert result.exit_code == 1
    assert "line 2: 'not a url' is not an http(s) URL" in result.stderr
    assert "line 3: 'ftp://x/y' is not an http(s) URL (scheme 'ftp')" in result.stderr
    assert "line 4: 'javascript:void(0)' is not an http(s) URL" in result.stderr
    assert "line 6: 'http:///no-host' has no host" in result.stderr
    assert "4 invalid (nothing admitted for them)" in result.stderr
    assert "read 2, admitted 2, duplicates 0, invalid 4" in result.stdout
    stats = runner.invoke(app, ["stats", "-c", str(config_file), "--json"])
    (frontier,) = json.loads(stats.stdout)
    assert frontier["totals"]["admitted"] == 2


def test_a_url_the_key_resolver_refuses_is_reported_with_its_line(config_file: Path) -> None:
    result = runner.invoke(app, ["add", "-c", str(config_file)],
                           input="http://a.com/1\nhttp://a.com:99999/\n")
    assert result.exit_code == 1
    assert "line 2: 'http://a.com:99999/' is not a valid URL" in result.stderr
