"""Masking secrets before a config or an entry is shown (API, check-config, logs).

Keys that name a secret lose their value; URLs keep everything but their password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, SecretBytes, SecretStr

MASK = "***"

SECRET_KEY_RE = re.compile(
    r"password|passwd|secret|token|api[_-]?key|credential|private[_-]?key|authorization",
    re.IGNORECASE,
)
#: Option names that contain a secret word but hold no secret.
NOT_SECRET_KEYS = frozenset({"token_scope", "token_per_second"})

# scheme://user:password@host -> scheme://user:***@host (user may be empty: redis://:pw@h)
_URL_PASSWORD_RE = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):(?P<pw>[^@\s/]+)@")


def is_secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (``password``, ``api_key``, ``access_token``...)."""
    return (
        isinstance(key, str)
        and key.lower() not in NOT_SECRET_KEYS
        and bool(SECRET_KEY_RE.search(key))
    )


def redact_url(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` replaced by ***."""
    return _URL_PASSWORD_RE.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


def redact(obj: Any) -> Any:
    """A deep copy of ``obj`` with secrets masked.

    Values under secret-looking keys become ``"***"`` (``None`` stays ``None``: nothing to
    hide), URL passwords become ``***``, SecretStr values become ``"***"``. Pydantic
    models are dumped to plain JSON-able data first.
    """
    if isinstance(obj, BaseModel):
        return redact(obj.model_dump(mode="json", by_alias=True))
    if isinstance(obj, SecretStr | SecretBytes):
        return MASK
    if isinstance(obj, Mapping):
        return {
            key: (
                MASK if value is not None and value != "" and is_secret_key(key) else redact(value)
            )
            for key, value in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [redact(item) for item in obj]
    if isinstance(obj, str):
        return redact_url(obj)
    return obj
