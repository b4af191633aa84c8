"""Alert routes: who hears about failed, empty and overlong runs, dead agents and queues
that stopped draining, per job; sent as Slack-compatible JSON to a webhook or by SMTP.

Who calls what
--------------
- **The job runner**, at the end of every run (the plane's ``on_finish`` hook)::

      await plane.alerts.run_finished(spec, run)     # JobSpec, RunRecord

  which notifies ``run_failed`` (status ``failed`` or ``lost``: a non-zero exit, a
  signal, a run that could not start or whose host vanished), ``run_over_time`` (status
  ``timeout``) or ``run_no_items`` (status ``succeeded`` with an item counter at 0, see
  :func:`run_events`). Any other code notifies its own events::

      from crawlhub.control.alerts import run_event
      await plane.alerts.notify(run_event("run_failed", job="shop", run="r-12",
                                          message="exit code 2", exit_code=2))

  :meth:`AlertService.notify` queues the event and returns at once; it never raises (a
  full queue drops the event with a warning in the log).
- **``Services.start()``**, once::

      plane.alerts.start_watch(self.agents, queue_stats)

  ``queue_stats`` is ``async () -> {queue name: row}`` (or a list of rows carrying their
  ``name``, such as ``hub.outbound_stats()``) where a row has ``left`` and ``success``
  (a mapping, or a :class:`crawlhub.queues.base.QueueStats`). The plane's ``close()``
  stops it.
- **The test button** (``POST /alerts/{name}/test``, ``crawlhub alerts test``):
  :meth:`AlertService.test`, one attempt, synchronous, its answer returned.

Routing: a route lists the ``events`` it wants (all five by default). Run events
(``run_*``) reach it when the job matches one of its ``jobs`` glob patterns (none: every
job); ``queue_stalled`` when the queue matches one of its ``queues`` patterns (none: every
queue); ``agent_dead`` reaches every route that lists it (an agent serves many jobs).
A disabled route gets nothing but test messages.

Delivery: a bounded in-process queue, a background task, at most ``concurrency`` sends
at once; a failing target is tried ``1 + retries`` times with a doubling backoff; every
outcome is a row of ``alert_deliveries`` (the newest ``max_deliveries`` kept). The same
event kind about the same job, agent or queue is sent to a route at most once per
``interval`` seconds: the claim is one upsert in the control DB, so two processes
watching the same agents send one alert, not two. A delivery that failed gives its claim
back, so the next occurrence is tried again.

Targets: a webhook URL names a host the *server* connects to, so a route is a way for an
API client to make the server send requests. :class:`TargetPolicy` decides which hosts
it may reach: ``control.alert_allowed_hosts`` (when set, the only hosts taken) and
``control.alert_denied_networks`` (link-local and cloud metadata addresses by default;
loopback and private networks are allowed). It is checked when a route is stored (the
host and what it resolves to then) and again at every delivery (an IP literal before
connecting, a name by the resolver the connection itself uses, so a DNS answer that
changed meanwhile is caught). The answer of a send is only ``HTTP <status>`` and its
time: the target's body is never read back, so a route cannot be used to read internal
URLs.

Secrets: a webhook URL (Slack's embeds its token) is stored encrypted and shown as
``scheme://host/***``; the SMTP password lives in ``control.smtp_url``. Neither is ever
logged, returned or put in an error message.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.policy
import errno
import fnmatch
import functools
import ipaddress
import itertools
import json
import logging
import re
import smtplib
import socket
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args
from urllib.parse import unquote, urljoin, urlsplit

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

from crawlhub import __version__
from crawlhub.control.config import DEFAULT_DENIED_NETWORKS
from crawlhub.control.secrets import Secret, SecretBox, SecretError
from crawlhub.core.clock import Clock, system_clock
from crawlhub.core.errors import ConfigError, ConflictError, CrawlhubError, NotFoundError
from crawlhub.core.redact import redact

if TYPE_CHECKING:
    import aiohttp

    from crawlhub.agents.registry.base import AgentRegistry, AgentStatus
    from crawlhub.control.config import ControlSection
    from crawlhub.control.db import ControlDB

log = logging.getLogger("crawlhub.control.alerts")

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
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


#: ``async () -> {queue name: row}`` (or a list of rows with ``name``); a row has ``left``
#: and ``success``, as a mapping or as attributes.
QueueStatsFn = Callable[[], Awaitable[Mapping[str, Any] | Iterable[Any]]]


class AlertError(CrawlhubError):
    """An alert route that cannot be stored as given (the API answers 422)."""


# -- validation: one set of checks for the API, the CLI and the service ----------------
def check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError("a route name is 1 to 64 letters, digits, '.', '_' or '-',"
                         " starting with a letter or digit")
    return value


def check_webhook_url(value: str) -> str:
    """``value`` if it is an absolute http(s) URL with a host. Messages never repeat the
    URL: it may hold a token."""
    if len(value) > MAX_URL:
        raise ValueError(f"a webhook URL is at most {MAX_URL} characters")
    if _CONTROL.search(value) or any(c.isspace() for c in value):
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
    if not value or len(value) > MAX_PATTERN or _CONTROL.search(value):
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


# -- where a webhook may go -----------------------------------------------------------
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str], key: str = "control.alert_denied_networks"
                   ) -> tuple[IPNetwork, ...]:
    """``values`` as networks (an address alone is a /32 or /128); :class:`ConfigError`
    naming the bad one."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            raise ConfigError(f"{str(value)[:80]!r} is not an IP network: write one like"
                              " 169.254.0.0/16, fe80::/10 or 10.1.2.3", key=key) from None
    return tuple(networks)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 one as its IPv4), or None."""
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """Which hosts a webhook may reach. ``allowed_hosts``: when not empty, a URL's host
    must be one of them (``hooks.slack.com``, ``*.example.com`` for any name below it,
    or an IP address); ``denied_networks``: no address the host is or resolves to may
    lie in one (checked for allowed hosts too)."""

    allowed_hosts: tuple[str, ...] = ()
    denied_networks: tuple[IPNetwork, ...] = parse_networks(DEFAULT_DENIED_NETWORKS)

    @classmethod
    def of(cls, allowed_hosts: Iterable[str] = (),
           denied_networks: Iterable[str] = DEFAULT_DENIED_NETWORKS) -> TargetPolicy:
        return cls(tuple(h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip()),
                   parse_networks(denied_networks))

    def host_problem(self, host: str) -> str | None:
        """Why a URL naming ``host`` may not be posted to (None: it may, as far as the
        name tells; the addresses it resolves to are checked on their own)."""
        name = host.lower().strip("[]").rstrip(".")
        if self.allowed_hosts and not any(self._allows(entry, name)
                                          for entry in self.allowed_hosts):
            return (f"the webhook host {name[:100]} is not in control.alert_allowed_hosts;"
                    " use a listed host, or ask the operator to list it")
        address = _address(name)
        return None if address is None else self.address_problem(address, name)

    def address_problem(self, address: Any, host: str) -> str | None:
        """Why ``address`` (what ``host`` is or resolves to) may not be connected to."""
        if not isinstance(address, ipaddress.IPv4Address | ipaddress.IPv6Address):
            address = _address(str(address))
            if address is None:
                return f"the webhook host {host[:100]} resolves to something not an address"
        for network in self.denied_networks:
            if address.version == network.version and address in network:
                return (f"the webhook host {host[:100]} is in a denied network ({network};"
                        " link-local and cloud metadata addresses by default,"
                        " control.alert_denied_networks)")
        return None

    @staticmethod
    def _allows(entry: str, name: str) -> bool:
        if entry.startswith("*."):
            return name.endswith(entry[1:]) and len(name) > len(entry) - 1
        entry_address, address = _address(entry), _address(name)
        if entry_address is not None and address is not None:
            return entry_address == address
        return entry == name

    async def check(self, url: str, timeout: float) -> None:
        """:class:`AlertError` when the policy refuses ``url``'s host or an address it
        resolves to now. A name that does not resolve is let through: delivery checks
        again."""
        host = urlsplit(url).hostname or ""
        problem = self.host_problem(host)
        if problem is None and _address(host) is None:
            try:
                async with asyncio.timeout(timeout):
                    infos = await asyncio.get_running_loop().getaddrinfo(
                        host, None, type=socket.SOCK_STREAM)
            except (OSError, TimeoutError):
                infos = []
            problem = next((p for p in (self.address_problem(info[4][0], host)
                                        for info in infos) if p), None)
        if problem is not None:
            raise AlertError(problem)


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
    to: list[Address] = Field(default_factory=list, max_length=MAX_RECIPIENTS,
                              description="email: the recipients")
    events: list[EventKind] = Field(default_factory=lambda: list(EVENT_KINDS), min_length=1,
                                    description="the events this route gets (default: all)")
    jobs: list[Pattern] = Field(default_factory=list, max_length=MAX_PATTERNS,
                                description="run events: job names or glob patterns"
                                " (empty: every job)")
    queues: list[Pattern] = Field(default_factory=list, max_length=MAX_PATTERNS,
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
        """Whether this route gets ``event`` (see the module docstring)."""
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


# -- settings -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Where alert emails go: ``smtp://user:password@host:587`` (STARTTLS when offered,
    required with ``starttls=True``, never with ``False``) or ``smtps://...`` (TLS from the
    first byte); login only when the URL has a user."""

    host: str
    port: int
    sender: str
    user: str | None = None
    password: Secret | None = None
    tls: bool = False
    starttls: bool | None = None

    @classmethod
    def from_url(cls, url: str, *, sender: str, starttls: bool | None = None) -> SmtpSettings:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ConfigError("the SMTP URL is not a valid URL (a bad port?)",
                              key="control.smtp_url") from None
        scheme = parts.scheme.lower()
        if scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ConfigError("the SMTP URL must look like smtp://user:password@host:587",
                              key="control.smtp_url")
        try:
            check_address(sender)
        except ValueError as exc:
            raise ConfigError(f"{sender!r}: {exc}", key="control.smtp_from") from None
        user = unquote(parts.username) if parts.username else None
        password = Secret(unquote(parts.password)) if parts.password else None
        return cls(host=parts.hostname, port=port or (465 if scheme == "smtps" else 25),
                   sender=sender, user=user, password=password, tls=scheme == "smtps",
                   starttls=starttls)

    @property
    def where(self) -> str:
        return f"{'smtps' if self.tls else 'smtp'}://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class AlertSettings:
    """How alerts are sent. ``interval``: seconds within which the same event about the
    same job, agent or queue is not sent again to a route (0: always sent); ``timeout``:
    seconds per attempt; ``retries``: attempts after the first, waiting ``backoff``,
    then twice that...; ``stall_after``: seconds a queue may hold work without a success;
    ``poll``: seconds between the watcher's checks; ``queue_size``: events waiting to be
    routed before new ones are dropped; ``concurrency``: sends at once;
    ``max_deliveries``: delivery rows kept."""

    interval: float = 600.0
    timeout: float = 10.0
    retries: int = 3
    backoff: float = 1.0
    stall_after: float = 600.0
    poll: float = 15.0
    smtp: SmtpSettings | None = None
    queue_size: int = 1000
    concurrency: int = 8
    max_deliveries: int = 10_000
    #: which hosts a webhook may reach (``control.alert_allowed_hosts``,
    #: ``control.alert_denied_networks``)
    targets: TargetPolicy = TargetPolicy()

    @classmethod
    def from_section(cls, section: ControlSection) -> AlertSettings:
        """The settings of the ``control`` config section."""
        smtp = None
        if section.smtp_url is not None:
            smtp = SmtpSettings.from_url(section.smtp_url.get_secret_value(),
                                         sender=section.smtp_from,
                                         starttls=section.smtp_starttls)
        return cls(interval=float(section.alert_interval), timeout=float(section.alert_timeout),
                   stall_after=float(section.queue_stall_after),
                   poll=float(section.alert_poll), smtp=smtp,
                   targets=TargetPolicy.of(section.alert_allowed_hosts,
                                           section.alert_denied_networks))


