"""What alerts are about: route specs and their validation, events (and the events of a
finished run), stored routes and delivery rows. Imports nothing else of the package."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from crawlhub.control.secrets import Secret
from crawlhub.core import names
from crawlhub.core.configtypes import new_list
from crawlhub.core.errors import CrawlhubError

EventKind = Literal["run_failed", "run_no_items", "run_over_time", "agent_dead",
                    "queue_stalled"]
#: The events a route can ask for.
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
#: Events about one run of a job (routed by the route's ``jobs`` patterns).
RUN_EVENTS = frozenset({"run_failed", "run_no_items", "run_over_time"})
#: The kind of the test button's message (never routed: only :meth:`AlertService.test`).
TEST_KIND = "test"
TargetKind = Literal["webhook", "email"]

MAX_SUBJECT = 200          # characters of a subject line (the email's Subject)
MAX_MESSAGE = 4000         # characters of a message body
MAX_DETAIL_TEXT = 1000     # characters of one text value in details
MAX_DETAILS = 8000         # characters of the details as JSON
MAX_RECIPIENTS = 20
MAX_PATTERNS = 100
MAX_PATTERN = 200
MAX_URL = 2048
MAX_REDIRECTS = 3
#: Status of a delivery row.
SENT, FAILED = "sent", "failed"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDRESS = re.compile(rf"^[A-Za-z0-9.!#$%&'*+/=?^_`{{|}}~-]{{1,64}}@{_LABEL}(?:\.{_LABEL})*$")
#: Control characters (and the Unicode line separators): never in a name, URL or subject.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class AlertError(CrawlhubError):
    """An alert route that cannot be stored as given (the API answers 422)."""


# -- validation: one set of checks for the API, the CLI and the service ----------------
def _bad_name(_: object) -> ValueError:
    return ValueError("a route name is 1 to 64 letters, digits, '.', '_' or '-',"
                      " starting with a letter or digit")


def check_name(value: str) -> str:
    return names.check_name(value, _NAME, _bad_name)


def check_webhook_url(value: str) -> str:
    """``value`` if it is an absolute http(s) URL with a host. Messages never repeat the
    URL: it may hold a token."""
    if len(value) > MAX_URL:
        raise ValueError(f"a webhook URL is at most {MAX_URL} characters")
    if CONTROL_CHARS.search(value) or any(c.isspace() for c in value):
        raise ValueError("a webhook URL holds no spaces or control characters")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ValueError("the webhook URL is not a valid URL (a bad port or host)") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = scheme if re.fullmatch(r"[a-z][a-z0-9+.-]{0,20}", scheme) else "?"
        raise ValueError(f"a webhook URL must start with https:// or http://, not {shown}://"
                         if scheme else "a webhook URL must start with https:// or http://")
    if not parts.hostname:
        raise ValueError("the webhook URL has no host")
    if port == 0:
        raise ValueError("the webhook URL's port is 0")
    return value


def check_address(value: str) -> str:
    if len(value) > 254 or not _ADDRESS.match(value):
        raise ValueError("an email address looks like name@example.com (ASCII, no spaces,"
                         " commas or display names)")
    return value


def check_pattern(value: str) -> str:
    if not value or len(value) > MAX_PATTERN or CONTROL_CHARS.search(value):
        raise ValueError(f"a job or queue pattern is 1 to {MAX_PATTERN} printable characters"
                         " (glob: * ? [...])")
    return value


def mask_url(url: str) -> str:
    """What may be shown of a webhook URL: its scheme, host and port."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "***"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme.lower()}://{host}{port}/***"


def _unique(values: list[Any] | None) -> list[Any] | None:
    return None if values is None else list(dict.fromkeys(values))


# -- route specs ----------------------------------------------------------------------
RouteName = Annotated[str, AfterValidator(check_name)]
Address = Annotated[str, AfterValidator(check_address)]
Pattern = Annotated[str, AfterValidator(check_pattern)]


