"""Load a crawlhub config file: includes, placeholders, validation and cross-checks.

Every problem becomes a ConfigError naming file, entry and key; all of them are raised together.

Merge rules (taskHUB layout):

* ``include:`` lists files or folders relative to the including file; a folder gives its
  ``*.yaml``/``*.yml`` files (hidden files skipped) in ascending filename order. Includes
  nest; a cycle is an error.
* ``inbound``/``outbound`` (and ``jobs``) lists concatenate: the included files in order,
  then the including file's own entries.
* Mapping sections (``server``, ``routing``, ``storage``, ...) merge key by key and
  scalars (``project``, ``data_dir``, ...) are replaced: a later include beats an earlier
  one and the including file beats everything it includes.
* An empty section (``logging:`` with nothing under it) means "defaults".
"""

from __future__ import annotations

import difflib
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from crawlhub.config.placeholders import substitute, substitute_tree
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.config.settings import DEFAULT_DATA_DIR, Settings, load_settings, where_to_set
from crawlhub.core.errors import ConfigError, ConfigErrors, SelectorError
from crawlhub.core.redact import is_secret_key, redact_url
from crawlhub.core.selectors import compile_selectors, with_location
from crawlhub.hub.config import InboundConfig, OutboundConfig, split_static_params

ENTRY_SECTIONS: tuple[str, ...] = ("inbound", "outbound")
#: Top-level lists (besides inbound/outbound) that concatenate across includes.
LIST_SECTIONS: tuple[str, ...] = ("jobs",)
YAML_SUFFIXES = (".yaml", ".yml")
_ENTRY_MODELS: dict[str, type[InboundConfig] | type[OutboundConfig]] = {
    "inbound": InboundConfig,
    "outbound": OutboundConfig,
}

Loc = tuple[str, ...]


