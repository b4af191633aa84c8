"""``crawlhub serve`` will not put a server that runs commands on an address other machines
reach without a token, unless the config says so in words; ``check-config`` warns; a
token is long enough not to be guessed.

The address served is 192.0.2.1 (TEST-NET-1, never this machine's): were the refusal
missing, uvicorn could not bind it and nothing is ever exposed by the test."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from crawlhub.config import ConfigError, load_config
from crawlhub.config.schema import ServerConfig
from crawlhub.core.hosts import is_loopback
from tests.cli.serving import crawlhub_command
from tests.servers import free_port

ELSEWHERE = "192.0.2.1"


def crawlhub(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*crawlhub_command(), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def write(tmp_path: Path, **server: Any) -> Path:
    path = tmp_path / "main.yaml"
    path.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "server": server}))
    return path


def test_serve_refuses_a_reachable_address_without_a_token(tmp_path: Path) -> None:
    config = write(tmp_path, bind=ELSEWHERE, port=free_port())
    served = crawlhub("serve", "-c", str(config), cwd=tmp_path)
    assert served.returncode == 2, served.stderr
    assert "config error" in served.stderr and "Traceback" not in served.stderr
    assert f"server.bind is '{ELSEWHERE}'" in served.stderr
    assert "server.token" in served.stderr and "insecure_no_token" in served.stderr
    assert "Started server process" not in served.stderr
    # the same with the address given on the command line
    on_cli = crawlhub("serve", "-c", str(write(tmp_path)), "--bind", "0.0.0.0",
                      "--port", str(free_port()), cwd=tmp_path)
    # (--bind 0.0.0.0 is refused before anything binds: the check runs first)
    assert on_cli.returncode == 2 and "server.bind is '0.0.0.0'" in on_cli.stderr


def test_check_config_warns_of_it_and_still_prints_the_config(tmp_path: Path) -> None:
    checked = crawlhub("check-config", str(write(tmp_path, bind=ELSEWHERE)), cwd=tmp_path)
    assert checked.returncode == 0
    assert checked.stderr.startswith("warning")
    assert "'crawlhub serve' refuses this config" in checked.stderr
    assert yaml.safe_load(checked.stdout)["server"]["bind"] == ELSEWHERE


def test_saying_so_in_words_serves_it_with_a_warning(tmp_path: Path) -> None:
    config = write(tmp_path, bind=ELSEWHERE, port=free_port(), insecure_no_token=True)
    checked = crawlhub("check-config", str(config), cwd=tmp_path)
    assert checked.returncode == 0 and "insecure_no_token is set" in checked.stderr
    served = crawlhub("serve", "-c", str(config), cwd=tmp_path)
    assert "warning" in served.stderr and "insecure_no_token is set" in served.stderr
    # past the check: uvicorn tried the address (192.0.2.1 is not this machine's)
    assert "config error" not in served.stderr


@pytest.mark.parametrize("bind", ["127.0.0.1", "localhost", "127.8.9.10", "::1", "[::1]"])
def test_loopback_addresses_need_no_token(bind: str) -> None:
    assert is_loopback(bind)
    assert ServerConfig(bind=bind).exposure() is None


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", ELSEWHERE, "myhost", "localhost.example"])
def test_other_addresses_do(bind: str) -> None:
    assert not is_loopback(bind)
    assert ServerConfig(bind=bind).exposure() is not None
    assert ServerConfig(bind=bind, token="x" * 16).exposure() is None


@pytest.mark.parametrize("token", ["Q", "correct-horse15"])
def test_a_short_token_is_refused_without_showing_it(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError, match="use at least 16") as info:
        load_config(write(tmp_path, token=token))
    assert token not in str(info.value)
    assert load_config(write(tmp_path, token="x" * 16)).server.token