class _RouteFields(BaseModel):
    """The checks a new route and a change share: a webhook URL checked without being
    repeated, lists without duplicates."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("url", check_fields=False)
    @classmethod
    def _url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_webhook_url(value.get_secret_value())
        return value

    @field_validator("to", "events", "jobs", "queues", check_fields=False)
    @classmethod
    def _dedupe(cls, value: list[Any] | None) -> list[Any] | None:
        return _unique(value)


class RouteSpec(_RouteFields):
    """An alert route as given (``POST /alerts/``, ``crawlhub alerts add``)."""

    name: RouteName = Field(description="the route's name: letters, digits, '.', '_', '-'")
    kind: TargetKind = Field(description="webhook (Slack-compatible JSON) or email (SMTP)")
    url: SecretStr | None = Field(None, description="webhook: its http(s) URL; a secret,"
                                  " stored encrypted and never shown again")
    to: list[Address] = Field(default_factory=new_list, max_length=MAX_RECIPIENTS,
                              description="email: the recipients")
    events: list[EventKind] = Field(default_factory=lambda: list(EVENT_KINDS), min_length=1,
                                    description="the events this route gets (default: all)")
    jobs: list[Pattern] = Field(default_factory=new_list, max_length=MAX_PATTERNS,
                                description="run events: job names or glob patterns"
                                " (empty: every job)")
    queues: list[Pattern] = Field(default_factory=new_list, max_length=MAX_PATTERNS,
                                  description="queue_stalled: queue names or glob patterns"
                                  " (empty: every queue)")
    enabled: bool = True

    @model_validator(mode="after")
    def _target(self) -> RouteSpec:
        if self.kind == "webhook":
            if self.url is None:
                raise ValueError("a webhook route needs a url")
            if self.to:
                raise ValueError("a webhook route takes no 'to' (that is for email routes)")
        else:
            if not self.to:
                raise ValueError("an email route needs at least one address in 'to'")
            if self.url is not None:
                raise ValueError("an email route takes no url (that is for webhook routes)")
        return self


class RoutePatch(_RouteFields):
    """Changes to a route (``PATCH /alerts/{name}``): the fields given replace the stored
    ones; switching ``kind`` drops the other kind's target."""

    kind: TargetKind | None = None
    url: SecretStr | None = None
    to: list[Address] | None = Field(None, max_length=MAX_RECIPIENTS)
    events: list[EventKind] | None = Field(None, min_length=1)
    jobs: list[Pattern] | None = Field(None, max_length=MAX_PATTERNS)
    queues: list[Pattern] | None = Field(None, max_length=MAX_PATTERNS)
    enabled: bool | None = None


def make_spec(data: Mapping[str, Any]) -> RouteSpec:
    """``data`` as a :class:`RouteSpec`; :class:`AlertError` naming every problem."""
    try:
        return RouteSpec.model_validate(data)
    except ValidationError as exc:
        raise AlertError(f"alert route {data.get('name')!r}: {problems(exc)}") from None


