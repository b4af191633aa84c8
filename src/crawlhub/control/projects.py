"""Projects: a git remote whose release tags are built into artifacts for jobs (seed 001:
name, git URL, user name, password), stored on the control database.

The password (or token) and the webhook secret are stored encrypted
(:class:`crawlhub.control.secrets.SecretBox`, Fernet) and never leave this module in a
record: a :class:`Project` says ``has_password`` / ``has_webhook_secret``, and only the
build (:meth:`ProjectStore.credentials`) and the webhook check
(:meth:`ProjectStore.webhook_secret`) get them, as masked :class:`Secret` objects.

    store = await ProjectStore.open(db, secrets)
    await store.create(NewProject(name="shop", git_url="https://git.example/team/shop.git",
                                  username="ci", password="..."))
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from crawlhub.control import builders
from crawlhub.control.db import ControlDB
from crawlhub.control.hooks import (
    DEFAULT_TAG_PATTERN,
    DeliveryLog,
    TagPattern,
    ref_format_problems,
)
from crawlhub.control.secrets import Secret, SecretBox
from crawlhub.core.errors import ConflictError, CrawlhubError, NotFoundError
from crawlhub.core.hosts import is_loopback
from crawlhub.core.names import check_name
from crawlhub.core.redact import redact_url

#: A project name: letters, digits, '-', '_' and '.', starting with a letter or digit.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_RULE = ("1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit")
_SCP_RE = re.compile(r"^(?P<user>[A-Za-z0-9._-]+)@(?P<host>[A-Za-z0-9][A-Za-z0-9.-]*):"
                     r"(?P<path>[^\s]+)$")
_TRANSPORT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
MIN_WEBHOOK_SECRET = 8


class InvalidProject(CrawlhubError, ValueError):
    """A project (or build request) that cannot be accepted; the API answers 422."""


# ------------------------------------------------------------------------------ checks
def _bad_name(what: str) -> Callable[[Any], InvalidProject]:
    def error(name: Any) -> InvalidProject:
        shown = name[:80] if isinstance(name, str) else type(name).__name__
        return InvalidProject(f"{what} {shown!r} is not valid: use {NAME_RULE}")
    return error


def check_git_url(url: str) -> str:
    """``url`` if git may clone it for a project, else :class:`InvalidProject` saying why.

    Taken: ``https://``, ``ssh://``, ``user@host:path`` (scp-like ssh), ``file://`` and
    absolute local paths; ``http://`` only to a loopback host (a password must not cross a
    network in clear). Refused: transport helpers (``ext::sh -c ...`` runs commands),
    anything git could read as an option (``--upload-pack=...``), ``git://``, relative
    paths, and passwords inside the URL (they belong in the password field, encrypted).
    Messages never show a password."""
    if not isinstance(url, str) or not url:
        raise InvalidProject("git_url is empty")
    shown = redact_url(url)[:200]
    if len(url) > 2048:
        raise InvalidProject("git_url is over 2048 characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in url):
        raise InvalidProject(f"git_url {shown!r} holds spaces or control characters")
    if url.startswith("-"):
        raise InvalidProject(f"git_url {shown!r} starts with '-': git would read it as an"
                             " option")
    if _TRANSPORT_RE.match(url):
        raise InvalidProject(f"git_url {shown!r} names a git transport helper"
                             f" ({url.split('::', 1)[0]}::): refused, helpers such as ext::"
                             " run commands; use https://, ssh:// or a local path")
    if "://" in url:
        scheme = url.split("://", 1)[0].lower()
        rest = url.split("://", 1)[1]
        authority = rest.split("/", 1)[0]
        userinfo, at, hostport = authority.rpartition("@")
        if at and ":" in userinfo:
            raise InvalidProject(f"git_url {shown!r} holds a password: put it in the"
                                 " password field (stored encrypted), not in the URL")
        host = hostport
        if host.startswith("["):
            host = host.split("]", 1)[0] + "]"
        else:
            host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        if scheme == "file":
            if host not in ("", "localhost") or not rest[len(authority):].startswith("/"):
                raise InvalidProject(f"git_url {shown!r}: a file:// URL names a local"
                                     " absolute path (file:///srv/git/shop.git)")
            return url
        if scheme not in ("https", "ssh", "http"):
            raise InvalidProject(f"git_url {shown!r}: scheme {scheme}:// is not taken; use"
                                 " https://, ssh://, user@host:path, file:// or an absolute"
                                 " local path")
        if not host or not (host[0].isalnum() or host[0] == "["):
            raise InvalidProject(f"git_url {shown!r} has no valid host")
        if scheme == "http" and not is_loopback(host):
            raise InvalidProject(f"git_url {shown!r}: plain http:// is only taken for a"
                                 " loopback host (credentials would cross the network in"
                                 " clear); use https://")
        return url
    if url.startswith("/"):
        return url
    m = _SCP_RE.match(url)
    if m:
        return url
    raise InvalidProject(f"git_url {shown!r} is not a git URL crawlhub takes: use"
                         " https://host/path, ssh://host/path, user@host:path, file:///path"
                         " or an absolute local path")


def check_ref(ref: str, what: str = "ref") -> str:
    """``ref`` if git takes it as a branch or tag name (and never as an option)."""
    if not isinstance(ref, str) or not ref or ref.startswith("-") or len(ref) > 255:
        raise InvalidProject(f"{what} {str(ref)[:80]!r} is not a branch or tag name")
    problems = ref_format_problems(f"tags/{ref}")  # the same rules under heads/
    if problems:
        raise InvalidProject(f"{what} {ref[:80]!r} is not a valid git ref: it "
                             + "; ".join(problems))
    return ref


def check_tag_pattern(pattern: str) -> TagPattern:
    try:
        return TagPattern(pattern)
    except ValueError as exc:
        raise InvalidProject(str(exc)) from None


# ------------------------------------------------------------------------------ models
class BuilderSpec(BaseModel):
    """Which builder builds a project's tags, and its options
    (``crawlhub.control.builders``)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field("venv", description="venv, wheel, docker, image or command")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="the builder's options (see docs/projects.md)")

    @model_validator(mode="after")
    def _check(self) -> BuilderSpec:
        self.options = builders.check_options(self.name, self.options)
        return self


