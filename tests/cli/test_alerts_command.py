"""``crawlhub alerts``: add (the URL from stdin), list, test against a real webhook
receiver, deliveries and remove on the embedded control database; refusals exit non-zero
with the reason."""

from __future__ import annotations

import json
from pathlib import Path

from tests.control.alert_targets import TOKEN, ThreadedReceiver

from .conftest import Cli, one_line, table_rows


def test_a_route_is_added_listed_tested_and_removed(cli: Cli, tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    with ThreadedReceiver().running() as receiver:
        added = cli("alerts", "add", "shop-slack", "--webhook", "-", "--job", "shop-*",
                    "--event", "run_failed", "--event", "run_over_time", *where,
                    input=receiver.url() + "\n")
        assert added.exit_code == 0, added.stderr
        assert one_line(added.stdout) == (f"alert route shop-slack: webhook to"
                                          f" http://127.0.0.1:{receiver.port}/***")

        listed = cli("alerts", "list", *where)
        row = table_rows(listed.stdout)["shop-slack"]
        assert row[0] == "webhook" and "shop-*" in row and row[-1] == "yes"
        assert TOKEN not in listed.stdout
        [route] = json.loads(cli("alerts", "list", "--json", *where).stdout)
        assert route["jobs"] == ["shop-*"] and TOKEN not in json.dumps(route)

        tested = cli("alerts", "test", "shop-slack", *where)
        assert tested.exit_code == 0 and tested.stdout.startswith("sent: HTTP 200")
        [hit] = receiver.hits
        assert hit.body["crawlhub"]["event"] == "test"

    [delivery] = json.loads(cli("alerts", "deliveries", "--json", *where).stdout)
    assert (delivery["route"], delivery["event"], delivery["status"]) == (
        "shop-slack", "test", "sent")
    assert cli("alerts", "remove", "shop-slack", *where).exit_code == 0
    assert json.loads(cli("alerts", "list", "--json", *where).stdout) == []
    again = cli("alerts", "remove", "shop-slack", *where)
    assert again.exit_code == 1 and "no alert route 'shop-slack'" in one_line(again.stderr)


def test_a_test_to_an_unreachable_target_exits_1_with_the_reason(cli: Cli,
                                                                 tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    receiver = ThreadedReceiver()  # bound, never serving: closed below
    url = receiver.url()
    receiver.server.server_close()
    assert cli("alerts", "add", "down", "--webhook", url, *where).exit_code == 0

    tested = cli("alerts", "test", "down", *where)

    assert tested.exit_code == 1
    assert one_line(tested.stderr).startswith(f"failed: cannot connect to"
                                              f" http://127.0.0.1:{receiver.port}/***")


def test_bad_routes_are_refused_with_the_reason(cli: Cli, tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    gopher = cli("alerts", "add", "x", "--webhook", "gopher://127.0.0.1:70/_x", *where)
    assert gopher.exit_code == 1
    assert "must start with https:// or http://, not gopher://" in one_line(gopher.stderr)
    mail = cli("alerts", "add", "x", "--email", "ops@example.com\nBcc: a@b.c", *where)
    assert mail.exit_code == 1 and "an email address looks like" in one_line(mail.stderr)
    neither = cli("alerts", "add", "x", *where)
    assert neither.exit_code == 2 and "either --webhook URL or --email" in neither.stderr
    event = cli("alerts", "add", "x", "--email", "ops@example.com", "--event", "boom", *where)
    assert event.exit_code == 1 and "events.0" in event.stderr
    assert json.loads(cli("alerts", "list", "--json", *where).stdout) == []


def test_an_email_route_is_listed_with_its_addresses(cli: Cli, tmp_path: Path) -> None:
    where = ["--data-dir", str(tmp_path / "data")]
    added = cli("alerts", "add", "ops", "--email", "ops@example.com", "--email",
                "dev@example.com", "--event", "agent_dead", "--disabled", *where)
    assert added.exit_code == 0, added.stderr

    [route] = json.loads(cli("alerts", "list", "--json", *where).stdout)
    assert (route["kind"], route["to"], route["events"], route["enabled"]) == (
        "email", ["ops@example.com", "dev@example.com"], ["agent_dead"], False)
