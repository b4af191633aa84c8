"""What is sent: an :class:`AlertEvent` rendered as a clean subject, a bounded text and
the fields of the webhook body, as Slack-compatible JSON or as an email."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import Any

from crawlhub.control.alerts.model import (
    CONTROL_CHARS,
    MAX_DETAIL_TEXT,
    MAX_DETAILS,
    MAX_MESSAGE,
    MAX_SUBJECT,
    AlertEvent,
)
from crawlhub.core.redact import redact

_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


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
    subject = one_line(event.subject or _default_subject(event), MAX_SUBJECT)
    text = _text(event.message, MAX_MESSAGE)
    fields = {
        "event": event.kind, "subject": subject, "message": text,
        "job": clean(event.job), "run": clean(event.run), "agent": clean(event.agent),
        "queue": clean(event.queue), "details": _bounded(event.details), "ts": ts,
    }
    return Rendered(subject, text, fields)


def _default_subject(event: AlertEvent) -> str:
    name = event.job or event.agent or event.queue or "crawlhub"
    return f"{event.kind.replace('_', ' ')}: {name}"


def one_line(value: str, limit: int) -> str:
    """``value`` as one line: CR, LF and every control character become spaces (no header
    injection through a subject), runs of spaces fold, and it is cut at ``limit``."""
    text = " ".join(CONTROL_CHARS.sub(" ", value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _text(value: str, limit: int) -> str:
    text = _CONTROL_BUT_NEWLINE.sub(" ", value.replace("\r\n", "\n").replace("\r", "\n"))
    if len(text) <= limit:
        return text
    return text[:limit] + f"… ({len(text) - limit} more characters)"


def clean(value: str | None) -> str | None:
    return None if value is None else one_line(value, MAX_SUBJECT)


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