def _builder(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class _ProjectFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("name", "release_name", check_fields=False)
    @classmethod
    def _name(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_name(value, NAME_RE, _bad_name(str(info.field_name)))

    @field_validator("git_url", check_fields=False)
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_git_url(value)

    @field_validator("default_branch", check_fields=False)
    @classmethod
    def _branch(cls, value: str | None) -> str | None:
        return None if value is None else check_ref(value, "default_branch")

    @field_validator("tag_pattern", check_fields=False)
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None:
            check_tag_pattern(value)
        return value

    @field_validator("webhook_secret", check_fields=False)
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_WEBHOOK_SECRET:
            raise ValueError(f"webhook_secret must be at least {MIN_WEBHOOK_SECRET}"
                             " characters")
        return value

    @field_validator("builder", mode="before", check_fields=False)
    @classmethod
    def _builder_name(cls, value: Any) -> Any:
        return _builder(value)


class NewProject(_ProjectFields):
    """``POST /projects/``: a project to add. ``password`` (or a token) and
    ``webhook_secret`` are stored encrypted and never shown again."""

    name: str = Field(description=NAME_RULE, min_length=1, max_length=64,
                      examples=["shop"])
    git_url: str = Field(min_length=1, max_length=2048,
                         description="https://, ssh://, user@host:path, file:// or an"
                         " absolute path (http:// for loopback only)",
                         examples=["https://git.example.com/team/shop.git"])
    username: str | None = Field(None, max_length=256)
    password: SecretStr | None = Field(None, max_length=4096,
                                       description="password or token; write only")
    webhook_secret: SecretStr | None = Field(
        None, max_length=4096, description="the secret the forge signs hooks with (GitHub,"
        f" Gitea) or sends (GitLab); write only; at least {MIN_WEBHOOK_SECRET} characters;"
        " without one every hook is refused")
    default_branch: str = Field("main", min_length=1, max_length=255)
    tag_pattern: str | None = Field(None, max_length=255, description="release tags that"
                                    " run a build (default control.tag_pattern,"
                                    f" {DEFAULT_TAG_PATTERN})")
    release_name: str | None = Field(None, max_length=64, description="the {name} a"
                                     " release tag must carry (default: the project name)")
    builder: BuilderSpec | None = Field(None, description="default control.builder")


class ProjectUpdate(_ProjectFields):
    """``PATCH /projects/{name}``: the fields sent are changed; ``password`` or
    ``webhook_secret`` null removes it; ``tag_pattern`` / ``release_name`` null go back
    to the default."""

    git_url: str | None = Field(None, min_length=1, max_length=2048)
    username: str | None = Field(None, max_length=256)
    password: SecretStr | None = Field(None, max_length=4096)
    webhook_secret: SecretStr | None = Field(None, max_length=4096)
    default_branch: str | None = Field(None, min_length=1, max_length=255)
    tag_pattern: str | None = Field(None, max_length=255)
    release_name: str | None = Field(None, max_length=64)
    builder: BuilderSpec | None = None

    @model_validator(mode="after")
    def _not_null(self) -> ProjectUpdate:
        for name in ("git_url", "default_branch", "builder"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be null")
        return self


class Project(BaseModel):
    """A project as every reader sees it: no password, no webhook secret."""

    name: str
    git_url: str = Field(description="its git remote; empty for a project whose versions"
                         " are uploaded (Scrapyd's addversion.json)")
    username: str | None
    has_password: bool
    has_webhook_secret: bool
    default_branch: str
    tag_pattern: str = Field(description="the release tag pattern in force")
    release_name: str = Field(description="the {name} its release tags carry")
    builder: BuilderSpec
    hook_path: str = Field(description="where its forge posts webhooks")
    created: float
    updated: float

    def pattern(self) -> TagPattern:
        return TagPattern(self.tag_pattern)

    def release(self, tag: str) -> tuple[str | None, str]:
        """The version a release tag of this project names, or (None, why not)."""
        fields = self.pattern().match(tag)
        if fields is None:
            return None, f"tag {tag!r} does not match the pattern {self.tag_pattern!r}"
        if "name" in fields and fields["name"] != self.release_name:
            return None, (f"tag {tag!r} is a release of {fields['name']!r}, not of"
                          f" {self.release_name!r}")
        return fields["version"], ""


class Credentials(BaseModel):
    """What a clone needs; ``password`` masked unless revealed."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    username: str | None
    password: Secret | None


# ------------------------------------------------------------------------------ the store
_COLUMNS = ("name, git_url, username, password, webhook_secret, default_branch, tag_pattern,"
            " release_name, builder, created, updated")


class ProjectStore:
    """Projects on a :class:`ControlDB` (table ``projects``), secrets encrypted with
    ``secrets``; ``tag_pattern`` and ``builder`` are the defaults (``control.*``)."""

    def __init__(self, db: ControlDB, secrets: SecretBox, *,
                 tag_pattern: str = DEFAULT_TAG_PATTERN, builder: str = "venv") -> None:
        self.db = db
        self.secrets = secrets
        self.table = db.table("projects")
        #: webhook deliveries seen within a day (a repeat builds nothing)
        self.deliveries = DeliveryLog(db)
        self.default_pattern = check_tag_pattern(tag_pattern).pattern
        builders.check_options(builder, {})
        self.default_builder = builder

    @classmethod
    async def open(cls, db: ControlDB, secrets: SecretBox, **kwargs: Any) -> ProjectStore:
        store = cls(db, secrets, **kwargs)
        await store.create_schema()
        return store

    async def create_schema(self) -> None:
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {self.table} ("
            " name TEXT PRIMARY KEY, git_url TEXT NOT NULL, username TEXT, password TEXT,"
            " webhook_secret TEXT, default_branch TEXT NOT NULL, tag_pattern TEXT,"
            " release_name TEXT, builder TEXT NOT NULL,"
            " created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL)"])
        await self.deliveries.create_schema()

    def _by_name(self) -> str:
        # byte order on both backends: a page cursor means the same thing everywhere
        return 'name COLLATE "C"' if self.db.dialect == "postgresql" else "name"

    # -- writes ----------------------------------------------------------------------
    async def create(self, spec: NewProject) -> Project:
        now = time.time()
        builder = spec.builder or BuilderSpec(name=self.default_builder)
        rows = await self.db.fetch(
            f"INSERT INTO {self.table} ({_COLUMNS}) VALUES"
            " ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)"
            " ON CONFLICT (name) DO NOTHING RETURNING name",
            spec.name, spec.git_url, spec.username, self._seal(spec.password),
            self._seal(spec.webhook_secret), spec.default_branch, spec.tag_pattern,
            spec.release_name, json.dumps(builder.model_dump()), now)
        if not rows:
            raise ConflictError(f"project {spec.name!r} exists already; change it with"
                                f" PATCH /projects/{spec.name} or remove it first")
        return await self.get(spec.name)

    async def create_uploaded(self, name: str) -> Project:
        """A project without a git remote (``git_url`` empty), whose versions are
        uploaded, not built from tags: what Scrapyd's ``addversion.json`` makes for a
        project it has not seen. ``ConflictError`` when the name is taken."""
        check_name(name, NAME_RE, _bad_name("project"))
        now = time.time()
        rows = await self.db.fetch(
            f"INSERT INTO {self.table} ({_COLUMNS}) VALUES"
            " ($1, '', NULL, NULL, NULL, 'main', NULL, NULL, $2, $3, $3)"
            " ON CONFLICT (name) DO NOTHING RETURNING name",
            name, json.dumps(BuilderSpec(name=self.default_builder).model_dump()), now)
        if not rows:
            raise ConflictError(f"project {name!r} exists already")
        return await self.get(name)

    async def update(self, name: str, patch: ProjectUpdate) -> Project:
        check_found(name)
        sets: list[str] = []
        args: list[Any] = []
        for field in sorted(patch.model_fields_set):
            value = getattr(patch, field)
            if field in ("password", "webhook_secret"):
                value = self._seal(value)
            elif field == "builder":
                value = json.dumps(value.model_dump())
            args.append(value)
            sets.append(f"{field} = ${len(args)}")
        args.append(time.time())
        sets.append(f"updated = ${len(args)}")
        args.append(name)
        changed = await self.db.execute(
            f"UPDATE {self.table} SET {', '.join(sets)} WHERE name = ${len(args)}", *args)
        if not changed:
            raise _missing(name)
        return await self.get(name)

    async def delete(self, name: str) -> None:
        """Remove the project row (``BuildService.delete_project`` removes its builds)."""
        check_found(name)
        if not await self.db.execute(f"DELETE FROM {self.table} WHERE name = $1", name):
            raise _missing(name)

    def _seal(self, value: SecretStr | None) -> str | None:
        if value is None or not value.get_secret_value():
            return None
        return self.secrets.encrypt(value.get_secret_value())

    # -- reads -----------------------------------------------------------------------
    async def get(self, name: str) -> Project:
        row = await self._row(name)
        return self._project(row)

    async def list(self, *, limit: int = 100, after: str | None = None) -> list[Project]:
        """Projects by name, ``limit`` at most, those after ``after`` (a page cursor)."""
        order = self._by_name()
        if after is None:
            rows = await self.db.fetch(
                f"SELECT {_COLUMNS} FROM {self.table} ORDER BY {order} LIMIT $1", limit)
        else:
            rows = await self.db.fetch(
                f"SELECT {_COLUMNS} FROM {self.table} WHERE {order} > $1"
                f" ORDER BY {order} LIMIT $2", after, limit)
        return [self._project(r) for r in rows]

    async def count(self) -> int:
        row = await self.db.fetchone(f"SELECT COUNT(*) FROM {self.table}")
        return int(row[0]) if row else 0

    async def credentials(self, name: str) -> Credentials:
        row = await self._row(name)
        return Credentials(username=row[2], password=self._open(row[3], name, "password"))

    async def webhook_secret(self, name: str) -> Secret | None:
        """The project's webhook secret; None when it has none (or does not exist)."""
        if not NAME_RE.match(name or ""):
            return None
        row = await self.db.fetchone(
            f"SELECT webhook_secret FROM {self.table} WHERE name = $1", name)
        return self._open(row[0], name, "webhook secret") if row else None

    async def _row(self, name: str) -> tuple[Any, ...]:
        check_found(name)
        row = await self.db.fetchone(f"SELECT {_COLUMNS} FROM {self.table} WHERE name = $1",
                                     name)
        if row is None:
            raise _missing(name)
        return row

    def _open(self, token: str | None, name: str, what: str) -> Secret | None:
        if not token:
            return None
        return self.secrets.decrypt(token, what=f"the {what} of project {name!r}")

    def _project(self, row: tuple[Any, ...]) -> Project:
        (name, git_url, username, password, secret, branch, pattern, release, builder,
         created, updated) = row
        spec = json.loads(builder)
        return Project(
            name=name, git_url=git_url, username=username, has_password=bool(password),
            has_webhook_secret=bool(secret), default_branch=branch,
            tag_pattern=pattern or self.default_pattern, release_name=release or name,
            builder=BuilderSpec.model_construct(name=spec["name"],
                                                options=spec.get("options") or {}),
            hook_path=f"/hooks/{name}", created=float(created), updated=float(updated))


def _missing(name: str) -> NotFoundError:
    return NotFoundError(f"no project named {name!r}; add it with POST /projects/")


def check_found(name: str) -> None:
    """A name that cannot be a project's is a 404 (never echoed beyond 80 characters)."""
    def error(name: Any) -> NotFoundError:
        shown = name[:80] if isinstance(name, str) else ""
        return NotFoundError(f"no project named {shown!r} (a name is {NAME_RULE})")
    check_name(name, NAME_RE, error)

