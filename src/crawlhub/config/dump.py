"""A loaded config as plain data, the way ``crawlhub check-config`` prints it.

Static params go back into their outbound so the dump reads (and reloads) like the input.
"""

from __future__ import annotations

from typing import Any

from crawlhub.config.placeholders import SELECTOR_KEYS
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.core.redact import redact


def dump_config(cfg: CrawlhubConfig, redacted: bool = True) -> dict[str, Any]:
    """The merged, resolved config as JSON-able data with ``class`` keys.

    SecretStr fields always dump as ``"***"``; with ``redacted`` (the default) secret keys,
    URL passwords and secret query parameters are masked too (``logging.secret_names``).
    """
    data: dict[str, Any] = cfg.model_dump(mode="json", by_alias=True, exclude={"include"})
    for outbound in data.get("outbound", []):
        outbound.update(outbound.pop("static_params", None) or {})
    return _literal_braces(redact(data, cfg.logging.secrets()) if redacted else data)


def _literal_braces(value: Any) -> Any:
    """``value`` with the braces of its strings doubled, selectors excepted. Every
    placeholder of a loaded config is resolved, so a brace left is literal (a job's
    ``{id}``, a tag pattern's ``{version}``); the loader reads ``{{`` as one, so the dump
    loads back as it is (the inverse of :func:`~crawlhub.config.placeholders.substitute_tree`)."""
    if isinstance(value, str):
        return value.replace("{", "{{").replace("}", "}}")
    if isinstance(value, dict):
        return {k: v if k in SELECTOR_KEYS else _literal_braces(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_literal_braces(v) for v in value]
    return value
