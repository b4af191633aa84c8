"""Settings layers that fill config placeholders: .env < .env.local < environment < --set.

A name is case-insensitive; in files and the environment it may carry the ``CRAWLHUB_`` prefix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dotenv import dotenv_values
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import ConfigError

ENV_PREFIX = "crawlhub_"
DEFAULT_DATA_DIR = "./crawlhub-data"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_PLAIN_ENV = "environment {NAME}"


class Settings(BaseModel):
    """Named values for placeholders plus the few settings crawlhub itself reads.

    Lookup order for a name such as ``redis_url`` (first found wins): CLI ``--set
    redis_url=...`` > environment ``CRAWLHUB_REDIS_URL`` > environment ``REDIS_URL`` >
    ``.env.local`` > ``.env``. ``.env`` files are read from the config file's folder and
    from the current directory; for the same name the current directory's file wins, and
    every ``.env.local`` beats every ``.env``. Inside a file, ``CRAWLHUB_NAME`` beats ``NAME``.
    """

    model_config = ConfigDict(extra="forbid")

    data_dir: str = DEFAULT_DATA_DIR
    config_path: Path | None = None
    log_level: str | None = None
    #: Free-form values set in .env files, CRAWLHUB_* variables and --set (not the whole
    #: environment); lowercase names.
    values: dict[str, str] = Field(default_factory=dict)

    # Highest precedence first: (where, as a format string taking NAME/name; name -> value).
    _layers: list[tuple[str, dict[str, str]]] = PrivateAttr(default_factory=new_list)

    def get(self, name: str) -> str | None:
        """The value of setting ``name`` (case-insensitive), or None when no layer sets it."""
        found = self._find(name)
        return found[1] if found else None

    def source_of(self, name: str) -> str | None:
        """Where ``name`` was set, e.g. ``environment CRAWLHUB_REDIS_URL``; None if unset."""
        found = self._find(name)
        return found[0] if found else None

    def is_set(self, name: str) -> bool:
        return self._find(name) is not None

    def _find(self, name: str) -> tuple[str, str] | None:
        key = name.lower()
        for source, layer in self._layers:
            if key in layer:
                return source.format(NAME=key.upper(), name=key), layer[key]
        if key in self.values:
            return "settings", self.values[key]
        return None


def load_settings(
    config_dir: str | Path | None = None,
    overrides: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    config_path: str | Path | None = None,
    cwd: str | Path | None = None,
) -> Settings:
    """Read the settings layers for a config living in ``config_dir``.

    ``env`` defaults to ``os.environ``; ``cwd`` to the current directory; ``overrides``
    are the CLI's ``--set name=value`` pairs. A bad ``log_level`` is a ConfigError.
    """
    environ = os.environ if env is None else env
    here = Path(cwd) if cwd is not None else Path.cwd()
    folders = _unique_dirs([Path(config_dir)] if config_dir is not None else [], here)

    # Lowest precedence first; reversed at the end.
    layers: list[tuple[str, dict[str, str]]] = []
    for filename in (".env", ".env.local"):
        for folder in folders:
            path = folder / filename
            if path.is_file():
                raw = {
                    k: v for k, v in dotenv_values(path, interpolate=False).items() if v is not None
                }
                layers.extend(_split_prefixed(raw, str(path).replace("{", "{{").replace("}", "}}")))
    plain_env = {k.lower(): v for k, v in environ.items() if not k.lower().startswith(ENV_PREFIX)}
    layers.append((_PLAIN_ENV, plain_env))
    layers.append(("environment CRAWLHUB_{NAME}", _strip_prefix(environ)))
    layers.append(("--set {name}", {k.lower(): str(v) for k, v in (overrides or {}).items()}))
    layers.reverse()

    explicit: dict[str, str] = {}
    for source, layer in reversed(layers):
        if source != _PLAIN_ENV:
            explicit.update(layer)

    settings = Settings(
        config_path=Path(config_path) if config_path is not None else None,
        values=explicit,
    )
    settings._layers = layers
    data_dir = settings.get("data_dir")
    if data_dir:
        settings.data_dir = data_dir
    level = settings.get("log_level")
    if level is not None:
        if level.strip().upper() not in LOG_LEVELS:
            raise ConfigError(
                f"log level {level!r} from {settings.source_of('log_level')}: expected one of "
                f"{', '.join(LOG_LEVELS)}",
                key="log_level",
            )
        settings.log_level = level.strip().upper()
    return settings


def where_to_set(name: str, config_dir: Path | None = None) -> str:
    """The sentence telling a user where a setting ``name`` can be given."""
    folder = f" (in {config_dir} or the current directory)" if config_dir else ""
    return (
        f"set it in .env or .env.local{folder}, in the environment as "
        f"CRAWLHUB_{name.upper()} or {name.upper()}, or with --set {name.lower()}=VALUE"
    )


def _split_prefixed(raw: Mapping[str, str], source: str) -> list[tuple[str, dict[str, str]]]:
    plain = {k.lower(): v for k, v in raw.items() if not k.lower().startswith(ENV_PREFIX)}
    return [(f"{source} ({{NAME}})", plain), (f"{source} (CRAWLHUB_{{NAME}})", _strip_prefix(raw))]


def _strip_prefix(raw: Mapping[str, str]) -> dict[str, str]:
    return {
        k.lower()[len(ENV_PREFIX) :]: v
        for k, v in raw.items()
        if k.lower().startswith(ENV_PREFIX) and len(k) > len(ENV_PREFIX)
    }


def _unique_dirs(first: list[Path], cwd: Path) -> list[Path]:
    """Config dir first, then cwd (so the cwd's files win); the same folder only once."""
    result: list[Path] = []
    for folder in [*first, cwd]:
        resolved = folder.resolve()
        if resolved not in result:
            result.append(resolved)
    return result
