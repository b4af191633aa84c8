"""Secrets at rest: project passwords and tokens, webhook secrets, encrypted with Fernet.

A :class:`SecretBox` holds one or more Fernet keys: the first encrypts, every one
decrypts (``MultiFernet``), so a key is rotated by putting the new one first and
re-encrypting at leisure. The keys come from the setting ``CRAWLHUB_SECRET_KEY`` (one key,
or several separated by commas) or, on the embedded default, from ``<data dir>/secret.key``,
created with mode 0600 on first use. Losing that file loses the stored secrets, not the
projects: a secret that no key decrypts is a :class:`SecretError` naming what to do.

Plain secrets live in :class:`Secret`, whose ``str``/``repr`` are masked: formatted into
a log line or an error by mistake, it shows ``'***'``.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.core.redact import MASK

if TYPE_CHECKING:
    from cryptography.fernet import MultiFernet

    from crawlhub.config.schema import CrawlhubConfig

# cryptography is imported when a secret is first encrypted or decrypted, not when the
# box is made: serving imports none of it until a secret is used (start-up). A key is
# still checked when the box is made, as Fernet checks it.

#: The environment variable (and settings name) holding the key(s).
KEY_ENV = "CRAWLHUB_SECRET_KEY"
#: The key file of the embedded default, in the data dir.
KEY_FILE = "secret.key"


class SecretError(CrawlhubError):
    """A stored secret cannot be decrypted with the keys given."""


class Secret:
    """A secret in memory: ``reveal()`` gives it; every other view is masked."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"


def _fernet_key(key: str | bytes, where: str) -> bytes:
    """``key`` as Fernet takes it, refused as Fernet refuses it (its constructor's own
    check: 32 bytes once url-safe base64-decoded)."""
    raw = key.strip() if isinstance(key, bytes) else key.strip().encode()
    try:
        valid = len(base64.urlsafe_b64decode(raw)) == 32
    except (ValueError, TypeError):  # (binascii.Error is a ValueError)
        valid = False
    if not valid:
        raise ConfigError(f"{where}: not a Fernet key (32 url-safe base64-encoded bytes;"
                          " make one with: python -c 'from cryptography.fernet import Fernet;"
                          " print(Fernet.generate_key().decode())')", key=KEY_ENV)
    return raw


class SecretBox:
    """Encrypts and decrypts secrets with Fernet keys (the first one encrypts)."""

    def __init__(self, keys: Sequence[str | bytes], *, where: str = KEY_ENV) -> None:
        if not keys:
            raise ConfigError(f"{where}: no key given", key=KEY_ENV)
        self._keys = [_fernet_key(k, where) for k in keys]
        self._multi: MultiFernet | None = None

    @property
    def _box(self) -> MultiFernet:
        if self._multi is None:
            from cryptography.fernet import Fernet, MultiFernet

            self._multi = MultiFernet([Fernet(key) for key in self._keys])
        return self._multi

    @staticmethod
    def new_key() -> str:
        """A new key: 32 random bytes, url-safe base64 (``Fernet.generate_key()``'s)."""
        return base64.urlsafe_b64encode(os.urandom(32)).decode()

    @classmethod
    def from_setting(cls, value: str | None, data_dir: Path | None) -> SecretBox:
        """The box of ``value`` (comma-separated keys) or, without one, of the data dir's
        key file, created on first use."""
        if value and value.strip():
            return cls([k for k in value.split(",") if k.strip()], where=KEY_ENV)
        if data_dir is None:
            raise ConfigError(f"no secret key: set {KEY_ENV} (distributed set-ups share it)",
                              key=KEY_ENV)
        return cls([_key_file(data_dir / KEY_FILE)], where=str(data_dir / KEY_FILE))

    @classmethod
    def from_config(cls, config: CrawlhubConfig) -> SecretBox:
        """The box of a config: ``control.secret_key``, else ``$CRAWLHUB_SECRET_KEY``,
        else the data dir's key file (what the server and the CLI both use)."""
        key = config.control.secret_key
        return cls.from_setting(key.get_secret_value() if key else os.environ.get(KEY_ENV),
                                Path(config.data_dir))

    def encrypt(self, secret: Secret | str) -> str:
        plain = secret.reveal() if isinstance(secret, Secret) else secret
        return self._box.encrypt(plain.encode()).decode("ascii")

    def decrypt(self, token: str, *, what: str = "a stored secret") -> Secret:
        from cryptography.fernet import InvalidToken

        try:
            return Secret(self._box.decrypt(token.encode("ascii")).decode())
        except (InvalidToken, UnicodeError, ValueError):
            raise SecretError(
                f"{what} cannot be decrypted with the keys given: it was stored under"
                f" another {KEY_ENV} (or {KEY_FILE} was replaced); set the old key first in"
                f" {KEY_ENV}, or store the secret again") from None

    def rotate(self, token: str) -> str:
        """``token`` re-encrypted under the first key."""
        from cryptography.fernet import InvalidToken

        try:
            return self._box.rotate(token.encode("ascii")).decode("ascii")
        except InvalidToken:
            raise SecretError(f"a stored secret cannot be decrypted with the keys given"
                              f" (rotate needs the old key in {KEY_ENV})") from None


def _key_file(path: Path) -> str:
    """The key in ``path``, written there (0600, atomically) when the file is missing."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = SecretBox.new_key()
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (key + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # fails if another process made one first: use theirs
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the secret key ({exc.strerror})",
                          file=str(path)) from None
    if not text:
        raise ConfigError(f"{path}: the secret key file is empty", file=str(path))
    return text
