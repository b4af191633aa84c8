"""Message signatures: HMAC-SHA256 over a message's channel, time, header and body, so a
process that can write to Redis but does not hold ``center.key`` cannot forge one.

Used by the download center's bus (every center, agent and job message on Redis) and by
the control channel's announcements. The key comes from ``center.key`` in the config,
else ``$CRAWLHUB_CENTER_KEY``, else ``<data dir>/center.key`` when that file exists
(:func:`load_key`); it is never generated on the fly - processes on other hosts could not
know it, and one stored in Redis would be readable by the very writer it keeps out.
Without a key nothing is signed and every message is taken (a warning says so once per
process). Redis ACLs stay the first wall; the signature is the second.

A signature covers ``t``, the signing time: a reader refuses a message stamped more than
``max_skew`` seconds ahead of its clock, or (``fresh=True``) behind it - replaying a
captured message works only inside that window.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from crawlhub.core.errors import ConfigError
from crawlhub.core.redact import redact_url
from crawlhub.core.rejects import BAD_SIGNATURE, SKEW, UNSIGNED

if TYPE_CHECKING:
    from crawlhub.config.schema import CrawlhubConfig

log = logging.getLogger("crawlhub.signing")

#: The environment variable holding the key.
KEY_ENV = "CRAWLHUB_CENTER_KEY"
#: The key file read from the data dir when neither the config nor the environment sets one.
KEY_FILE = "center.key"
#: Seconds a message's signing time may be off the reader's clock (either way).
MAX_SKEW = 300.0
#: Shortest key taken (characters).
MIN_KEY = 32



class Signer:
    """Signs and checks messages with one key. Cost: one HMAC-SHA256 over the header and
    body (a few microseconds for a small message; see docs/center.md)."""

    __slots__ = ("_key", "max_skew", "clock")

    def __init__(self, key: bytes | str, *, max_skew: float = MAX_SKEW,
                 clock: Callable[[], float] = time.time) -> None:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        if len(raw.strip()) < MIN_KEY:
            raise ConfigError(f"the message signing key ({KEY_ENV} / center.key) has"
                              f" {len(raw.strip())} characters; use at least {MIN_KEY}, e.g."
                              " python -c 'import secrets; print(secrets.token_hex(32))'",
                              key="center.key")
        self._key = raw.strip()
        self.max_skew = max_skew
        self.clock = clock

    def __repr__(self) -> str:  # never the key
        return f"Signer(max_skew={self.max_skew})"

    def mac(self, channel: str, t: bytes, header: bytes, body: bytes = b"") -> bytes:
        """The hex signature; lengths make the boundaries unambiguous."""
        # one-shot hmac.digest (OpenSSL in one C call): the same bytes as an hmac.new
        # object fed piece by piece, at a fraction of its cost per message
        head = f"{channel}\n{len(t)}:{len(header)}:{len(body)}\n".encode()
        return hmac.digest(self._key, b"".join((head, t, header, body)), "sha256").hex().encode()

    def sign(self, channel: str, header: bytes, body: bytes = b"",
             now: float | None = None) -> tuple[bytes, bytes]:
        """``(t, signature)`` for a message sent now on ``channel``."""
        t = repr(round(self.clock() if now is None else now, 3)).encode()
        return t, self.mac(channel, t, header, body)

    def verify(self, channel: str, header: bytes, body: bytes, t: bytes | None,
               sig: bytes | None, *, fresh: bool = True,
               now: float | None = None) -> tuple[str, str] | None:
        """None if the message is signed with this key inside the time window, else
        ``(reason, detail)``, the reason one of :mod:`crawlhub.core.rejects`. ``fresh=False`` skips the "too old" half (registrations are
        processed however old)."""
        if not sig or t is None:
            return UNSIGNED, "the message carries no signature and a key is configured"
        expected = self.mac(channel, t, header, body)
        if not hmac.compare_digest(expected, sig if isinstance(sig, bytes) else sig.encode()):
            return BAD_SIGNATURE, "the signature does not match the configured key"
        try:
            stamp = float(t)
        except ValueError:
            return BAD_SIGNATURE, "the signing time is not a number"
        now = self.clock() if now is None else now
        if stamp - now > self.max_skew:
            return SKEW, f"signed {stamp - now:.0f} s ahead of this clock (max {self.max_skew:g})"
        if fresh and now - stamp > self.max_skew:
            return SKEW, f"signed {now - stamp:.0f} s ago (max {self.max_skew:g})"
        return None


def load_key(setting: str | None, data_dir: str | Path | None) -> bytes | None:
    """The key: ``setting`` (``center.key``), else ``$CRAWLHUB_CENTER_KEY``, else the data
    dir's ``center.key`` file if it exists; None when none is set."""
    for value in (setting, os.environ.get(KEY_ENV)):
        if value and value.strip():
            return value.strip().encode()
    if data_dir is not None:
        path = Path(data_dir) / KEY_FILE
        try:
            value = path.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the message signing key ({exc})",
                              key="center.key") from None
        return value.encode() if value else None
    return None


_warned = False


def signer_for(key: bytes | None, *, max_skew: float = MAX_SKEW) -> Signer | None:
    """The signer of ``key``, or None without one (the Redis bus or channel that then
    opens unsigned says so: :func:`warn_unsigned`)."""
    return None if key is None else Signer(key, max_skew=max_skew)


def warn_unsigned(url: str) -> None:
    """One loud warning per process that messages on ``url`` are not signed. Called by a
    Redis bus or control channel opened without a signer, once its client exists (a
    missing ``redis`` package is the one error then, not a warning before it)."""
    global _warned
    if _warned or url.startswith("memory://"):
        return
    _warned = True
    log.warning("no message signing key (center.key / %s / <data dir>/%s): center,"
                " agent and control messages on %s are NOT signed, and anyone who can"
                " write to that Redis can forge them; set one shared key on every"
                " process (see docs/center.md)", KEY_ENV, KEY_FILE, redact_url(url))


def signer_from_config(config: CrawlhubConfig) -> Signer | None:
    """The signer of ``config`` (``center.key``, ``center.max_skew``; see :func:`load_key`),
    or None without a key (:func:`signer_for`)."""
    section = config.center
    key = load_key(section.key.get_secret_value() if section.key else None, config.data_dir)
    return signer_for(key, max_skew=section.max_skew)
