"""examples/ run against the demo as written: ``crawlhub collect`` with examples/jobs.yaml
against a ``crawlhub demo`` process, and no example config points at a remote host."""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crawlhub.cli import app
from tests.cli.serving import crawlhub_command
from tests.demo.process import demo_process

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def collect(job: str, demo_url: str, work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*crawlhub_command(), "collect", job, "-c", str(EXAMPLES / "jobs.yaml"),
         "--set", f"demo_url={demo_url}", "--json", "--no-progress",
         "--pipeline-rate-min", "0", "--pipeline-rate-max", "0"],
        cwd=work, capture_output=True, text=True, timeout=240)


def written(path: Path, key: str) -> set[int]:
    return {json.loads(line)[key] for line in path.read_text().splitlines()}


def test_the_news_job_of_examples_collects_the_fresh_news_and_their_details(
        tmp_path: Path) -> None:
    with demo_process("--items", "1000", log=tmp_path / "demo.log") as url:
        done = collect("news", url, tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "SUCCEEDED"
    # 1000 items over 30 days, filter_days 7: about 233 fresh ones, each fetched again
    assert 230 <= result["detail"]["ok"] <= 240 and result["detail"]["failed"] == 0
    ids = written(tmp_path / "crawlhub-data" / "sinks" / "news.jsonl", "id")
    assert 1000 in ids and 766 < min(ids) and 1 not in ids


def test_the_orders_job_of_examples_collects_a_day_of_orders_in_hourly_windows(
        tmp_path: Path) -> None:
    with demo_process(log=tmp_path / "demo.log") as url:
        done = collect("orders", url, tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "SUCCEEDED"
    assert result["requests"]["ok"] >= 24  # one window of 1h per request, a day of them
    ids = sorted(written(tmp_path / "crawlhub-data" / "sinks" / "orders.jsonl", "orderId"))
    assert len(ids) >= 280 and ids == list(range(ids[0], ids[-1] + 1))  # no hole


def test_the_demo_refuses_a_host_that_is_not_loopback() -> None:
    result = CliRunner().invoke(app, ["demo", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error host '0.0.0.0' is not a loopback address: the demo binds only to 127.0.0.1, "
        "::1 or localhost, so it is never reachable from another machine"]


def test_the_demo_on_a_busy_port_says_so_in_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["demo", "--port", str(port)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1:{port}" in lines[0]
    assert "pick another port with --port" in lines[0]


def test_a_bad_latency_option_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(app, ["demo", "--latency", "fast"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error latency 'fast': give seconds (0.05) or a range "
                                     "(0.01-0.2)")


def test_the_broken_example_reports_the_errors_the_readme_shows() -> None:
    result = CliRunner().invoke(app, ["check-config", str(EXAMPLES / "broken.yaml")])
    assert result.exit_code == 2
    readme = (EXAMPLES.parent / "README.md").read_text()
    shown = "$ crawlhub check-config examples/broken.yaml\n" + result.stderr
    assert shown in readme


URL = re.compile(r"\b[a-z][a-z0-9+]*://[^\s'\"]+")


@pytest.mark.parametrize("config", ["jobs.yaml", "minimal.yaml", "taskhub/main.yaml",
                                    "frontier.yaml"])
def test_example_configs_check_and_name_only_loopback_hosts(config: str) -> None:
    result = CliRunner().invoke(app, ["check-config", str(EXAMPLES / config)])
    assert result.exit_code == 0, result.output
    hosts = {m.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1].rsplit(":", 1)[0]
             for m in URL.findall(result.stdout) if not m.startswith("sqlite")}
    assert hosts <= {"127.0.0.1", "localhost"}, hosts


def test_frontier_stats_of_the_example_shows_whole_headers_and_segments(tmp_path: Path) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("http://127.0.0.1:8600/item/1\n"
                    "http://127.0.0.1:8600/item/1?utm_source=newsletter\n"
                    "http://127.0.0.1:8600/item/2#reviews\n")
    opts = ["-c", str(EXAMPLES / "frontier.yaml"), "--data-dir", str(tmp_path / "data")]
    added = CliRunner().invoke(app, ["frontier", "add", str(urls), "--name", "shop", *opts])
    assert added.exit_code == 0, added.output
    stats = CliRunner().invoke(app, ["frontier", "stats", *opts])
    assert stats.exit_code == 0
    lines = stats.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in stats.stdout
    total = next(line for line in lines if line.startswith("│ total"))
    assert [c.strip() for c in total.strip("│").split("│")][1:3] == ["2", "1"]
