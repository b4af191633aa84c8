"""One attempt at a route's target: a webhook POST through the :class:`TargetPolicy`'s
resolver (the status alone read back) or an SMTP send in a thread; errors scrubbed of
the secrets they may quote. :class:`Sender` holds the HTTP session the webhooks share."""

from __future__ import annotations

import asyncio
import contextlib
import email.policy
import logging
import smtplib
import ssl
import time
from collections.abc import Iterable
from email.message import EmailMessage
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from crawlhub import __version__
from crawlhub.control.alerts.model import MAX_REDIRECTS, AlertRoute, DeliveryResult
from crawlhub.control.alerts.render import Rendered, one_line
from crawlhub.control.alerts.settings import AlertSettings, SmtpSettings
from crawlhub.control.alerts.targets import TargetRefused, policy_resolver

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("crawlhub.control.alerts")


class Sender:
    """Sends a rendered alert to a route's target, once per :meth:`send`; :meth:`close`
    closes the HTTP session."""

    def __init__(self, settings: AlertSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def send(self, route: AlertRoute, rendered: Rendered) -> DeliveryResult:
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
        return DeliveryResult(ok, route.name, answer=answer,
                              error=_scrub(error, route, self.settings.smtp),
                              elapsed=time.monotonic() - started)

    # -- webhook ------------------------------------------------------------------------
    async def _post(self, route: AlertRoute, body: bytes) -> tuple[bool, str, str]:
        import aiohttp

        from crawlhub.fetch.http import REDIRECT_STATUSES

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
                        if status in REDIRECT_STATUSES:
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
        from crawlhub.fetch.http import new_connector, new_session

        if self._session is None or self._session.closed:
            # every name is resolved through the policy, at the moment of connecting
            connector = new_connector(resolver=policy_resolver()(self.settings.targets))
            self._session = new_session(connector=connector, cookies="none")
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

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return (parts.scheme.lower(), (parts.hostname or "").lower(),
            parts.port or (443 if parts.scheme.lower() == "https" else 80))


def _scrub(error: str, route: AlertRoute, smtp: SmtpSettings | None) -> str:
    """``error`` without the route's webhook URL, its path or query, or the SMTP
    password (an exception's text may quote them)."""
    secrets: list[str] = []
    if route.url is not None:
        url = route.url.reveal()
        secrets.append(url)
        with contextlib.suppress(ValueError):
            parts = urlsplit(url)
            secrets += [p for p in (parts.path, parts.query) if len(p) > 1]
    if smtp is not None and smtp.password:
        secrets.append(smtp.password.reveal())
    for secret in sorted(secrets, key=len, reverse=True):
        error = error.replace(secret, "***")
    return one_line(error, 1000)


def _reply(code: int, reply: bytes | str) -> str:
    text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
    return f"{code} {one_line(text, 300)}"


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
