"""Forge webhooks: verify a push or tag event from GitHub, GitLab or Gitea, read its ref,
and match release tags against a project's pattern.

Verification is the first thing done with a request and needs only its headers and raw
body; nothing is parsed before it passed:

- **GitHub**: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 of the body with the
  hook's secret.
- **Gitea** (and Forgejo, Gogs): ``X-Gitea-Signature`` (or ``X-Gogs-Signature``): the
  same HMAC as bare hex; newer Gitea sends GitHub's header too, which is accepted.
- **GitLab**: ``X-Gitlab-Token``: the secret itself (GitLab signs nothing).

Every comparison is constant-time (``hmac.compare_digest``). A missing, malformed or
wrong signature is a :class:`HookRejected` (the API answers 401 and runs nothing).

**Tag patterns.** Seed 001 names releases ``{Release}:{Name}:{Version}``, but git forbids
``:`` in ref names (``git check-ref-format`` refuses ``refs/tags/Release:a:1``), so no forge
can ever send such a tag. The default pattern is ``release/{name}/{version}``; a pattern
is checked when it is configured, with :func:`ref_format_problems` (git's rules), so one
that could never match is an error at once rather than a hook that never fires.

**Replays.** A verified request is remembered for :data:`DELIVERY_KEEP` (a day) in the
control database (:class:`DeliveryLog`), under its forge's delivery id
(``X-GitHub-Delivery``, ``X-Gitea-Delivery``, GitLab's ``Idempotency-Key`` or
``X-Gitlab-Event-UUID``) and under the SHA-256 of its body: the id is not signed, so a
captured body sent again under a new id is the same delivery. A repeat builds nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from crawlhub.core import jsoncodec
from crawlhub.core.errors import CrawlhubError

if TYPE_CHECKING:
    from crawlhub.control.db import ControlDB

DEFAULT_TAG_PATTERN = "release/{name}/{version}"
FORGES = ("github", "gitlab", "gitea")
#: The placeholders a tag pattern may use, and what each matches.
_FIELDS = {"name": r"[^/]+", "version": r"[^/]+", "release": r"[^/]+"}
#: Characters git forbids anywhere in a ref name (besides control characters).
_FORBIDDEN = set(" ~^:?*[\\")
#: Seconds a delivery is remembered: a repeat within them builds nothing.
DELIVERY_KEEP = 86400.0
#: Each forge's delivery id headers, most specific first (GitLab's Idempotency-Key stays
#: the same across its retries; Gitea sends GitHub's header too).
DELIVERY_HEADERS = {"github": ("X-GitHub-Delivery",),
                    "gitea": ("X-Gitea-Delivery", "X-Gogs-Delivery", "X-GitHub-Delivery"),
                    "gitlab": ("Idempotency-Key", "X-Gitlab-Event-UUID")}


class HookRejected(CrawlhubError):
    """A webhook request that is not verifiably from the project's forge (401)."""


class HookError(CrawlhubError):
    """A verified webhook request that cannot be understood (400)."""


@dataclass(frozen=True)
class Push:
    """What a verified push or tag event says."""

    forge: str
    event: str
    ref: str  # full ref: refs/tags/... or refs/heads/...
    commit: str  # the commit the ref points to now ('' when deleted)
    repository: str  # the clone URL the forge names
    deleted: bool = False

    @property
    def tag(self) -> str | None:
        return self.ref[len("refs/tags/"):] if self.ref.startswith("refs/tags/") else None

    @property
    def branch(self) -> str | None:
        return self.ref[len("refs/heads/"):] if self.ref.startswith("refs/heads/") else None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def forge_of(headers: Mapping[str, str]) -> str:
    """Which forge sent the request, by its event header."""
    if _header(headers, "X-Gitea-Event") or _header(headers, "X-Gogs-Event"):
        return "gitea"  # Gitea also sends X-GitHub-Event: test it first
    if _header(headers, "X-Gitlab-Event"):
        return "gitlab"
    if _header(headers, "X-GitHub-Event"):
        return "github"
    raise HookRejected("no forge event header (X-GitHub-Event, X-Gitlab-Event or"
                       " X-Gitea-Event): not a webhook of a supported forge")


