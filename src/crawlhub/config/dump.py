"""A loaded config as plain data, the way ``crawlhub check-config`` prints it.

Static params go back into their outbound so the dump reads (and reloads) like the input.
"""

from __future__ import annotations

from typing import Any

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.storage.redact import redact


def dump_config(cfg: CrawlhubConfig, redacted: bool = True) -> dict[str, Any]:
    """The merged, resolved config as JSON-able data with ``class`` keys.

    SecretStr fields always dump as ``"***"``; with ``redacted`` (the default) secret keys,
    URL passwords and secret query parameters are masked too (``logging.secret_names``).
    """
    data: dict[str, Any] = cfg.model_dump(mode="json", by_alias=True, exclude={"include"})
    for outbound in data.get("outbound", []):
        outbound.update(outbound.pop("static_params", None) or {})
    control = data.get("control") or {}
    if isinstance(control.get("tag_pattern"), str):
        # {name} and {version} are the pattern's own fields, not config placeholders: the
        # dump doubles them so it loads back (the loader reads {{ as a literal brace).
        control["tag_pattern"] = control["tag_pattern"].replace("{", "{{").replace("}", "}}")
    return redact(data, cfg.logging.secrets()) if redacted else data
