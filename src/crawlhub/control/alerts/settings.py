"""How alerts are sent: :class:`AlertSettings` made from the ``control`` config section,
with the SMTP server (:class:`SmtpSettings`) and the webhooks' :class:`TargetPolicy`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from crawlhub.control.alerts.model import check_address
from crawlhub.control.alerts.targets import TargetPolicy
from crawlhub.control.secrets import Secret
from crawlhub.core.errors import ConfigError

if TYPE_CHECKING:
    from crawlhub.control.config import ControlSection

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


