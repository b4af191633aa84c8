"""Secrets at rest: Fernet round trips, key rotation, the data dir's key file, masking."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from crawlhub.control.secrets import KEY_FILE, Secret, SecretBox, SecretError
from crawlhub.core.errors import ConfigError


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


MAKE = ("import sys; from pathlib import Path; from crawlhub.control.secrets import SecretBox;"
        " print(SecretBox.from_setting(None, Path(sys.argv[1])).encrypt('same'))")


def test_processes_creating_the_key_at_once_end_up_with_one_key(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", MAKE, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True) for _ in range(4)]
    tokens = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    box = SecretBox.from_setting(None, tmp_path)
    assert [box.decrypt(t).reveal() for t in tokens] == ["same"] * 4
    assert os.listdir(tmp_path) == [KEY_FILE]


@pytest.mark.parametrize("key", [
    "x" * 43 + "=", " " + "A" * 43 + "=\n", "A" * 44, "A" * 43, "A" * 45 + "=",
    "not a key", "", "===", "é" * 44, "A" * 42 + "==", "-_" * 21 + "A=", "A" * 40 + "\t" + "AAA=",
])
def test_a_key_is_refused_when_the_box_is_made_exactly_when_fernet_refuses_it(key: str) -> None:
    # the box checks keys without importing cryptography (start-up): the same keys as
    # Fernet's own constructor, which takes them stripped
    from cryptography.fernet import Fernet

    try:
        Fernet(key.strip().encode())
        fernet_takes_it = True
    except ValueError:
        fernet_takes_it = False
    if fernet_takes_it:
        box = SecretBox([key])
        assert box.decrypt(box.encrypt("s3cret")).reveal() == "s3cret"
        assert box.decrypt(SecretBox([key]).encrypt("again")).reveal() == "again"
    else:
        with pytest.raises(ConfigError, match="not a Fernet key"):
            SecretBox([key])


def test_a_new_key_is_a_fernet_key() -> None:
    from cryptography.fernet import Fernet

    key = SecretBox.new_key()
    assert Fernet(key.encode()).decrypt(Fernet(key.encode()).encrypt(b"x")) == b"x"
    assert key != SecretBox.new_key()