# -- what is sent ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Rendered:
    """An event made ready to send: a clean one-line ``subject``, a bounded ``text`` and
    the structured ``crawlhub`` field of the webhook body."""

    subject: str
    text: str
    fields: dict[str, Any]

    def webhook_body(self) -> bytes:
        """Slack-compatible JSON: ``text`` (mrkdwn, ``& < >`` escaped, so a job name
        cannot mention ``<!channel>``) and ``crawlhub`` with the event's fields."""
        text = f"*{_slack(self.subject)}*"
        if self.text:
            text += "\n" + _slack(self.text)
        return json.dumps({"text": text, "crawlhub": self.fields},
                          ensure_ascii=False).encode("utf-8")

    def email(self, sender: str, to: Sequence[str]) -> EmailMessage:
        msg = EmailMessage()
        msg["From"] = sender
        msg["To"] = ", ".join(to)
        msg["Subject"] = f"[crawlhub] {self.subject}"
        msg["Date"] = formatdate(localtime=False)
        # the sender's domain: make_msgid's default asks the resolver for our FQDN
        msg["Message-ID"] = make_msgid("crawlhub", domain=sender.rsplit("@", 1)[-1])
        lines = [self.text, ""] if self.text else []
        for key in ("event", "job", "run", "agent", "queue"):
            if self.fields.get(key):
                lines.append(f"{key}: {self.fields[key]}")
        lines.append(f"time: {formatdate(self.fields['ts'], localtime=False)}")
        if self.fields.get("details"):
            lines += ["", json.dumps(self.fields["details"], ensure_ascii=False, indent=2)]
        msg.set_content("\n".join(lines) + "\n")
        return msg


