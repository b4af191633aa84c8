"""Where the message signing key comes from, what happens without one, and that it never
shows: config first, then the environment, then ``<data dir>/center.key``; never made up."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from crawlhub.center.bus import open_bus
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core import signing
from crawlhub.core.errors import ConfigError
from crawlhub.core.signing import KEY_ENV, Signer, load_key, signer_from_config

KEY = "c" * 40


def config(tmp_path: Path, **center: object) -> CrawlhubConfig:
    return CrawlhubConfig.model_validate({"data_dir": str(tmp_path), "center": center})


def test_the_key_comes_from_config_then_environment_then_the_data_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert load_key(None, tmp_path) is None
    (tmp_path / "center.key").write_text("f" * 40 + "\n")
    assert load_key(None, tmp_path) == b"f" * 40
    monkeypatch.setenv(KEY_ENV, "e" * 40)
    assert load_key(None, tmp_path) == b"e" * 40
    assert load_key(KEY, tmp_path) == KEY.encode()
    assert list(tmp_path.iterdir()) == [tmp_path / "center.key"]  # nothing written


def test_without_a_key_a_redis_fleet_is_warned_once_and_nothing_is_made_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setattr(signing, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="crawlhub.signing"):
        assert signer_from_config(config(tmp_path)) is None
        open_bus("memory://x")
        assert not caplog.records  # in process: nothing to warn about
        assert signer_from_config(config(tmp_path)) is None
        assert not caplog.records  # the bus that opens unsigned says so, not the lookup
        open_bus("redis://:pw@127.0.0.1:6379/0")  # a client; nothing is sent yet
        open_bus("redis://127.0.0.1:6379/0")
    [record] = caplog.records
    assert "NOT signed" in record.getMessage() and "pw" not in record.getMessage()
    assert not (tmp_path / "center.key").exists()


def test_a_configured_key_signs_and_never_shows(tmp_path: Path) -> None:
    cfg = config(tmp_path, key=KEY, max_skew=60)
    signer = signer_from_config(cfg)
    assert signer is not None and signer.max_skew == 60
    assert KEY not in repr(cfg) and KEY not in cfg.model_dump_json()
    assert KEY not in repr(signer)


def test_a_short_key_is_refused_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="at least 32") as caught:
        Signer("short")
    assert "secrets.token_hex" in str(caught.value) and "short" not in str(caught.value)


def test_the_scrapy_settings_keep_the_key_out_of_sight() -> None:
    from scrapy.settings import Settings  # a dev dependency: never skipped

    from crawlhub.contrib.scrapy.center import read_center_settings

    settings = read_center_settings(Settings({"CRAWLHUB_CENTER_URL": "redis://127.0.0.1/0",
                                              "CRAWLHUB_CENTER_KEY": KEY}))
    assert settings.key == KEY and KEY not in repr(settings)
