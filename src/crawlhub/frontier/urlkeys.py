"""The dedup key of a seed: w3lib's canonical URL minus what does not name a page.

Rules, in order: canonicalize, drop the default port, drop volatile/unwanted query
parameters (global and per-domain rules), optionally lower-case the path and add the
method and a body hash; or a user function by import path replaces all of it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from crawlhub.core.errors import ConfigError, FrontierError
from crawlhub.core.loading import import_object
from crawlhub.frontier.canonical import (
    DEFAULT_PORTS,
    CanonicalURL,
    canonicalize,
    fast_authority,
    fast_split,
    is_plain_query,
)
from crawlhub.frontier.config import DomainKeyRules, KeyConfig
from crawlhub.frontier.seed import Seed

# Unix times between 2000-01-01 and 2050-01-01, in seconds (10 digits) or ms (13 digits).
_TS_MIN, _TS_MAX = 946_684_800, 2_524_608_000
_HOST_CACHE_MAX = 100_000


def is_timestamp_like(value: str) -> bool:
    """True for ``1700000000`` (seconds) or ``1700000000123`` (milliseconds), 2000-2050."""
    n = len(value)
    if (n != 10 and n != 13) or not value.isdigit():
        return False
    seconds = int(value) if n == 10 else int(value) // 1000
    return _TS_MIN <= seconds < _TS_MAX


@dataclass(frozen=True, slots=True)
class _Patterns:
    """Glob patterns (case-insensitive) with where each came from, for explanations."""

    items: tuple[tuple[str, str], ...]  # (pattern, source)
    regex: re.Pattern[str] | None

    @classmethod
    def of(cls, *groups: tuple[Sequence[str], str]) -> _Patterns:
        items = tuple((p.lower(), source) for patterns, source in groups for p in patterns)
        if not items:
            return cls((), None)
        regex = re.compile(
            "|".join(f"(?:{fnmatch.translate(p)})" for p, _ in items), re.IGNORECASE
        )
        return cls(items, regex)

    def match(self, name: str) -> bool:
        return self.regex is not None and self.regex.match(name) is not None

    def which(self, name: str) -> str:
        lowered = name.lower()
        for pattern, source in self.items:
            if fnmatch.fnmatchcase(lowered, pattern):
                return f"{source} {pattern!r}"
        return "?"  # pragma: no cover - only called after match()


@dataclass(frozen=True, slots=True)
class _Rules:
    domain: str | None
    keep: _Patterns
    drop: _Patterns
    only: _Patterns | None
    case_sensitive_path: bool
    drop_timestamps: bool


@dataclass(slots=True)
class KeyExplanation:
    """A key and the steps that made it, as ``crawlhub frontier key`` prints them."""

    key: str
    canonical_url: str
    steps: list[str] = field(default_factory=list)


class KeyResolver:
    """Turns a seed (or a URL) into its dedup key; see the module docstring for the rules.

    ``key()`` is the hot path (a fast w3lib-equal canonicalizer, cached per-host rules);
    ``explain()`` returns the same key plus the reason for every change.
    """

    def __init__(self, config: KeyConfig | None = None) -> None:
        self.config = config = config or KeyConfig()
        self._function: Callable[[Seed], str] | None = None
        if config.function:
            self._function = _load_function(config.function)
        self._default = _Rules(
            None,
            _Patterns.of((config.keep_params, "keep_params")),
            _Patterns.of(
                (config.volatile_params, "volatile_params"), (config.drop_params, "drop_params")
            ),
            None,
            True,
            config.drop_timestamp_values,
        )
        self._domains = {
            domain: self._domain_rules(domain, rules) for domain, rules in config.domains.items()
        }
        self._host_rules: dict[str, _Rules] = {}
        # (raw scheme, host, port) -> ("scheme://host[:port]" of the key, rules), or None
        # when such URLs need the general path
        self._heads: dict[tuple[str, str, str | None], tuple[str, _Rules] | None] = {}
        # (rules, parameter name) -> dropped by the rules' drop patterns
        self._dropped: dict[tuple[int, str], bool] = {}

    def _domain_rules(self, domain: str, rules: DomainKeyRules) -> _Rules:
        c = self.config
        where = f"domains.{domain}"
        return _Rules(
            domain,
            _Patterns.of((c.keep_params, "keep_params"), (rules.keep_params, f"{where}.keep_params")),
            _Patterns.of(
                (c.volatile_params, "volatile_params"),
                (c.drop_params, "drop_params"),
                (rules.drop_params, f"{where}.drop_params"),
            ),
            None
            if rules.only_params is None
            else _Patterns.of((rules.only_params, f"{where}.only_params")),
            rules.case_sensitive_path,
            c.drop_timestamp_values
            if rules.drop_timestamp_values is None
            else rules.drop_timestamp_values,
        )

    def _rules(self, host: str) -> _Rules:
        rules = self._host_rules.get(host)
        if rules is None:
            rules = self._default
            if self._domains:
                labels = host.rstrip(".").split(".")
                for i in range(len(labels)):
                    found = self._domains.get(".".join(labels[i:]))
                    if found is not None:
                        rules = found
                        break
            if len(self._host_rules) >= _HOST_CACHE_MAX:
                self._host_rules.clear()
            self._host_rules[host] = rules
        return rules

    # ------------------------------------------------------------------ public
    def key(self, seed: Seed | str) -> str:
        """The dedup key of ``seed`` (a Seed or a URL string)."""
        if isinstance(seed, str):
            if self._function is not None:
                return self._user_key(Seed(seed))
            return self._resolve(seed, "GET", None, None)
        if self._function is not None:
            return self._user_key(seed)
        return self._resolve(seed.url, seed.method, seed.body, None)

    def explain(self, seed: Seed | str) -> KeyExplanation:
        """The key of ``seed`` and, step by step, why it looks the way it does."""
        if isinstance(seed, str):
            seed = Seed(seed)
        if self._function is not None:
            return KeyExplanation(
                self._user_key(seed),
                str(canonicalize(seed.url)),
                [f"key from the user function {self.config.function} (key.function)"],
            )
        steps: list[str] = []
        key = self._resolve(seed.url, seed.method, seed.body, steps)
        return KeyExplanation(key, str(canonicalize(seed.url)), steps)

    def canonical_url(self, url: str) -> str:
        """``w3lib.url.canonicalize_url(url)``, computed by the fast path when it can."""
        return str(canonicalize(url))

    # ------------------------------------------------------------------ internals
    def _user_key(self, seed: Seed) -> str:
        assert self._function is not None
        try:
            key = self._function(seed)
        except Exception as exc:
            raise FrontierError(
                f"key.function {self.config.function} failed on {seed.url!r}: {exc!r}; "
                "fix the function or remove key.function"
            ) from exc
        if not isinstance(key, str) or not key:
            raise FrontierError(
                f"key.function {self.config.function} returned {key!r} for {seed.url!r}; "
                "it must return a non-empty string"
            )
        return key

    def _resolve(
        self, url: str, method: str, body: str | bytes | None, steps: list[str] | None
    ) -> str:
        url = url.strip()
        key = self._fast_key(url) if steps is None else None
        if key is None:
            key = self._general_key(url, steps)
        config = self.config
        if config.include_method:
            method = (method or "GET").upper()
            key = f"{method} {key}"
            if steps is not None:
                steps.append(f"method {method} put in the key (key.include_method)")
        if config.include_body and body:
            digest = xxhash.xxh3_64_hexdigest(body if isinstance(body, bytes) else body.encode())
            key = f"{key} body:{digest}"
            if steps is not None:
                steps.append(f"body hash {digest} put in the key (key.include_body)")
        return key

    def _fast_key(self, url: str) -> str | None:
        """The key of a plain http(s) URL whose query needs no decoding and no keep or
        only rules, without building its CanonicalURL: the hot path. None: the URL needs
        the general path (a property test holds the two equal)."""
        parts = fast_split(url)
        if parts is None:
            return None
        scheme, host, port, path, query = parts
        head_id = (scheme, host, port)
        try:
            head = self._heads[head_id]
        except KeyError:
            head = self._head(scheme, host, port)
            if len(self._heads) >= _HOST_CACHE_MAX:
                self._heads.clear()
            self._heads[head_id] = head
        if head is None:
            return None
        prefix, rules = head
        if not rules.case_sensitive_path:
            path = path.lower()
        if not query:
            return prefix + path
        if rules.keep.regex is not None or rules.only is not None or not is_plain_query(query):
            return None
        drop = rules.drop.regex
        stamps = rules.drop_timestamps
        dropped = self._dropped
        plus = "+" in query
        kept = []
        for field_ in query.split("&"):
            if not field_:
                continue
            name, sep, value = parts_ = field_.partition("=")
            if drop is not None:
                # names are matched '+'-decoded, as the general path decodes them
                ident = (id(rules), name.replace("+", " ") if plus else name)
                gone = dropped.get(ident)
                if gone is None:
                    gone = drop.match(ident[1]) is not None
                    if len(dropped) >= _HOST_CACHE_MAX:
                        dropped.clear()
                    dropped[ident] = gone
                if gone:
                    continue
            if stamps and len(value) in (10, 13) and is_timestamp_like(value):
                continue
            kept.append(parts_)
        if not kept:
            return prefix + path
        kept.sort()  # the order of all the fields, as w3lib sorts them, minus the dropped
        return prefix + path + "?" + "&".join([f"{k}={v}" for k, _, v in kept])

    def _head(self, scheme: str, host: str, port: str | None) -> tuple[str, _Rules] | None:
        authority = fast_authority(scheme, host, port)
        if authority is None:
            return None
        scheme, host = authority
        if port is not None and DEFAULT_PORTS.get(scheme) == port:
            port = None
        return (f"{scheme}://{host}:{port}" if port else f"{scheme}://{host}"), self._rules(host)

    def _general_key(self, url: str, steps: list[str] | None) -> str:
        c = canonicalize(url)
        rules = self._rules(c.host)
        if steps is not None:
            self._explain_canonical(url, c, rules, steps)
        port = c.port
        if port is not None and DEFAULT_PORTS.get(c.scheme) == port:
            port = ""
            if steps is not None:
                steps.append(f"default port :{c.port} of {c.scheme} dropped")
        path = c.path
        if not rules.case_sensitive_path:
            lowered = path.lower()
            if steps is not None and lowered != path:
                steps.append(f"path lower-cased (domains.{rules.domain}.case_sensitive_path: false)")
            path = lowered
        if not c.params:
            query = ""
        elif steps is None and rules.keep.regex is None and rules.only is None:
            # the common case, inlined: drop patterns and timestamp-like values only
            drop = rules.drop.regex.match if rules.drop.regex is not None else None
            stamps = rules.drop_timestamps
            kept = [
                text
                for name, value, text in c.params
                if not (
                    (drop is not None and drop(name))
                    or (stamps and len(value) in (10, 13) and is_timestamp_like(value))
                )
            ]
            query = "?" + "&".join(kept) if kept else ""
        else:
            kept = [p[2] for p in c.params if not self._drops(p[0], p[1], rules, steps)]
            query = "?" + "&".join(kept) if kept else ""
        if c.authority:
            return f"{c.scheme}://{c.netloc(port)}{path}{query}"
        return f"{c.scheme}:{path}{query}"

    @staticmethod
    def _drops(name: str, value: str, rules: _Rules, steps: list[str] | None) -> bool:
        if rules.keep.regex is not None and rules.keep.match(name):
            if steps is not None and (
                rules.drop.match(name) or (rules.drop_timestamps and is_timestamp_like(value))
            ):
                steps.append(f"param {name!r} kept ({rules.keep.which(name)})")
            return False
        reason = None
        if rules.only is not None and not rules.only.match(name):
            reason = f"not in domains.{rules.domain}.only_params"
        elif rules.drop.regex is not None and rules.drop.match(name):
            reason = rules.drop.which(name) if steps is not None else "drop"
        elif rules.drop_timestamps and is_timestamp_like(value):
            reason = f"timestamp-like value {value!r} (key.drop_timestamp_values)"
        if reason is None:
            return False
        if steps is not None:
            steps.append(f"param {name!r} dropped ({reason})")
        return True

    @staticmethod
    def _explain_canonical(url: str, c: CanonicalURL, rules: _Rules, steps: list[str]) -> None:
        how = "fast path, equal to w3lib" if c.fast else "w3lib"
        steps.append(f"canonicalized ({how}): {c}")
        scheme, sep, rest = url.partition("://")
        authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
        if sep and (scheme != scheme.lower() or authority != authority.lower()):
            steps.append("scheme and host lower-cased")
        if "#" in url:
            steps.append(f"fragment #{url.partition('#')[2]} dropped")
        raw_query = url.partition("#")[0].partition("?")[2]
        raw_names = [f.partition("=")[0] for f in raw_query.split("&") if f]
        if len(raw_names) > 1 and raw_names != sorted(raw_names):
            steps.append("query parameters sorted")
        if rules.domain is not None:
            steps.append(f"rules of domain {rules.domain!r} apply (key.domains)")


def _load_function(path: str) -> Callable[[Seed], str]:
    func: Any = import_object(path, key="frontier.key.function")
    if not callable(func):
        raise ConfigError(
            f"{path!r} is not callable: key.function must name a function taking a Seed "
            "and returning its key",
            key="frontier.key.function",
        )
    return func  # type: ignore[no-any-return]
