"""Secrets at rest: Fernet round trips, key rotation, the data dir's key file, masking."""

from __future__ import annotations

import logging
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from crawlhub.control.secrets import KEY_FILE, Secret, SecretBox, SecretError
from crawlhub.errors import ConfigError


def test_a_secret_round_trips_and_the_stored_form_does_not_contain_it() -> None:
    box = SecretBox([SecretBox.new_key()])
    token = box.encrypt("ghp_s3cret-token")
    assert "s3cret" not in token
    assert box.decrypt(token).reveal() == "ghp_s3cret-token"
    assert box.encrypt("x") != box.encrypt("x")  # fresh IV each time


def test_a_secret_is_masked_in_every_view(caplog: pytest.LogCaptureFixture) -> None:
    secret = Secret("hunter2")
    assert str(secret) == "***" and "hunter2" not in repr(secret)
    assert "hunter2" not in f"{secret} {secret!r} {[secret]} {({'p': secret})}"
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("password %s for %r", secret, secret)
    assert "hunter2" not in caplog.text
    assert secret == Secret("hunter2") and secret != "hunter2"


def test_rotation_decrypts_old_secrets_and_re_encrypts_under_the_new_key() -> None:
    old, new = SecretBox.new_key(), SecretBox.new_key()
    token = SecretBox([old]).encrypt("pw")
    both = SecretBox.from_setting(f"{new}, {old}", None)
    assert both.decrypt(token).reveal() == "pw"
    rotated = both.rotate(token)
    assert SecretBox([new]).decrypt(rotated).reveal() == "pw"
    with pytest.raises(SecretError, match="cannot be decrypted"):
        SecretBox([old]).decrypt(rotated)


def test_a_wrong_key_or_a_damaged_token_is_an_error_saying_what_to_do() -> None:
    token = SecretBox([SecretBox.new_key()]).encrypt("pw")
    other = SecretBox([SecretBox.new_key()])
    with pytest.raises(SecretError, match="CRAWLHUB_SECRET_KEY") as err:
        other.decrypt(token, what="project 'shop' password")
    assert "project 'shop' password" in str(err.value) and "pw" not in str(err.value)
    with pytest.raises(SecretError):
        other.decrypt("not a token at all \u00e9")
    with pytest.raises(ConfigError, match="not a Fernet key"):
        SecretBox(["too-short"])
    with pytest.raises(ConfigError, match="no secret key"):
        SecretBox.from_setting("", None)


def test_the_embedded_default_keeps_its_key_in_the_data_dir_readable_by_the_owner_only(
        tmp_path: Path) -> None:
    box = SecretBox.from_setting(None, tmp_path / "data")
    token = box.encrypt("pw")
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # the next start reads the same key back
    assert SecretBox.from_setting(None, tmp_path / "data").decrypt(token).reveal() == "pw"
    path.write_text("")
    with pytest.raises(ConfigError, match="empty") as err:
        SecretBox.from_setting(None, tmp_path / "data")
    assert err.value.file == str(path)


def _make(path: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    out.put(SecretBox.from_setting(None, Path(path)).encrypt("same"))


def test_processes_creating_the_key_at_once_end_up_with_one_key(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_make, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    tokens = [out.get(timeout=5) for _ in procs]
    box = SecretBox.from_setting(None, tmp_path)
    assert [box.decrypt(t).reveal() for t in tokens] == ["same"] * 4
    assert [n for n in os.listdir(tmp_path)] == [KEY_FILE]