def load_config(
    path: str | Path,
    *,
    overrides: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> CrawlhubConfig:
    """Load, merge, resolve and validate the config at ``path``.

    ``overrides`` are CLI ``--set name=value`` pairs; ``env`` defaults to ``os.environ``.
    Raises ConfigError (one problem) or ConfigErrors (several, all listed).
    """
    given = Path(path).expanduser()
    if not given.is_file():
        what = "is a folder" if given.is_dir() else "does not exist"
        raise ConfigError(
            f"config file {str(path)!r} {what}: pass the path of a YAML config file",
            file=str(path),
        )
    main = given.resolve()
    reader = _Reader(main)
    merged = reader.read(main, (main,))
    if reader.errors:
        raise _combine(reader.errors)
    settings = load_settings(main.parent, overrides, env, config_path=main)
    cfg = _Builder(merged, settings, main.parent, reader.show(main)).build()
    cfg._files = reader.files
    cfg._origins = dict(merged.origin)
    return cfg


def default_config(
    data_dir: str | Path | None = None,
    *,
    overrides: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> CrawlhubConfig:
    """The config ``crawlhub serve`` uses without a file: HTTP intake into one catch-all queue.

    With ``data_dir`` None the settings layers decide it (``--set data_dir=...``,
    ``CRAWLHUB_DATA_DIR``, a ``.env`` in the current directory), else ``./crawlhub-data``;
    those layers also give the log level. An explicit ``data_dir`` reads no settings.
    """
    settings = None
    if data_dir is None:
        settings = load_settings(None, overrides, env)
        data_dir = settings.data_dir
    cfg = CrawlhubConfig(
        data_dir=str(data_dir),
        inbound=[InboundConfig.model_validate({"name": "http", "class": "http"})],
        outbound=[
            OutboundConfig.model_validate(
                {"name": "default", "class": "queue", "init": {"key": "default"}}
            )
        ],
    )
    builtins = {"data_dir": str(data_dir), "project": cfg.project}
    _resolve_defaults(cfg, lambda name: builtins.get(name.lower()))
    for section in (cfg.inbound, cfg.outbound):
        for index, entry in enumerate(section):
            entry.set_source(None, index)
    if settings is not None:
        if settings.log_level:
            cfg.logging.level = settings.log_level  # type: ignore[assignment]
        cfg._settings = settings
    return cfg


# --------------------------------------------------------------------------- reading


@dataclass
class RawEntry:
    """One inbound/outbound entry as read, with where it came from."""

    section: str
    data: Any
    file: str
    index: int

    @property
    def name(self) -> str | None:
        if isinstance(self.data, Mapping):
            name = self.data.get("name")
            if isinstance(name, str | int) and str(name):
                return str(name)
        return None

    @property
    def label(self) -> str:
        name = self.name
        return f"{self.section}[{self.index}]" + (f" '{name}'" if name else "")


@dataclass
class _Merged:
    top: dict[str, Any] = field(default_factory=dict)
    #: (section,) or (section, key) -> file that set it last.
    origin: dict[Loc, str] = field(default_factory=dict)
    entries: dict[str, list[RawEntry]] = field(
        default_factory=lambda: {section: [] for section in ENTRY_SECTIONS}
    )

    def merge(self, other: _Merged) -> None:
        """Lay ``other`` over self: lists concatenate, mappings merge, scalars replace."""
        for section in ENTRY_SECTIONS:
            self.entries[section].extend(other.entries[section])
        for key, value in other.top.items():
            mine = self.top.get(key)
            if isinstance(mine, dict) and isinstance(value, dict):
                self.top[key] = {**mine, **value}
            elif key in LIST_SECTIONS and isinstance(mine, list) and isinstance(value, list):
                self.top[key] = mine + value
            else:
                self.top[key] = value
                for stale in [o for o in self.origin if len(o) > 1 and o[0] == key]:
                    del self.origin[stale]
        self.origin.update(other.origin)


class _Reader:
    """Reads the main file and its includes, collecting structural errors."""

    def __init__(self, main: Path) -> None:
        self.root = main.parent
        self.errors: list[ConfigError] = []
        self.files: list[str] = []

    def show(self, path: Path) -> str:
        """A file as errors name it: relative to the main config's folder."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return Path(os.path.relpath(path, self.root)).as_posix()

    def read(self, path: Path, stack: tuple[Path, ...]) -> _Merged:
        shown = self.show(path)
        self.files.append(shown)
        merged = _Merged()
        data = self._parse(path, shown)
        if data is None:
            return merged
        for target in self._include_targets(data.pop("include", None), path, shown):
            if target in stack:
                chain = " -> ".join(self.show(p) for p in (*stack, target))
                self.errors.append(
                    ConfigError(
                        f"include cycle: {chain}; remove one of these includes",
                        file=shown,
                        key="include",
                    )
                )
                continue
            merged.merge(self.read(target, (*stack, target)))
        merged.merge(self._own(data, shown))
        return merged

    def _parse(self, path: Path, shown: str) -> dict[str, Any] | None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.errors.append(ConfigError(f"cannot read the file: {exc}", file=shown))
            return None
        import yaml  # (here: the built-in config reads no YAML, serve's start-up)

        from crawlhub.config.yamlread import YAMLProblem, read_yaml

        try:
            data = read_yaml(text)
        except YAMLProblem as exc:
            self.errors.append(ConfigError(str(exc), file=shown, entry=exc.entry, key=exc.key))
            return None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            self.errors.append(ConfigError(f"invalid YAML{where}: {problem}", file=shown))
            return None
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.errors.append(
                ConfigError(
                    "the top level must be a mapping of sections (include, project, server, "
                    f"inbound, outbound, ...), got {_kind(data)}",
                    file=shown,
                )
            )
            return None
        return data

    def _include_targets(self, includes: Any, path: Path, shown: str) -> list[Path]:
        if includes is None:
            return []
        items = [includes] if isinstance(includes, str) else includes
        if not isinstance(items, list):
            self.errors.append(
                ConfigError(
                    f"expected a list of files or folders, got {_kind(includes)}",
                    file=shown,
                    key="include",
                )
            )
            return []
        targets: list[Path] = []
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item.strip():
                self.errors.append(
                    ConfigError(
                        f"expected a file or folder path, got {item!r}",
                        file=shown,
                        key=f"include[{i}]",
                    )
                )
                continue
            target = (path.parent / os.path.expanduser(item)).resolve()
            if target.is_dir():
                targets.extend(
                    sorted(
                        (
                            p.resolve()
                            for p in target.iterdir()
                            if p.is_file()
                            and p.suffix.lower() in YAML_SUFFIXES
                            and not p.name.startswith(".")
                        ),
                        key=lambda p: p.name,
                    )
                )
            elif target.is_file():
                targets.append(target)
            else:
                self.errors.append(
                    ConfigError(
                        f"included path {item!r} does not exist (looked for {target}); "
                        "include paths are relative to the including file",
                        file=shown,
                        key=f"include[{i}]",
                    )
                )
        return targets

    def _own(self, data: dict[str, Any], shown: str) -> _Merged:
        own = _Merged()
        for key, value in data.items():
            if not isinstance(key, str):
                self.errors.append(
                    ConfigError(f"top-level keys must be strings, got {key!r}", file=shown)
                )
                continue
            if value is None:
                continue  # an empty section means its defaults
            if key in ENTRY_SECTIONS:
                if not isinstance(value, list):
                    self.errors.append(
                        ConfigError(
                            f"expected a list of {key} entries (each starting with '- name:'), "
                            f"got {_kind(value)}",
                            file=shown,
                            entry=key,
                        )
                    )
                    continue
                own.entries[key] = [RawEntry(key, item, shown, i) for i, item in enumerate(value)]
                continue
            own.top[key] = value
            own.origin[(key,)] = shown
            if isinstance(value, dict):
                for sub in value:
                    own.origin[(key, str(sub))] = shown
            elif key in LIST_SECTIONS and isinstance(value, list):
                for item in value:  # jobs by name: each may come from another file
                    if isinstance(item, Mapping) and isinstance(item.get("name"), str):
                        own.origin[(key, item["name"])] = shown
        return own


# --------------------------------------------------------------------------- building


class _Builder:
    """Resolves placeholders, validates every part and cross-checks, collecting errors."""

    def __init__(self, merged: _Merged, settings: Settings, config_dir: Path, main: str) -> None:
        self.merged = merged
        self.settings = settings
        self.config_dir = config_dir
        self.main = main
        self.errors: list[ConfigError] = []
        self.builtins: dict[str, str] = {"config_dir": str(config_dir)}
        #: Selector lists to compile, also from entries that failed other checks.
        self.selectors: list[tuple[list[str], RawEntry]] = []

    def lookup(self, name: str) -> str | None:
        key = name.lower()
        if key in self.builtins:
            return self.builtins[key]
        return self.settings.get(key)

    def unknown_placeholder(self, name: str) -> str:
        return (
            f"unknown placeholder '{{{name}}}': {where_to_set(name, self.config_dir)} "
            "(write '{{' and '}}' for literal braces)"
        )

    def build(self) -> CrawlhubConfig:
        top = dict(self.merged.top)
        self.builtins["project"] = self._builtin_scalar(top, "project", "crawlhub")
        if self.settings.is_set("data_dir"):
            top["data_dir"] = self.settings.data_dir
        else:
            top["data_dir"] = self._builtin_scalar(top, "data_dir", DEFAULT_DATA_DIR)
        self.builtins["data_dir"] = top["data_dir"]

        cfg = self._validate_top(top)
        inbounds = self._validate_entries("inbound")
        outbounds = self._validate_entries("outbound")
        self._check_unique_names(inbounds)
        self._check_unique_names(outbounds)
        self._check_failbacks(outbounds)
        self._check_failback_cycles(outbounds, cfg.routing.limits if cfg is not None else -1)
        self._check_selectors()
        if self.errors or cfg is None:
            raise _combine(self.errors)

        cfg.inbound = [model for model, _ in inbounds]  # type: ignore[misc]
        cfg.outbound = [model for model, _ in outbounds]  # type: ignore[misc]
        cfg.include = []
        _resolve_defaults(cfg, self.lookup)
        if self.settings.log_level:
            cfg.logging.level = self.settings.log_level  # type: ignore[assignment]
        cfg._config_path = self.settings.config_path
        cfg._settings = self.settings
        return cfg

    # -- placeholders

    def _builtin_scalar(self, top: dict[str, Any], key: str, default: str) -> str:
        """Resolve ``project``/``data_dir`` first: other values may refer to them."""
        value = top.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            return str(value) if isinstance(value, int | float) else default
        missing: list[str] = []
        resolved = substitute(value, self.lookup, missing)
        for name in missing:
            self.errors.append(
                ConfigError(self.unknown_placeholder(name), **self._top_location((key,)))
            )
        top[key] = resolved
        return resolved

    def _resolve(
        self, value: Any, prefix: Loc, locate: Callable[[Loc], dict[str, Any]], skip: set[Loc]
    ) -> Any:
        def on_missing(path: tuple[str | int, ...], name: str) -> None:
            loc = (*prefix, *(str(p) for p in path))
            skip.add(loc)
            self.errors.append(ConfigError(self.unknown_placeholder(name), **locate(loc)))

        return substitute_tree(value, self.lookup, on_missing)

    # -- validation

    def _top_location(self, loc: Loc) -> dict[str, Any]:
        origin = self.merged.origin
        file = origin.get(loc[:2]) or origin.get(loc[:1]) or self.main
        if len(loc) <= 1:
            return {"file": file, "key": loc[0] if loc else None}
        return {"file": file, "entry": loc[0], "key": ".".join(loc[1:])}

    def _validate_top(self, top: dict[str, Any]) -> CrawlhubConfig | None:
        skip: set[Loc] = set()
        resolved = {
            key: value
            if key in ("project", "data_dir")
            else self._resolve(value, (key,), self._top_location, skip)
            for key, value in top.items()
        }
        try:
            return CrawlhubConfig.model_validate(resolved)
        except ValidationError as exc:
            self._translate(exc, CrawlhubConfig, self._top_location, skip)
            return None

    def _validate_entries(self, section: str) -> list[tuple[Any, RawEntry]]:
        model_cls = _ENTRY_MODELS[section]
        result: list[tuple[Any, RawEntry]] = []
        for raw in self.merged.entries[section]:

            def locate(loc: Loc, raw: RawEntry = raw) -> dict[str, Any]:
                return {"file": raw.file, "entry": raw.label, "key": ".".join(loc) or None}

            if not isinstance(raw.data, Mapping):
                self.errors.append(
                    ConfigError(
                        f"expected a mapping with at least 'name' and 'class', got "
                        f"{_kind(raw.data)} {_show(raw.data, ())}",
                        file=raw.file,
                        entry=raw.label,
                    )
                )
                continue
            selector = raw.data.get("selector")
            selector = [selector] if isinstance(selector, str) else selector
            if isinstance(selector, list) and all(isinstance(t, str) for t in selector):
                self.selectors.append((selector, raw))
            skip: set[Loc] = set()
            data = self._resolve(dict(raw.data), (), locate, skip)
            if section == "outbound":
                options, static, problems = split_static_params(data)
                for key, message in problems:
                    self.errors.append(ConfigError(message, **locate((key,))))
                data = {**options, **static}
            try:
                model = model_cls.model_validate(data)
            except ValidationError as exc:
                self._translate(exc, model_cls, locate, skip)
                continue
            model.set_source(raw.file, raw.index)
            result.append((model, raw))
        return result

    def _translate(
        self,
        exc: ValidationError,
        model_cls: type[BaseModel],
        locate: Callable[[Loc], dict[str, Any]],
        skip: set[Loc],
    ) -> None:
        for error in exc.errors(include_url=False):
            loc = tuple(str(part) for part in error["loc"])
            if loc in skip:
                continue  # already reported as an unknown placeholder
            self.errors.append(ConfigError(_describe(error, model_cls, loc), **locate(loc)))

    # -- cross-checks

    def _check_unique_names(self, entries: list[tuple[Any, RawEntry]]) -> None:
        first: dict[str, RawEntry] = {}
        for model, raw in entries:
            earlier = first.get(model.name)
            if earlier is None:
                first[model.name] = raw
                continue
            self.errors.append(
                ConfigError(
                    f"duplicate {raw.section} name '{model.name}': {earlier.label} in file "
                    f"{earlier.file} already uses it; {raw.section} names must be unique",
                    file=raw.file,
                    entry=raw.label,
                    key="name",
                )
            )

    def _check_failbacks(self, outbounds: list[tuple[Any, RawEntry]]) -> None:
        # Names of every entry, even invalid ones, so one bad entry does not cascade.
        names = [raw.name for raw in self.merged.entries["outbound"] if raw.name]
        for model, raw in outbounds:
            target = model.failback
            if target is None or target == model.name or target in names:
                continue
            close = difflib.get_close_matches(target, names, n=1, cutoff=0.6)
            hint = f" — did you mean '{close[0]}'?" if close else ""
            self.errors.append(
                ConfigError(
                    f"failback '{target}' is not a defined outbound{hint} "
                    f"(outbounds: {', '.join(names) or 'none'})",
                    file=raw.file,
                    entry=raw.label,
                    key="failback",
                )
            )

    def _check_failback_cycles(self, outbounds: list[tuple[Any, RawEntry]], limits: int) -> None:
        """A failback chain that comes back (a -> b -> a) bounces a failing task forever
        unless ``routing.limits`` caps the routes per task."""
        if limits >= 0:
            return
        by_name = {model.name: (model, raw) for model, raw in outbounds}
        order = {model.name: position for position, (model, _) in enumerate(outbounds)}
        done: set[str] = set()
        for model, _ in outbounds:
            chain: list[str] = []
            name: str | None = model.name
            while name is not None and name in by_name and name not in done and name not in chain:
                chain.append(name)
                name = by_name[name][0].failback
            done.update(chain)
            if name is None or name not in chain:
                continue
            cycle = [*chain[chain.index(name):], name]
            first = min(cycle[:-1], key=order.__getitem__)
            cycle = [*cycle[cycle.index(first):-1], *cycle[:cycle.index(first)], first]
            others = ", ".join(
                f"{by_name[n][1].label} in {by_name[n][1].file}" for n in cycle[:-1] if n != first
            )
            shown = " -> ".join(f"'{n}'" for n in cycle)
            raw = by_name[first][1]
            self.errors.append(
                ConfigError(
                    f"failback cycle {shown} (with {others}) while routing.limits is -1 (no"
                    " cap): a task that keeps failing bounces between these outbounds"
                    " forever; set routing.limits to a finite number of routes per task, or"
                    " remove failback from one of them",
                    file=raw.file,
                    entry=raw.label,
                    key="failback",
                )
            )

    def _check_selectors(self) -> None:
        for texts, raw in self.selectors:
            if not texts:
                continue
            try:
                compile_selectors(texts)
            except SelectorError as exc:
                self.errors.append(with_location(exc, file=raw.file, entry=raw.label))


# --------------------------------------------------------------------------- helpers


def _combine(errors: list[ConfigError]) -> ConfigError:
    if len(errors) == 1:
        return errors[0]
    return ConfigErrors(errors)


def _resolve_defaults(model: BaseModel, lookup: Callable[[str], str | None]) -> None:
    """Fill placeholders in default values (``sqlite:///{data_dir}/queues.db``).

    Only fields the user did not set are touched, so a user's value is never substituted
    twice (``{{`` stays a literal brace).
    """
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, str) and name not in model.model_fields_set and "{" in value:
            setattr(model, name, substitute(value, lookup))
        elif isinstance(value, BaseModel):
            _resolve_defaults(value, lookup)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, BaseModel):
                    _resolve_defaults(item, lookup)


_EXPECTED = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer without a fraction",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
    "bool_parsing": "expected a boolean (true or false)",
    "bool_type": "expected a boolean (true or false)",
    "string_type": "expected a string",
    "string_too_short": "expected a non-empty string",
    "list_type": "expected a list",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
}
_BOUNDS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}
_VALUE_ERROR_PREFIX = re.compile(r"^(Value error|Assertion failed), ")


def _describe(error: Mapping[str, Any], model_cls: type[BaseModel], loc: Loc) -> str:
    """A pydantic error as a sentence: what was expected and what was found."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "required key is missing"
    if kind == "extra_forbidden":
        known = _known_keys(model_cls, loc[:-1])
        close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6) if loc else []
        if close:
            return f"unknown key '{loc[-1]}' — did you mean '{close[0]}'?"
        listed = f"; known keys: {', '.join(known)}" if known else ""
        return f"unknown key '{loc[-1] if loc else ''}'{listed}"
    if kind in ("value_error", "assertion_error"):
        return _VALUE_ERROR_PREFIX.sub("", str(error["msg"]))
    text = _EXPECTED.get(kind)
    if text is None and kind in _BOUNDS:
        name, sign = _BOUNDS[kind]
        text = f"expected a value {sign} {ctx.get(name)}"
    if text is None and kind == "literal_error":
        text = f"expected {ctx.get('expected')}"
    if text is None:
        msg = str(error["msg"])
        text = (
            "expected " + msg[len("Input should be ") :]
            if msg.startswith("Input should be ")
            else msg
        )
    return f"{text}, got {_show(error.get('input'), loc)}"


def _show(value: Any, loc: Loc, limit: int = 60) -> str:
    """The bad value for an error message: short, and never a secret."""
    if any(is_secret_key(part) for part in loc):
        return "***"
    text = redact_url(repr(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def _known_keys(model_cls: type[BaseModel], path: Loc) -> list[str]:
    current: type[BaseModel] | None = model_cls
    for part in path:
        if current is None:
            return []
        if part.isdigit():
            continue
        found = None
        for name, info in current.model_fields.items():
            if part in (name, info.alias):
                found = info.annotation
                break
        current = _model_in(found)
    if current is None:
        return []
    return sorted(info.alias or name for name, info in current.model_fields.items())


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
