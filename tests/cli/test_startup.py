"""Start-up stays cheap: a command imports what it uses and no more. Checked by the
modules a fresh interpreter holds after the command, never by timing (bench/startup.py
times it)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

#: What no help listing, and no crawl, may import: the web stack, the browser, the
#: crypto of the control plane, the config models.
HEAVY = ("fastapi", "starlette", "uvicorn", "jinja2", "cryptography", "playwright")

_PROBE = """
import json, sys
sys.argv = {argv!r}
from crawlhub.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after(*argv: str) -> set[str]:
    """The modules imported by ``crawlhub <argv>`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _PROBE.format(argv=["crawlhub", *argv])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_importing_the_cli_imports_no_command_no_config_and_no_web_stack() -> None:
    done = subprocess.run([sys.executable, "-c", "import json, sys, crawlhub.cli;"
                           " print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert heavy(modules) == []
    assert sorted(m for m in modules if m.startswith("crawlhub.")) == [
        "crawlhub.cli", "crawlhub.core", "crawlhub.core.errors", "crawlhub.core.jsoncodec"]
    assert not {"pydantic", "yaml", "aiohttp", "redis", "asyncio"} & modules


def test_help_lists_every_command_without_importing_any() -> None:
    modules = loaded_after("--help")
    assert heavy(modules) == []
    assert "asyncio" not in modules  # a listing runs nothing: no event loop
    assert not [m for m in modules if m.startswith(("crawlhub.cli.", "crawlhub.config"))]


def test_crawl_help_imports_only_the_crawl_command() -> None:
    modules = loaded_after("crawl", "--help")
    assert heavy(modules) == []
    assert [m for m in modules if m.startswith("crawlhub.cli.")] == ["crawlhub.cli.crawl"]
    assert not {"crawlhub.config", "crawlhub.app.crawl", "aiohttp", "yaml"} & modules


def test_reading_a_config_imports_no_http_client_no_parser_and_no_crypto() -> None:
    # the config models live apart from the code that uses them: crawlhub.config composes
    # them without the downloader (aiohttp), the extraction (lxml), the collect runner,
    # the pipeline or the secrets' cryptography
    done = subprocess.run([sys.executable, "-c", "import json, sys\n"
                           "from crawlhub.config import default_config\n"
                           "default_config(None)\n"
                           "print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert heavy(modules) == []
    assert not {"aiohttp", "lxml", "crawlhub.agents.downloader", "crawlhub.agents.extract",
                "crawlhub.collect.runner", "crawlhub.pipeline.run", "crawlhub.sinks.base",
                "crawlhub.center.center", "crawlhub.frontier.manager"} & modules


_SERVE_PROBE = """
import json, sys, tempfile
from fastapi.testclient import TestClient
from crawlhub.cli import _check_hub, get_config
from crawlhub.app.asgi import create_app
from pathlib import Path

cfg = get_config(None, Path(tempfile.mkdtemp()), None)
_check_hub(cfg)
with TestClient(create_app(cfg), base_url="http://127.0.0.1") as client:
    assert client.get("/healthz").status_code == 200
    served = sorted(sys.modules)
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower(), page.status_code
print(json.dumps([served, sorted(sys.modules)]))
"""


def test_serving_the_api_imports_no_template_engine_crypto_or_http_client_until_used() -> None:
    # serve's start-up: the app of the built-in config, started (its services open) and
    # answering /healthz, has imported no Jinja2 (the web page's, imported for the first
    # page), no Fernet (the secrets', imported for the first secret; redis's client
    # imports the cryptography package itself, to see whether it is there), no aiohttp,
    # lxml or collect runner (a collect job's, imported when one runs)
    done = subprocess.run([sys.executable, "-c", _SERVE_PROBE], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    served, after_page = (set(names) for names in json.loads(done.stdout.splitlines()[-1]))
    assert not {"jinja2", "cryptography.fernet", "aiohttp", "lxml", "playwright",
                "crawlhub.collect.runner", "crawlhub.pipeline.run",
                "crawlhub.agents.downloader"} & served
    # nor, on the embedded default, a Redis or PostgreSQL client (its 503 answers for
    # their outages are registered only for a config that names them)
    assert not {"redis", "asyncpg"} & served
    assert "jinja2" in after_page  # the page itself still renders, with its templates


class _Page(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = b"<html><head><title>one</title></head><body><p>hello</p></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_crawl_imports_no_web_stack_and_opens_no_control_plane(site: str,
                                                                  tmp_path: Path) -> None:
    # the one-process crawl runs no jobs, builds or alerts: it imports none of their
    # modules, and leaves no control database or secret key in its data dir
    data = tmp_path / "data"
    out = tmp_path / "items.jsonl"
    modules = loaded_after("crawl", site, "--quiet", "--no-robots", "--out", str(out),
                           "--data-dir", str(data))
    assert out.exists() and (data / "frontier.db").exists()  # it did crawl
    assert not [m for m in modules if m.split(".")[0] in HEAVY[:4]]  # no web stack
    assert sorted({"crawlhub.control.builds", "crawlhub.control.alerts", "crawlhub.control.jobs",
                   "crawlhub.control.projects", "cryptography.fernet"} & modules) == []
    assert not (data / "secret.key").exists() and not (data / "control.db").exists()


_DEFERRED = """
import json
import crawlhub.app.asgi
from fastapi.openapi import models
from pydantic import BaseModel
from pydantic._internal._config import config_defaults
class Later(BaseModel):
    n: int
before = models.OpenAPI.__pydantic_complete__
made = models.OpenAPI(openapi="3.1.0", info={"title": "t", "version": "1"}, paths={})
print(json.dumps([before, config_defaults["defer_build"], Later.__pydantic_complete__,
                  models.OpenAPI.__pydantic_complete__, made.model_dump(exclude_none=True)]))
"""


def test_serve_imports_fastapi_with_its_openapi_models_unbuilt_until_used() -> None:
    """The app imports FastAPI with the OpenAPI document's models unbuilt (built where
    first used: /openapi.json), and pydantic's default is back for every model after."""
    done = subprocess.run([sys.executable, "-c", _DEFERRED], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    before, default, later, after, dumped = json.loads(done.stdout.strip().splitlines()[-1])
    assert before is False and after is True
    assert default is False and later is True
    assert dumped == {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}}