def _hmac_hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def verify(headers: Mapping[str, str], body: bytes, secret: str) -> str:
    """Check that ``body`` was sent by the forge holding ``secret``; returns the forge.

    Raises :class:`HookRejected` when it was not (or cannot be told)."""
    if not secret:
        raise HookRejected("the project has no webhook secret: every hook is refused")
    forge = forge_of(headers)
    if forge == "gitlab":
        token = _header(headers, "X-Gitlab-Token")
        if token is None:
            raise HookRejected("GitLab hook without X-Gitlab-Token")
        if not _same(token, secret):
            raise HookRejected("GitLab hook with a wrong X-Gitlab-Token")
        return forge
    expected = _hmac_hex(secret, body)
    signature = _header(headers, "X-Hub-Signature-256")
    if signature is not None:
        if not signature.startswith("sha256="):
            raise HookRejected("X-Hub-Signature-256 is not 'sha256=<hex>'")
        if not _same(signature[len("sha256="):].strip(), expected):
            raise HookRejected("bad signature (X-Hub-Signature-256)")
        return forge
    if forge == "gitea":
        signature = _header(headers, "X-Gitea-Signature") or _header(headers, "X-Gogs-Signature")
        if signature is None:
            raise HookRejected("Gitea hook without X-Gitea-Signature")
        if not _same(signature.strip(), expected):
            raise HookRejected("bad signature (X-Gitea-Signature)")
        return forge
    raise HookRejected("GitHub hook without X-Hub-Signature-256 (set a secret on the hook)")


def parse(forge: str, headers: Mapping[str, str], body: bytes) -> Push | None:
    """The push a verified hook describes; None for events that are not pushes (ping,
    issues, ...): they are acknowledged and ignored."""
    event = (_header(headers, "X-Gitea-Event") or _header(headers, "X-Gogs-Event")
             or _header(headers, "X-Gitlab-Event") or _header(headers, "X-GitHub-Event") or "")
    payload = load(forge, event, body)  # every event: a signed request is a JSON object
    if forge == "gitlab":
        if event not in ("Push Hook", "Tag Push Hook"):
            return None
    elif event != "push":
        return None
    ref = payload.get("ref")
    if not isinstance(ref, str) or not ref.startswith("refs/"):
        raise HookError(f"the {forge} {event!r} payload has no 'ref' of the form refs/...")
    zeros = "0" * 40
    if forge == "gitlab":
        commit = payload.get("checkout_sha") or payload.get("after") or ""
        project = payload.get("project") or payload.get("repository") or {}
        repo = _first_str(project, "git_http_url", "http_url", "git_ssh_url", "url")
    else:
        commit = payload.get("after") or ""
        repo = _first_str(payload.get("repository") or {}, "clone_url", "html_url", "ssh_url")
    commit = commit if isinstance(commit, str) else ""
    deleted = bool(payload.get("deleted")) or commit in ("", zeros)
    return Push(forge=forge, event=event, ref=ref, commit="" if deleted else commit,
                repository=repo, deleted=deleted)


def load(forge: str, event: str, body: bytes) -> dict[str, Any]:
    """The JSON object of a verified request; :class:`HookError` (400) when it is not
    one, or nests deeper than :data:`crawlhub.core.jsoncodec.MAX_DEPTH`."""
    what = f"the {forge} {event[:100]!r} payload"
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise HookError(f"{what} is not JSON: {exc}") from None
    except RecursionError:  # the C decoder gives up near 1000 levels
        raise HookError(str(jsoncodec.TooDeepError(what))) from None
    if not isinstance(payload, dict):
        raise HookError(f"{what} is not a JSON object")
    if jsoncodec.too_deep(payload):
        raise HookError(str(jsoncodec.TooDeepError(what)))
    return payload


def delivery_keys(forge: str, headers: Mapping[str, str], body: bytes) -> list[str]:
    """What a delivery is remembered by: its forge's delivery id (when it sent one) and
    the SHA-256 of its body."""
    keys = []
    for name in DELIVERY_HEADERS.get(forge, ()):
        value = _header(headers, name)
        if value and value.strip():
            keys.append(f"{forge}:{value.strip()[:200]}")
            break
    keys.append("sha256:" + hashlib.sha256(body).hexdigest())
    return keys


class DeliveryLog:
    """Webhook deliveries seen within ``keep`` seconds, per project, in the control
    database (table ``hook_deliveries``): :meth:`claim` is one upsert per key, so two
    copies of a delivery arriving together build once. Older rows are pruned as new
    ones come."""

    def __init__(self, db: ControlDB, *, keep: float = DELIVERY_KEEP,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.keep = keep
        self.clock = clock
        self.table = db.table("hook_deliveries")

    async def create_schema(self) -> None:
        t = self.table
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {t} (project TEXT NOT NULL, key TEXT NOT NULL,"
            " seen DOUBLE PRECISION NOT NULL, PRIMARY KEY (project, key))",
            f"CREATE INDEX IF NOT EXISTS {t}_seen ON {t} (seen)"])

    async def claim(self, project: str, keys: Sequence[str]) -> float | None:
        """The time ``project``'s delivery known by ``keys`` was claimed at, or None when
        one of its keys was seen within ``keep`` seconds (a duplicate)."""
        now = float(self.clock())
        cutoff = now - self.keep
        await self.db.execute(f"DELETE FROM {self.table} WHERE seen < $1", cutoff)
        fresh = True
        for key in keys:
            row = await self.db.fetchone(
                f"INSERT INTO {self.table} (project, key, seen) VALUES ($1, $2, $3)"
                " ON CONFLICT (project, key) DO UPDATE SET seen = excluded.seen"
                f" WHERE {self.table}.seen <= $4 RETURNING seen",
                project, key, now, cutoff)
            fresh = fresh and row is not None
        return now if fresh else None

    async def release(self, project: str, keys: Sequence[str], claim: float) -> None:
        """Forget a claim whose delivery failed, so the forge's retry is handled."""
        for key in keys:
            await self.db.execute(
                f"DELETE FROM {self.table} WHERE project = $1 AND key = $2 AND seen = $3",
                project, key, claim)

    async def count(self) -> int:
        row = await self.db.fetchone(f"SELECT COUNT(*) FROM {self.table}")
        return int(row[0]) if row else 0