def problems(exc: ValidationError) -> str:
    """A pydantic error as one line per problem, without the input (it may be a secret)."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        lines.append(f"{where}: {msg}" if where else msg)
    return "; ".join(lines)


# -- records --------------------------------------------------------------------------
@dataclass(slots=True)
class AlertEvent:
    """Something an operator should hear about.

    ``kind``: one of :data:`EVENT_KINDS`. ``job`` / ``run``: the job's name and the run's
    code (run events); ``agent``: the agent's id (``agent_dead``); ``queue``: the queue's
    name (``queue_stalled``). ``subject``: one line (the email's Subject, the bold first
    line on Slack); ``message``: the text; ``details``: JSON-able facts (exit code,
    counters...), sent as they are under ``crawlhub.details`` (secret-like keys masked).
    ``ts``: epoch seconds; None: when notified.
    """

    kind: str
    job: str | None = None
    run: str | None = None
    subject: str = ""
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    ts: float | None = None
    agent: str | None = None
    queue: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS and self.kind != TEST_KIND:
            raise ValueError(f"alert event kind {self.kind!r} is not one of"
                             f" {', '.join(EVENT_KINDS)}")

    @property
    def about(self) -> str:
        """What the event is about, the de-duplication key: ``job:<name>``,
        ``agent:<id>`` or ``queue:<name>``."""
        if self.kind == "agent_dead":
            key = f"agent:{self.agent or ''}"
        elif self.kind == "queue_stalled":
            key = f"queue:{self.queue or ''}"
        else:
            key = f"job:{self.job or ''}"
        return key[:300]


def run_event(kind: str, /, *, job: str, run: str | None = None, message: str = "",
              ts: float | None = None, details: Mapping[str, Any] | None = None,
              **more: Any) -> AlertEvent:
    """The event of a run of ``job`` (``kind`` one of ``run_failed``, ``run_no_items``,
    ``run_over_time``) with a subject that says what happened; ``details`` and ``more``
    as given (``exit_code=2``, ``timeout=600``, ``counters={...}``)."""
    if kind not in RUN_EVENTS:
        raise ValueError(f"{kind!r} is not a run event ({', '.join(sorted(RUN_EVENTS))})")
    what = {"run_failed": "failed", "run_no_items": "produced no items",
            "run_over_time": "is over its time limit"}[kind]
    subject = f"job {job}: run {run} {what}" if run else f"job {job}: a run {what}"
    return AlertEvent(kind=kind, job=job, run=run, subject=subject, message=message,
                      details={**(details or {}), **more}, ts=ts)


#: Counters that count a run's items (crawlhub.sdk, collect, Scrapy's stats).
ITEM_COUNTERS = ("items", "item_scraped_count", "items_written", "records_written")
#: Stats only a Scrapy run reports: it has run, and Scrapy leaves out a zero item count.
_SCRAPY_STATS = ("finish_reason", "response_received_count")


def run_events(spec: Any, run: Any) -> list[AlertEvent]:
    """The events of a finished run (a ``JobSpec`` and a ``RunRecord``, or anything with
    their fields): ``run_over_time`` for status ``timeout``; ``run_failed`` for
    ``failed`` and ``lost``; ``run_no_items`` for ``succeeded`` when no item counter
    (:data:`ITEM_COUNTERS`) is above 0 although the run reported one (or Scrapy stats).
    A run that reports no counters at all cannot be told empty: no event. Cancelled and
    skipped runs are no alerts."""
    status = str(getattr(run, "status", ""))
    counters = dict(getattr(run, "counters", None) or {})
    job = str(getattr(spec, "name", None) or getattr(run, "job", ""))
    details: dict[str, Any] = {
        "status": status, "exit_code": getattr(run, "exit_code", None),
        "kind": getattr(run, "kind", None), "trigger": getattr(run, "trigger", None),
        "host": getattr(run, "host", None), "version": getattr(run, "version", None),
        "started_at": getattr(run, "started_at", None),
        "finished_at": getattr(run, "finished_at", None), "counters": counters}
    started, finished = details["started_at"], details["finished_at"]
    if isinstance(started, int | float) and isinstance(finished, int | float):
        details["duration"] = round(finished - started, 3)
    error = str(getattr(run, "error", None) or "")
    kind = None
    if status == "timeout":
        kind = "run_over_time"
        details["timeout"] = getattr(spec, "timeout", None)
        error = error or f"ran over its timeout of {details['timeout']} s"
    elif status in ("failed", "lost"):
        kind = "run_failed"
        error = error or ("its host stopped answering" if status == "lost" else "failed")
    elif status == "succeeded":
        items = [counters[k] for k in ITEM_COUNTERS
                 if isinstance(counters.get(k), int | float)]
        if (items or any(k in counters for k in _SCRAPY_STATS)) and not any(
                n > 0 for n in items):
            kind = "run_no_items"
            error = "it ended well but counted no items"
    if kind is None:
        return []
    return [run_event(kind, job=job, run=getattr(run, "id", None), message=error,
                      ts=finished if isinstance(finished, int | float) else None,
                      details=details)]


@dataclass(slots=True)
class AlertRoute:
    """A stored route. ``target`` is what may be shown of where it sends: the webhook's
    ``scheme://host/***`` or the email addresses; ``url`` (the webhook URL, a
    :class:`Secret`) is never part of :meth:`as_dict`."""

    name: str
    kind: str
    target: str
    to: list[str]
    events: list[str]
    jobs: list[str]
    queues: list[str]
    enabled: bool
    created: float
    updated: float
    url: Secret | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "url"}

    def matches(self, event: AlertEvent) -> bool:
        """Whether this route gets ``event`` (see the package docstring)."""
        if not self.enabled or event.kind not in self.events:
            return False
        if event.kind in RUN_EVENTS:
            return _matches(event.job, self.jobs)
        if event.kind == "queue_stalled":
            return _matches(event.queue, self.queues)
        return True


def _matches(name: str | None, patterns: Sequence[str]) -> bool:
    if not patterns:
        return True
    return name is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass(slots=True)
class DeliveryResult:
    """One send (or the last of its attempts): ``answer`` is the target's (``HTTP 200
    ok``, ``250 Message accepted``), ``error`` why it failed."""

    ok: bool
    route: str
    answer: str = ""
    error: str = ""
    attempts: int = 1
    elapsed: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "route": self.route, "answer": self.answer,
                "error": self.error, "attempts": self.attempts,
                "elapsed": round(self.elapsed, 3)}


@dataclass(slots=True)
class Delivery:
    """A row of ``alert_deliveries``: ``event`` is the event kind (or ``test``), ``status``
    ``sent`` or ``failed`` (after every attempt)."""

    id: str
    route: str
    event: str
    job: str | None
    run: str | None
    about: str
    subject: str
    status: str
    attempts: int
    answer: str
    error: str
    ts: float

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
