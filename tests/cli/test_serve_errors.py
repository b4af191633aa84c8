"""``crawlhub serve`` reports a config it cannot run the way ``check-config`` does: the
same clean error, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.servers import free_port

from .conftest import write_yaml
from .serving import crawlhub_command


def crawlhub(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*crawlhub_command(), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_serve_reports_a_class_that_does_not_import_like_check_config(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "bad.yaml", {
        "data_dir": str(tmp_path / "data"),
        "outbound": [{"name": "a", "class": "nosuchpkg.mod:Thing", "init": {"key": "a"}}]})
    checked = crawlhub("check-config", str(config), cwd=tmp_path)
    served = crawlhub("serve", "-c", str(config), "--port", str(free_port()), cwd=tmp_path)
    assert checked.returncode == served.returncode == 2
    assert "Traceback" not in served.stderr
    message = ("config error\nfile bad.yaml, entry outbound[0] 'a', key 'class': cannot import"
               " module 'nosuchpkg.mod' for 'nosuchpkg.mod:Thing'")
    assert checked.stderr.startswith(message)
    assert served.stderr.strip().endswith(checked.stderr.strip())
    assert "Started server process" not in served.stderr  # refused before uvicorn starts