def _first_str(obj: Any, *names: str) -> str:
    if isinstance(obj, dict):
        for name in names:
            value = obj.get(name)
            if isinstance(value, str) and value:
                return value
    return ""


def ref_format_problems(name: str) -> list[str]:
    """Why ``name`` (a ref below ``refs/``, e.g. ``tags/release/a/1``) is not a valid git
    ref name, by the rules of ``git check-ref-format``; empty when it is valid."""
    problems = []
    if not name:
        return ["is empty"]
    if name == "@":
        problems.append("is '@'")
    bad = sorted({c for c in name if c in _FORBIDDEN or ord(c) < 0x20 or ord(c) == 0x7f})
    if bad:
        problems.append("contains " + ", ".join(repr(c) for c in bad)
                        + " (git forbids space, ~ ^ : ? * [ \\ and control characters)")
    if ".." in name:
        problems.append("contains '..'")
    if "@{" in name:
        problems.append("contains '@{'")
    if name.startswith("/") or name.endswith("/") or "//" in name:
        problems.append("has an empty path component")
    if name.endswith("."):
        problems.append("ends with '.'")
    for part in name.split("/"):
        if part.startswith("."):
            problems.append(f"has a component starting with '.' ({part!r})")
        if part.endswith(".lock"):
            problems.append(f"has a component ending with '.lock' ({part!r})")
    if "/" not in name:
        problems.append("has one component (git wants refs/<kind>/<name>)")
    return problems


class TagPattern:
    """A release tag pattern such as ``release/{name}/{version}``.

    ``{name}``, ``{version}`` and ``{release}`` each match one path component; every other
    character is literal. ``match(tag)`` gives the fields, or None."""

    def __init__(self, pattern: str = DEFAULT_TAG_PATTERN) -> None:
        self.pattern = pattern
        if ":" in pattern:  # before the fields: seed 001's {Release} is no field of ours
            raise ValueError(
                f"tag pattern {pattern!r} can never match a git tag: git forbids ':' in ref"
                " names (git check-ref-format refuses refs/tags/Release:shop:1.0), so seed"
                " 001's {Release}:{Name}:{Version} cannot be sent by any forge; use"
                f" {DEFAULT_TAG_PATTERN}")
        fields = re.findall(r"\{([^{}]*)\}", pattern)
        unknown = [f for f in fields if f not in _FIELDS]
        if unknown:
            raise ValueError(f"tag pattern {pattern!r}: unknown field(s) "
                             f"{', '.join(map(repr, unknown))}; use {{name}}, {{version}}"
                             " and {release}")
        if len(set(fields)) != len(fields):
            raise ValueError(f"tag pattern {pattern!r}: a field appears twice")
        if "version" not in fields:
            raise ValueError(f"tag pattern {pattern!r}: needs a {{version}}")
        sample = pattern
        for f in fields:
            sample = sample.replace("{" + f + "}", "x")
        if "{" in sample or "}" in sample:
            raise ValueError(f"tag pattern {pattern!r}: unbalanced braces")
        problems = ref_format_problems(f"tags/{sample}")
        if problems:
            raise ValueError(f"tag pattern {pattern!r} can never match a git tag: it"
                             f" {'; '.join(problems)}")
        regex = ""
        for piece in re.split(r"(\{[^{}]*\})", pattern):
            if piece.startswith("{") and piece.endswith("}"):
                regex += f"(?P<{piece[1:-1]}>{_FIELDS[piece[1:-1]]})"
            else:
                regex += re.escape(piece)
        self._regex = re.compile(regex)
        self.fields = tuple(fields)

    def __repr__(self) -> str:
        return f"TagPattern({self.pattern!r})"

    def match(self, tag: str) -> dict[str, str] | None:
        m = self._regex.fullmatch(tag)
        return m.groupdict() if m else None

    def tag(self, **fields: str) -> str:
        """The tag for ``fields`` (the inverse of ``match``)."""
        out = self.pattern
        for name in self.fields:
            value = fields[name]
            if "/" in value or not value:
                raise ValueError(f"{name} {value!r}: one non-empty path component")
            out = out.replace("{" + name + "}", value)
        return out
