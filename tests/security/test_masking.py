"""Secrets in error messages (issue 19.10): every error that quotes a URL masks its
password and secret query values - ``crawlhub check-config``'s errors for an invalid
``storage.*``, ``control.url`` or ``control.channel``, every other URL-valued key, URL
parse errors and the API's 4xx bodies."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest
import yaml
from typer.testing import CliRunner

from crawlhub.app.asgi import create_app
from crawlhub.backends.backend import Backend
from crawlhub.cli import app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.errors import ConfigError, CrawlhubError, SinkError
from crawlhub.services import Services

SECRETS = ("hunter2", "hunter3")
#: An invalid scheme, a URL password and a secret query value
BAD = "bogus://user:hunter2@db.example/x?password=hunter3"


def assert_masked(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown in:\n{text}"


def test_check_config_errors_of_storage_and_control_urls_show_no_password(
        tmp_path: Path) -> None:
    path = tmp_path / "crawlhub.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path),
        "storage": {"queues": "mysql://user:hunter2@db.example/q?password=hunter3",
                    "state": "redis2://:hunter2@h/0?token=hunter3",
                    "metadata": "oracle://u:hunter2@h/x?password=hunter3",
                    "frontier": BAD, "agents": BAD},
        "control": {"url": "ftp://u:hunter2@h/x?password=hunter3",
                    "channel": "amqp://u:hunter2@h/x?password=hunter3"},
    }))
    done = subprocess.run([sys.executable, "-m", "crawlhub", "check-config", str(path)],
                          capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert_masked(out)
    for key in ("'queues'", "'state'", "'metadata'", "'frontier'", "'agents'",
                "entry control, key 'url'", "entry control, key 'channel'"):
        assert key in out
    assert "user:***@db.example/q?password=***" in out  # masked, not dropped


#: Every URL-valued config key with an invalid value holding a password (one file each:
#: some keys are checked only once the keys before them are valid).
URL_KEYS = {
    "storage.queues": {"storage": {"queues": BAD}},
    "storage.state": {"storage": {"state": BAD}},
    "storage.metadata": {"storage": {"metadata": BAD}},
    "storage.frontier": {"storage": {"frontier": BAD}},
    "storage.agents": {"storage": {"agents": BAD}},
    "storage.queues with '/' in the password": {
        "storage": {"queues": "redis://:hunter2/hunter3@h/0"}},
    "storage.queues with a bad port": {"storage": {"queues": "redis://:hunter2@h:99999/0"}},
    "control.url": {"control": {"url": BAD}},
    "control.logs_url": {"control": {"logs_url": BAD}},
    "control.channel": {"control": {"channel": BAD}},
    "control.smtp_url": {"control": {"smtp_url": BAD}},
    "center.url": {"center": {"url": BAD}},
    "outbound init.url": {"outbound": [{"name": "o", "class": "redis_list",
                                        "init": {"url": BAD, "key": "k"}}]},
    "inbound init.url": {"inbound": [{"name": "i", "class": "redis",
                                      "init": {"url": BAD, "key": "k"}}]},
    "jobs source.url": {"jobs": [{"name": "j", "source": {"url": BAD}}]},
    "jobs detail.url": {"jobs": [{"name": "j", "source": {"url": "http://h/x"},
                                  "detail": {"enabled": True, "url": BAD + "&id={{id}}"}}]},
    "jobs sink.url (postgres)": {"jobs": [{"name": "j", "source": {"url": "http://h/x"},
                                           "sink": {"type": "postgres", "url": BAD,
                                                    "table": "t"}}]},
    "jobs sink.url (redis_stream)": {"jobs": [{"name": "j", "source": {"url": "http://h/x"},
                                               "sink": {"type": "redis_stream", "url": BAD,
                                                        "stream": "s"}}]},
    "a YAML error on the URL's line": "storage:\n  queues: '" + BAD + "'\n  state: [oops\n",
}


@pytest.mark.parametrize("where", URL_KEYS)
def test_no_invalid_url_valued_key_shows_its_password_in_check_config(
        tmp_path: Path, where: str) -> None:
    content = URL_KEYS[where]
    path = tmp_path / "crawlhub.yaml"
    path.write_text(content if isinstance(content, str) else
                    yaml.safe_dump({"data_dir": str(tmp_path), **content}))
    result = CliRunner().invoke(app, ["check-config", str(path)])
    assert_masked(result.output)


@pytest.mark.parametrize("url", [BAD, "redis://:hunter2/hunter3@h/0",
                                 "redis://:hunter2@h:port/0", "redis://u:hunter2@h/db?password=hunter3",
                                 "postgresql://u:hunter2@h:5432/db?sslpassword=hunter3&x=1"])
def test_backend_url_errors_mask_the_password_whatever_is_wrong(url: str) -> None:
    try:
        Backend.parse(url, key="storage.queues")
    except ConfigError as exc:
        assert_masked(str(exc))
        assert_masked(exc.reason)
    else:
        assert url.startswith("postgresql://")
        assert_masked(Backend.parse(url).redacted)


def test_every_crawlhub_error_masks_the_urls_in_its_message() -> None:
    assert_masked(str(SinkError(f"sink 'x': cannot reach {BAD}")))
    assert_masked(str(CrawlhubError(f"failed on {BAD}")))
    error = ConfigError(f"bad value {{'password': 'hunter2', 'url': '{BAD}'}}", key="k")
    assert_masked(str(error))
    assert_masked(error.reason)


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx2.AsyncClient]:
    config = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "inbound": [{"name": "http", "class": "http"}],
        "outbound": [{"name": "default", "init": {"key": "default"}}]})
    services = await Services.open(config)
    transport = httpx2.ASGITransport(app=create_app(services=services),
                                     raise_app_exceptions=False)
    async with httpx2.AsyncClient(transport=transport, base_url="http://crawlhub.test") as c:
        yield c
    await services.close()


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("post", "/jobs/", {"name": "j", "command": ["x"], "cron": BAD}, 422),
    ("post", "/projects/", {"name": "p", "git_url": BAD}, 422),
    ("post", "/alerts/", {"name": "a", "kind": "webhook", "url": BAD}, 422),
    ("post", "/task/", {"url": "http://h/", "extract": {"fields": {"x": {"css": BAD}}}}, 422),
    ("post", "/task/", {"url": "http://h/", "extract": {"links": {"allow": [BAD + "(?=x)"]}}},
     422),
    ("get", "/jobs/" + BAD.replace("?", "%3F"), None, 404),
    ("get", "/no/such/" + BAD.replace("?", "%3F"), None, 404),
])
async def test_api_error_bodies_show_no_password(
        client: httpx2.AsyncClient, method: str, path: str, body: object,
        status: int) -> None:
    answer = await (client.post(path, json=body) if method == "post" else client.get(path))
    assert answer.status_code == status, answer.text
    assert_masked(answer.text)