def render(event: AlertEvent, ts: float) -> Rendered:
    subject = _one_line(event.subject or _default_subject(event), MAX_SUBJECT)
    text = _text(event.message, MAX_MESSAGE)
    fields = {
        "event": event.kind, "subject": subject, "message": text,
        "job": _clean(event.job), "run": _clean(event.run), "agent": _clean(event.agent),
        "queue": _clean(event.queue), "details": _bounded(event.details), "ts": ts,
    }
    return Rendered(subject, text, fields)


def _default_subject(event: AlertEvent) -> str:
    name = event.job or event.agent or event.queue or "crawlhub"
    return f"{event.kind.replace('_', ' ')}: {name}"


def _one_line(value: str, limit: int) -> str:
    """``value`` as one line: CR, LF and every control character become spaces (no header
    injection through a subject), runs of spaces fold, and it is cut at ``limit``."""
    text = " ".join(_CONTROL.sub(" ", value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: str, limit: int) -> str:
    text = _CONTROL_BUT_NEWLINE.sub(" ", value.replace("\r\n", "\n").replace("\r", "\n"))
    if len(text) <= limit:
        return text
    return text[:limit] + f"… ({len(text) - limit} more characters)"


def _clean(value: str | None) -> str | None:
    return None if value is None else _one_line(value, MAX_SUBJECT)


def _bounded(details: Mapping[str, Any]) -> dict[str, Any]:
    """``details`` as JSON-able data with secret-like keys masked, long texts cut, and at
    most :data:`MAX_DETAILS` characters in all (keys dropped from the end beyond)."""

    def clip(value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return value if len(value) <= MAX_DETAIL_TEXT else value[:MAX_DETAIL_TEXT] + "…"
        if value is None or isinstance(value, bool | int | float):
            return value
        if depth > 4:
            return _text(str(value), MAX_DETAIL_TEXT)
        if isinstance(value, Mapping):
            return {str(k)[:100]: clip(v, depth + 1) for k, v in list(value.items())[:100]}
        if isinstance(value, list | tuple | set | frozenset):
            return [clip(v, depth + 1) for v in list(value)[:100]]
        return _text(str(value), MAX_DETAIL_TEXT)

    try:
        data = clip(redact(dict(details)), 0)
        out: dict[str, Any] = {}
        size = 2
        for key, value in data.items():
            size += len(json.dumps({key: value}, ensure_ascii=False, default=str))
            if size > MAX_DETAILS:
                out["truncated"] = True
                break
            out[key] = value
        return out
    except Exception as exc:  # a value whose str() raises: the alert still goes out
        return {"unreadable": type(exc).__name__}


def _slack(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- the service ----------------------------------------------------------------------
_ROUTE_COLUMNS = "name, kind, url, target, recipients, events, jobs, queues, enabled," \
                 " created, updated"
_DELIVERY_COLUMNS = "id, route, event, job, run, about, subject, status, attempts, answer," \
                    " error, ts"


class AlertService:
    """Alert routes in the control DB, and the sending of alerts (see the module
    docstring). Open with :meth:`open`; :meth:`close` stops the watcher and gives pending
    deliveries a moment to finish."""

    def __init__(self, db: ControlDB, secrets: SecretBox,
                 settings: AlertSettings | None = None, *, clock: Clock = system_clock,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.db = db
        self.secrets = secrets
        self.settings = settings or AlertSettings()
        self.clock = clock
        self._sleep = sleep
        self._routes_table = db.table("alerts")
        self._deliveries_table = db.table("alert_deliveries")
        self._claims_table = db.table("alert_claims")
        self._queue: asyncio.Queue[AlertEvent] = asyncio.Queue(self.settings.queue_size)
        self._worker: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(max(1, self.settings.concurrency))
        self._tasks: set[asyncio.Task[None]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._seq = itertools.count()
        self._closed = False
        #: events not sent because the same one went out within ``interval``
        self.suppressed = 0
        #: events dropped because the queue was full
        self.dropped = 0

    @classmethod
    async def open(cls, db: ControlDB, secrets: SecretBox,
                   settings: AlertSettings | None = None, *, clock: Clock = system_clock,
                   sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> AlertService:
        service = cls(db, secrets, settings, clock=clock, sleep=sleep)
        await service.create_schema()
        return service

    async def create_schema(self) -> None:
        routes, deliveries, claims = (self._routes_table, self._deliveries_table,
                                      self._claims_table)
        await self.db.schema([
            f"CREATE TABLE IF NOT EXISTS {routes} (name TEXT PRIMARY KEY, kind TEXT NOT NULL,"
            " url TEXT, target TEXT NOT NULL, recipients TEXT NOT NULL, events TEXT NOT NULL,"
            " jobs TEXT NOT NULL, queues TEXT NOT NULL, enabled BIGINT NOT NULL,"
            " created DOUBLE PRECISION NOT NULL, updated DOUBLE PRECISION NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {deliveries} (id TEXT PRIMARY KEY,"
            " route TEXT NOT NULL, event TEXT NOT NULL, job TEXT, run TEXT,"
            " about TEXT NOT NULL, subject TEXT NOT NULL, status TEXT NOT NULL,"
            " attempts BIGINT NOT NULL, answer TEXT NOT NULL, error TEXT NOT NULL,"
            " ts DOUBLE PRECISION NOT NULL)",
            f"CREATE INDEX IF NOT EXISTS {self.db.table('alert_deliveries_route')}"
            f" ON {deliveries} (route, id)",
            f"CREATE INDEX IF NOT EXISTS {self.db.table('alert_deliveries_job')}"
            f" ON {deliveries} (job, id)",
            f"CREATE TABLE IF NOT EXISTS {claims} (route TEXT NOT NULL, event TEXT NOT NULL,"
            " about TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL,"
            " PRIMARY KEY (route, event, about))",
        ])

    # -- routes -------------------------------------------------------------------------
    async def create(self, spec: RouteSpec) -> AlertRoute:
        """Store a new route; :class:`ConflictError` if the name is taken,
        :class:`AlertError` if its webhook host is one the policy refuses."""
        await self._check_target(spec)
        now = self.clock()
        row = self._row(spec, created=now)
        found = await self.db.fetchone(
            f"INSERT INTO {self._routes_table} ({_ROUTE_COLUMNS}) VALUES ($1, $2, $3, $4,"
            " $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (name) DO NOTHING RETURNING name",
            *row)
        if found is None:
            raise ConflictError(f"alert route {spec.name!r} exists; change it with PATCH"
                                f" /alerts/{spec.name} or remove it first")
        log.info("alert route %r added: %s to %s", spec.name, spec.kind, row[3])
        return await self.get(spec.name)

    async def get(self, name: str) -> AlertRoute:
        """The route called ``name``; :class:`NotFoundError` if there is none."""
        row = await self.db.fetchone(
            f"SELECT {_ROUTE_COLUMNS} FROM {self._routes_table} WHERE name = $1", name)
        if row is None:
            raise NotFoundError(f"no alert route {name!r}; list them with GET /alerts/")
        return self._route(row)

    async def routes(self) -> list[AlertRoute]:
        """Every route, by name."""
        rows = await self.db.fetch(
            f"SELECT {_ROUTE_COLUMNS} FROM {self._routes_table} ORDER BY name")
        return [self._route(r) for r in rows]

    async def update(self, name: str, patch: RoutePatch) -> AlertRoute:
        """Apply ``patch`` to the route called ``name``; :class:`AlertError` if the result
        is not a valid route (an email route without addresses...)."""
        route = await self.get(name)
        merged: dict[str, Any] = {
            "name": route.name, "kind": route.kind, "to": route.to, "events": route.events,
            "jobs": route.jobs, "queues": route.queues, "enabled": route.enabled,
            "url": SecretStr(route.url.reveal()) if route.url is not None else None}
        changes = patch.model_dump(exclude_unset=True)
        if changes.get("kind") and changes["kind"] != route.kind:
            merged["url"], merged["to"] = None, []
        for key, value in changes.items():
            if value is None and key in ("kind", "enabled", "events"):
                continue
            merged[key] = value if value is not None or key == "url" else []
        spec = make_spec(merged)
        if "url" in changes:
            await self._check_target(spec)
        row = self._row(spec, created=route.created)
        changed = await self.db.execute(
            f"UPDATE {self._routes_table} SET kind = $2, url = $3, target = $4,"
            " recipients = $5, events = $6, jobs = $7, queues = $8, enabled = $9,"
            " updated = $11 WHERE name = $1 AND created = $10", *row)
        if not changed:
            raise NotFoundError(f"no alert route {name!r} (removed meanwhile)")
        log.info("alert route %r changed: %s", name, ", ".join(sorted(changes)) or "nothing")
        return await self.get(name)

    async def delete(self, name: str) -> None:
        """Remove a route (its deliveries stay listed); :class:`NotFoundError` if none."""
        if not await self.db.execute(
                f"DELETE FROM {self._routes_table} WHERE name = $1", name):
            raise NotFoundError(f"no alert route {name!r}")
        await self.db.execute(f"DELETE FROM {self._claims_table} WHERE route = $1", name)
        log.info("alert route %r removed", name)

    async def _check_target(self, spec: RouteSpec) -> None:
        if spec.url is not None:
            await self.settings.targets.check(spec.url.get_secret_value(),
                                              self.settings.timeout)

    def _row(self, spec: RouteSpec, *, created: float) -> tuple[Any, ...]:
        url = spec.url.get_secret_value() if spec.url is not None else None
        token = self.secrets.encrypt(url) if url is not None else None
        target = mask_url(url) if url is not None else ", ".join(spec.to)
        return (spec.name, spec.kind, token, target, json.dumps(spec.to),
                json.dumps(spec.events), json.dumps(spec.jobs), json.dumps(spec.queues),
                1 if spec.enabled else 0, created, self.clock())

    def _route(self, row: Sequence[Any]) -> AlertRoute:
        name, kind, token, target, to, events, jobs, queues, enabled, created, updated = row
        url = None
        if token:
            try:
                url = self.secrets.decrypt(token, what=f"the webhook URL of alert route"
                                           f" {name!r}")
            except SecretError as exc:
                log.warning("%s", exc)  # listed still; sending it says why it cannot
        return AlertRoute(name=name, kind=kind, target=target, to=json.loads(to),
                          events=json.loads(events), jobs=json.loads(jobs),
                          queues=json.loads(queues), enabled=bool(enabled),
                          created=float(created), updated=float(updated), url=url)

    # -- deliveries ---------------------------------------------------------------------
    async def deliveries(self, *, route: str | None = None, job: str | None = None,
                         limit: int = 100) -> list[Delivery]:
        """The newest deliveries first, of one route and/or one job."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("route", route), ("job", job)):
            if value is not None:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        args.append(max(1, min(int(limit), 10_000)))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self.db.fetch(
            f"SELECT {_DELIVERY_COLUMNS} FROM {self._deliveries_table} {clause}"
            f" ORDER BY id DESC LIMIT ${len(args)}", *args)
        return [Delivery(id=r[0], route=r[1], event=r[2], job=r[3], run=r[4], about=r[5],
                         subject=r[6], status=r[7], attempts=int(r[8]),
                         answer=_status_only(r[9]), error=_status_only(r[10]),
                         ts=float(r[11])) for r in rows]

    async def _record(self, route: str, event: AlertEvent, subject: str, status: str,
                      result: DeliveryResult | None, ts: float) -> None:
        # ids sort by time, then by this process's sequence: the newest is the largest
        did = f"{int(ts * 1000):015d}-{next(self._seq) % 10**9:09d}-{uuid.uuid4().hex[:8]}"
        await self.db.execute(
            f"INSERT INTO {self._deliveries_table} ({_DELIVERY_COLUMNS}) VALUES ($1, $2, $3,"
            " $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            did, route, event.kind, _clean(event.job), _clean(event.run), event.about,
            subject, status, result.attempts if result else 0,
            result.answer[:500] if result else "", result.error[:1000] if result else "", ts)
        # bounded: one index read of max_deliveries ids per delivery (alerts are rare)
        await self.db.execute(
            f"DELETE FROM {self._deliveries_table} WHERE id < (SELECT id FROM"
            f" {self._deliveries_table} ORDER BY id DESC LIMIT 1 OFFSET $1)",
            max(0, self.settings.max_deliveries - 1))

    # -- sending ------------------------------------------------------------------------
    async def notify(self, event: AlertEvent) -> bool:
        """Queue ``event`` for every route it matches and return at once: True if queued,
        False if dropped (the queue is full or the service is closed). Never raises."""
        try:
            if event.ts is None:
                event.ts = self.clock()
            if self._closed:
                log.warning("alerts: closed; %s event about %s not sent", event.kind,
                            event.about)
                return False
            if self._worker is None or self._worker.done():
                self._worker = asyncio.create_task(self._work(), name="crawlhub-alerts")
            self._queue.put_nowait(event)
            return True
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("alerts: %d events wait to be sent; %s event about %s dropped",
                        self._queue.qsize(), event.kind, event.about)
            return False
        except Exception:
            log.exception("alerts: could not queue a %s event", getattr(event, "kind", "?"))
            return False

    async def run_finished(self, spec: Any, run: Any) -> None:
        """The runner's end-of-run hook: notify what :func:`run_events` finds. Never
        raises."""
        try:
            events = run_events(spec, run)
        except Exception:
            log.exception("alerts: cannot read the end of run %s", getattr(run, "id", "?"))
            return
        for event in events:
            await self.notify(event)

    async def drain(self) -> None:
        """Wait until every queued event is routed and every delivery is recorded."""
        while True:
            await self._queue.join()
            if not self._tasks:
                return
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def test(self, name: str) -> DeliveryResult:
        """Send a test message to route ``name`` now, once (enabled or not), record it
        and return the target's answer or the error. :class:`NotFoundError` if no such
        route; a target that fails is ``ok=False``, never an exception."""
        route = await self.get(name)
        now = self.clock()
        event = AlertEvent(
            kind=TEST_KIND, subject=f"test alert of route {route.name}",
            message=f"If you can read this, alert route {route.name!r} reaches its target."
                    f" Sent by crawlhub {__version__} on {socket.gethostname()}.",
            details={"route": route.name, "events": route.events, "jobs": route.jobs},
            ts=now)
        rendered = render(event, now)
        result = await self._send(route, rendered)
        await self._record(route.name, event, rendered.subject, SENT if result.ok else FAILED,
                           result, now)
        if not result.ok:
            log.warning("alert route %r: test to %s failed: %s", route.name, route.target,
                        result.error)
        return result

    async def _work(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await self._dispatch(event)
            except Exception:
                log.exception("alerts: could not route a %s event about %s", event.kind,
                              event.about)
            finally:
                self._queue.task_done()

    async def _dispatch(self, event: AlertEvent) -> None:
        """Claim each matching route for ``event`` and start its delivery (waiting for a
        free slot: the queue backs up, and then drops, instead of tasks piling up)."""
        rows = await self.db.fetch(
            f"SELECT {_ROUTE_COLUMNS} FROM {self._routes_table} WHERE enabled = 1"
            " ORDER BY name")
        for route in (self._route(r) for r in rows):
            if not route.matches(event):
                continue
            claim = await self._claim(route.name, event)
            if claim is None:
                self.suppressed += 1
                log.debug("alerts: %s event about %s already sent to %r within %g s",
                          event.kind, event.about, route.name, self.settings.interval)
                continue
            await self._slots.acquire()
            task = asyncio.create_task(self._deliver(route, event, claim))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _claim(self, route: str, event: AlertEvent) -> float | None:
        """The time this event is claimed for ``route`` at, or None when the same kind
        about the same thing was claimed within ``interval``: one upsert, so two
        processes cannot both win."""
        now = float(event.ts if event.ts is not None else self.clock())
        if self.settings.interval <= 0:
            return now
        row = await self.db.fetchone(
            f"INSERT INTO {self._claims_table} (route, event, about, ts) VALUES ($1, $2, $3,"
            f" $4) ON CONFLICT (route, event, about) DO UPDATE SET ts = excluded.ts"
            f" WHERE {self._claims_table}.ts <= $5 RETURNING ts",
            route, event.kind, event.about, now, now - self.settings.interval)
        return now if row is not None else None

    async def _unclaim(self, route: str, event: AlertEvent, claim: float) -> None:
        if self.settings.interval > 0:
            await self.db.execute(
                f"DELETE FROM {self._claims_table} WHERE route = $1 AND event = $2 AND"
                " about = $3 AND ts = $4", route, event.kind, event.about, claim)

    async def _deliver(self, route: AlertRoute, event: AlertEvent, claim: float) -> None:
        try:
            ts = float(event.ts if event.ts is not None else self.clock())
            rendered = render(event, ts)
            result = DeliveryResult(False, route.name)
            attempts = 1 + max(0, self.settings.retries)
            for attempt in range(attempts):
                result = await self._send(route, rendered)
                result.attempts = attempt + 1
                if result.ok or attempt + 1 == attempts:
                    break
                await self._sleep(self.settings.backoff * 2 ** attempt)
            if result.ok:
                log.info("alert %s about %s sent to route %r (%s)", event.kind, event.about,
                         route.name, route.target)
            else:
                log.warning("alert %s about %s to route %r (%s) failed after %d attempts:"
                            " %s", event.kind, event.about, route.name, route.target,
                            result.attempts, result.error)
                await self._unclaim(route.name, event, claim)
            await self._record(route.name, event, rendered.subject,
                               SENT if result.ok else FAILED, result, self.clock())
        except Exception:
            log.exception("alerts: delivery of a %s event to route %r failed", event.kind,
                          route.name)

    async def _send(self, route: AlertRoute, rendered: Rendered) -> DeliveryResult:
        """One attempt; never raises."""
        started = time.monotonic()
        try:
            if route.kind == "webhook":
                ok, answer, error = await self._post(route, rendered.webhook_body())
            else:
                ok, answer, error = await self._mail(route, rendered)
        except Exception as exc:  # a bug must not reach the caller; its name is enough
            ok, answer, error = False, "", f"{type(exc).__name__} while sending"
            log.debug("alerts: send to route %r raised %s", route.name, type(exc).__name__)
        return DeliveryResult(ok, route.name, answer=answer, error=_scrub(error, route, self),
                              elapsed=time.monotonic() - started)

    # -- webhook ------------------------------------------------------------------------
    async def _post(self, route: AlertRoute, body: bytes) -> tuple[bool, str, str]:
        import aiohttp

        if route.url is None:
            return False, "", ("the webhook URL cannot be decrypted with the keys given;"
                               " set it again (PATCH the route's url)")
        url = route.url.reveal()
        origin = _origin(url)
        timeout = self.settings.timeout
        session = self._http()
        try:
            async with asyncio.timeout(timeout):
                for _ in range(MAX_REDIRECTS + 1):
                    # a literal address never reaches the resolver: check it here
                    refused = self.settings.targets.host_problem(urlsplit(url).hostname or "")
                    if refused is not None:
                        return False, "", refused
                    async with session.post(
                            url, data=body, allow_redirects=False,
                            headers={"Content-Type": "application/json; charset=utf-8",
                                     "User-Agent": f"crawlhub/{__version__} (alerts)"}
                    ) as response:
                        # The status alone: the body is never read back, or a route
                        # would let an API client read what an internal URL answers.
                        status = response.status
                        if status in (301, 302, 303, 307, 308):
                            location = response.headers.get("Location", "")
                            target = urljoin(url, location)
                            if not location or _origin(target) != origin:
                                return False, f"HTTP {status}", (
                                    f"HTTP {status}: a redirect to another host is not"
                                    " followed; use the URL it points to")
                            url = target
                            continue
                        answer = f"HTTP {status}"
                        if 200 <= status < 300:
                            return True, answer, ""
                        return False, answer, f"the webhook answered {answer}"
                return False, "", f"more than {MAX_REDIRECTS} redirects"
        except TimeoutError:
            return False, "", f"no answer within {timeout:g} s (control.alert_timeout)"
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, TargetRefused):
                return False, "", str(exc.os_error.strerror)
            reason = exc.os_error.strerror or type(exc.os_error).__name__
            return False, "", f"cannot connect to {route.target}: {reason}"
        except aiohttp.ClientError as exc:
            return False, "", f"{type(exc).__name__}: {exc}"

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            # every name is resolved through the policy, at the moment of connecting
            connector = aiohttp.TCPConnector(resolver=_policy_resolver()(self.settings.targets))
            self._session = aiohttp.ClientSession(connector=connector,
                                                  cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    # -- email --------------------------------------------------------------------------
    async def _mail(self, route: AlertRoute, rendered: Rendered) -> tuple[bool, str, str]:
        smtp = self.settings.smtp
        if smtp is None:
            return False, "", ("no SMTP server: set control.smtp_url (smtp://user:password@"
                               "host:587) to send alert emails")
        message = rendered.email(smtp.sender, route.to)
        timeout = self.settings.timeout
        try:
            # smtplib in a thread: every socket operation times out after ``timeout``;
            # the whole exchange gets three times that.
            answer = await asyncio.wait_for(
                asyncio.to_thread(_smtp_send, smtp, route.to, message, timeout), timeout * 3)
            return True, answer, ""
        except TimeoutError:
            return False, "", f"{smtp.where}: no answer within {timeout:g} s"
        except smtplib.SMTPRecipientsRefused as exc:
            refused = "; ".join(f"{addr}: {_reply(code, reply)}"
                                for addr, (code, reply) in exc.recipients.items())
            return False, "", f"{smtp.where} refused every recipient ({refused})"
        except smtplib.SMTPAuthenticationError as exc:
            return False, "", (f"{smtp.where} refused the login: "
                               f"{_reply(exc.smtp_code, exc.smtp_error)}")
        except smtplib.SMTPResponseException as exc:
            return False, "", f"{smtp.where} answered {_reply(exc.smtp_code, exc.smtp_error)}"
        except (smtplib.SMTPException, ssl.SSLError) as exc:
            return False, "", f"{smtp.where}: {exc}"
        except OSError as exc:
            return False, "", f"cannot connect to {smtp.where}: {exc.strerror or exc}"

    # -- watching agents and queues -----------------------------------------------------
    def watcher(self, agents: AgentRegistry | None,
                queue_stats: QueueStatsFn | None = None, *,
                more_agents: Sequence[AgentRegistry] = ()) -> AlertWatcher:
        """A watcher whose :meth:`AlertWatcher.poll` checks once (tests drive it)."""
        registries = [r for r in (agents, *more_agents) if r is not None]
        return AlertWatcher(self, registries, queue_stats, stall_after=self.settings.stall_after,
                            clock=self.clock)

    async def watch(self, agents: AgentRegistry | None,
                    queue_stats: QueueStatsFn | None = None, *,
                    interval: float | None = None,
                    more_agents: Sequence[AgentRegistry] = ()) -> None:
        """Check agents and queues every ``interval`` seconds (``control.alert_poll``)
        until cancelled: an agent seen alive that is now dead fires ``agent_dead`` once;
        a queue with Left > 0 whose Success has not moved for ``queue_stall_after``
        seconds fires ``queue_stalled`` once, until it drains or moves again."""
        watcher = self.watcher(agents, queue_stats, more_agents=more_agents)
        period = interval if interval is not None else self.settings.poll
        while True:
            await watcher.poll()
            await asyncio.sleep(period)

    def start_watch(self, agents: AgentRegistry | None,
                    queue_stats: QueueStatsFn | None = None, *,
                    interval: float | None = None,
                    more_agents: Sequence[AgentRegistry] = ()) -> None:
        """Run :meth:`watch` in the background until :meth:`close` (once: a second call
        does nothing while the first runs)."""
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.create_task(
                self.watch(agents, queue_stats, interval=interval, more_agents=more_agents),
                name="crawlhub-alert-watch")

    async def close(self, grace: float = 5.0) -> None:
        """Stop watching, give queued deliveries ``grace`` seconds, then stop."""
        self._closed = True
        watch, self._watch_task = self._watch_task, None
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(BaseException):
                await watch
        if self._worker is not None:
            try:
                await asyncio.wait_for(self.drain(), grace)
            except Exception:
                log.warning("alerts: %d events and %d deliveries still pending at close;"
                            " not sent", self._queue.qsize(), len(self._tasks))
            for task in [self._worker, *self._tasks]:
                task.cancel()
            await asyncio.gather(self._worker, *self._tasks, return_exceptions=True)
            self._worker = None
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class AlertWatcher:
    """Turns what agents and queues look like now into ``agent_dead`` and
    ``queue_stalled`` events, remembering what it saw between polls (one per process)."""

    def __init__(self, service: AlertService, agents: Sequence[AgentRegistry],
                 queue_stats: QueueStatsFn | None, *,
                 stall_after: float, clock: Clock) -> None:
        self.service = service
        self.agents = list(agents)
        self.queue_stats = queue_stats
        self.stall_after = stall_after
        self.clock = clock
        self._alive: dict[str, bool] = {}
        self._queues: dict[str, _QueueMark] = {}

    async def poll(self) -> list[AlertEvent]:
        """Check once and notify what changed; the events notified. A backend out of
        reach is logged and checked again next time."""
        events: list[AlertEvent] = []
        if self.agents:
            try:
                events += await self._check_agents()
            except Exception as exc:
                log.warning("alerts: cannot list the agents: %s: %s", type(exc).__name__, exc)
        if self.queue_stats is not None:
            try:
                events += self._check_queues(_by_name(await self.queue_stats()))
            except Exception as exc:
                log.warning("alerts: cannot read the queue stats: %s: %s",
                            type(exc).__name__, exc)
        for event in events:
            await self.service.notify(event)
        return events

    async def _check_agents(self) -> list[AlertEvent]:
        """Only a transition fires: an agent first seen dead (dead before this process
        started watching) does not; a clean unregister is no death."""
        seen: dict[str, AgentStatus] = {}
        for registry in self.agents:
            for status in await registry.agents():
                held = seen.get(status.agent_id)
                if held is None or status.last_seen > held.last_seen:
                    seen[status.agent_id] = status
        now = self.clock()
        dead_after = self.agents[0].dead_after
        events = []
        for agent_id, status in seen.items():
            if self._alive.get(agent_id) is True and not status.alive:
                info = status.info
                silent = max(0.0, now - status.last_seen)
                serves = ", ".join(info.queues or (status.beat.jobs if status.beat else [])
                                   ) or "nothing"
                events.append(AlertEvent(
                    kind="agent_dead", agent=agent_id, ts=now,
                    subject=f"agent {agent_id} on {info.host} is dead",
                    message=f"No heartbeat for {silent:.0f} s (dead after {dead_after:g} s)."
                            f" It served: {serves}.",
                    details={"agent_id": agent_id, "host": info.host, "pid": info.pid,
                             "queues": info.queues, "last_seen": status.last_seen,
                             "jobs": status.beat.jobs if status.beat else []}))
            self._alive[agent_id] = status.alive
        for gone in set(self._alive) - set(seen):
            del self._alive[gone]
        return events

    def _check_queues(self, stats: Mapping[str, Any]) -> list[AlertEvent]:
        now = self.clock()
        events = []
        for name, row in stats.items():
            left, success = _count(row, "left"), _count(row, "success")
            if left is None or success is None:
                continue  # its backend is out of reach: unknown, not stalled
            mark = self._queues.get(name)
            if mark is None or left <= 0 or success != mark.success:
                self._queues[name] = _QueueMark(success=success, since=now)
                continue
            stalled = now - mark.since
            if not mark.fired and stalled >= self.stall_after:
                mark.fired = True
                events.append(AlertEvent(
                    kind="queue_stalled", queue=name, ts=now,
                    subject=f"queue {name} is not draining",
                    message=f"{left} tasks left and no success for {stalled:.0f} s"
                            f" (success stays at {success}). Are its agents alive?",
                    details={"queue": name, "left": left, "success": success,
                             "failed": _count(row, "failed"), "total": _count(row, "total"),
                             "stalled_for": round(stalled, 1)}))
        for gone in set(self._queues) - set(stats):
            del self._queues[gone]
        return events


@dataclass(slots=True)
class _QueueMark:
    success: int
    since: float
    fired: bool = False


def _by_name(stats: Mapping[str, Any] | Iterable[Any]) -> Mapping[str, Any]:
    """Queue stats as ``{name: row}``: a mapping as it is, or a list of rows that carry
    their ``name`` (``hub.outbound_stats()``'s dicts, ``QueueStats``)."""
    if isinstance(stats, Mapping):
        return stats
    rows = {}
    for row in stats:
        name = row.get("name") if isinstance(row, Mapping) else getattr(row, "name", None)
        if isinstance(name, str):
            rows[name] = row
    return rows


def _count(row: Any, name: str) -> int | None:
    value = row.get(name) if isinstance(row, Mapping) else getattr(row, name, None)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# -- helpers --------------------------------------------------------------------------
class TargetRefused(OSError):
    """A webhook host that resolves to an address the :class:`TargetPolicy` denies."""


@functools.cache
def _policy_resolver() -> type:
    """The resolver class (made on first use: aiohttp is imported only when sending)."""
    import aiohttp
    from aiohttp.abc import AbstractResolver, ResolveResult

    class PolicyResolver(AbstractResolver):
        """aiohttp's resolver, refusing every answer that holds a denied address: the
        addresses checked are the ones connected to (no gap for DNS to change in)."""

        def __init__(self, policy: TargetPolicy) -> None:
            self.policy = policy
            self.inner = aiohttp.DefaultResolver()

        async def resolve(self, host: str, port: int = 0,
                          family: socket.AddressFamily = socket.AF_INET
                          ) -> list[ResolveResult]:
            found = await self.inner.resolve(host, port, family)
            for result in found:
                problem = self.policy.address_problem(result["host"], host)
                if problem is not None:
                    raise TargetRefused(errno.EACCES, problem)
            return found

        async def close(self) -> None:
            await self.inner.close()

    return PolicyResolver


#: A webhook answer as older versions recorded it: the status, then the target's body.
_WITH_BODY = re.compile(r"^((?:the webhook answered )?HTTP \d{3}) .*$", re.DOTALL)


def _status_only(text: str) -> str:
    """``text`` without the target's body that rows recorded before the answer was the
    status alone still hold (they must not be a way to read it now)."""
    return _WITH_BODY.sub(r"\1", text or "")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return (parts.scheme.lower(), (parts.hostname or "").lower(),
            parts.port or (443 if parts.scheme.lower() == "https" else 80))


def _scrub(error: str, route: AlertRoute, service: AlertService) -> str:
    """``error`` without the route's webhook URL, its path or query, or the SMTP
    password (an exception's text may quote them)."""
    secrets: list[str] = []
    if route.url is not None:
        url = route.url.reveal()
        secrets.append(url)
        with contextlib.suppress(ValueError):
            parts = urlsplit(url)
            secrets += [p for p in (parts.path, parts.query) if len(p) > 1]
    smtp = service.settings.smtp
    if smtp is not None and smtp.password:
        secrets.append(smtp.password.reveal())
    for secret in sorted(secrets, key=len, reverse=True):
        error = error.replace(secret, "***")
    return _one_line(error, 1000)


def _reply(code: int, reply: bytes | str) -> str:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    return f"{code} {_one_line(text, 300)}"


def _smtp_send(smtp: SmtpSettings, recipients: Iterable[str], message: EmailMessage,
               timeout: float) -> str:
    """Send ``message`` (blocking: run it in a thread); the server's answer to DATA."""
    context = ssl.create_default_context()
    client: smtplib.SMTP
    if smtp.tls:
        client = smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=timeout, context=context)
    else:
        client = smtplib.SMTP(smtp.host, smtp.port, timeout=timeout)
    with client:
        client.ehlo()
        if not smtp.tls and smtp.starttls is not False:
            if client.has_extn("starttls"):
                client.starttls(context=context)
                client.ehlo()
            elif smtp.starttls:
                raise smtplib.SMTPNotSupportedError(
                    "the server does not offer STARTTLS (control.smtp_starttls is true)")
        if smtp.user:
            client.login(smtp.user, smtp.password.reveal() if smtp.password else "")
        code, reply = client.mail(smtp.sender)
        if code != 250:
            raise smtplib.SMTPSenderRefused(code, reply, smtp.sender)
        to = list(recipients)
        refused: dict[str, tuple[int, bytes]] = {}
        for rcpt in to:
            code, reply = client.rcpt(rcpt)
            if code not in (250, 251):
                refused[rcpt] = (code, reply)
        if len(refused) == len(to):
            client.rset()
            raise smtplib.SMTPRecipientsRefused(refused)  # type: ignore[arg-type]
        code, reply = client.data(message.as_bytes(policy=email.policy.SMTP))
        if code != 250:
            raise smtplib.SMTPDataError(code, reply)
        answer = _reply(code, reply)
        if refused:
            answer += "; refused: " + ", ".join(refused)
        return answer
