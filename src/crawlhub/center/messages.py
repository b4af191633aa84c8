"""What travels between jobs, centers and agents: channel names, message kinds, replies.

Channels (see :mod:`crawlhub.center.bus`):

- ``requests`` (group ``g``, read by every center, each message by one): a job's
  ``allocate``, ``download``, ``release`` and ``stats`` messages;
- ``register`` (group): agents' registrations, processed however old they are;
- ``beats`` (tail: every center reads every beat): agents' heartbeats;
- ``agent:<id>`` (group, read by that agent): ``allocate``, ``download``, ``release``,
  ``allocations`` (its current jobs, after it registered), ``register`` (the center
  does not know it), ``exit``;
- ``ctl:<center id>`` (group, read by that center): agents' ``allocated`` acks;
- ``job:<job id>`` (group, read by the job): ``allocated`` / ``refused`` answers and
  ``reply`` messages (one per download: the response, or ``skipped`` / ``failed``).

Every message carries ``ts``, its sender's epoch time (:mod:`crawlhub.core.clock`: one clock
convention, hosts in NTP sync). Requests and commands also carry ``exp``: after it the
sender has given up or retried, so a center or agent that finds it late (after a restart,
behind a backlog) drops it - a download answered after its job retried would only be a
duplicate. Heartbeats are judged by their own ``ts``: a beat older than ``dead_after``
proves nothing and is dropped, and a beat never moves an agent's last sign of life
backwards, so beats replayed after a center restart cannot revive a dead agent.
Registrations carry no expiry: one queued while no center ran is processed when one
starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from crawlhub.core.errors import CrawlhubError

REQUESTS = "requests"
REGISTER = "register"
BEATS = "beats"
#: the allocation records (a table: job -> record)
ALLOCATIONS = "allocations"

#: Strategies: every live agent at random; n agents kept; n agents kept and a request
#: found on agent m's page goes back to m.
STRATEGIES = ("random", "fixed", "chained")

#: Reply statuses: ``ok`` (a download happened - any HTTP status, or a network outcome in
#: ``outcome``), ``skipped`` (chained: the agent the request is bound to is dead; the
#: job's retry decides), ``failed`` (no live agent, or the job is not allocated).
OK, SKIPPED, FAILED = "ok", "skipped", "failed"

_ID = re.compile(r"^[A-Za-z0-9_.:@-]{1,200}$")


class CenterError(CrawlhubError):
    """The download center cannot serve the job: allocation refused or timed out, the
    broker failed past its retries, a request unanswered past its retries, the in-flight
    window stalled. The message says which, with the numbers."""


def agent_channel(agent_id: str) -> str:
    return f"agent:{agent_id}"


def job_channel(job: str) -> str:
    return f"job:{job}"


def ctl_channel(center_id: str) -> str:
    return f"ctl:{center_id}"


def check_id(value: str, what: str) -> str:
    """Job and agent ids name channels and files: letters, digits and ``_.:@-`` only."""
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"{what} {value!r} must be 1-200 letters, digits or _.:@- characters")
    return value


@dataclass(slots=True)
class Reply:
    """A download's answer as the job sees it.

    ``status`` is ``ok``, ``skipped`` or ``failed``; for ``ok``: ``http_status`` (0 when no
    response came), ``outcome`` (a name from :mod:`crawlhub.agents.codes`), the final
    ``url``, ``headers``, ``body`` (empty when the job asked for extraction only),
    ``fields`` and ``links`` when the agent extracted, ``agent`` the agent that
    downloaded (what a chained follow-up request carries). ``attempts`` counts the sends
    of this request (more than 1 after reply timeouts).
    """

    rid: str
    status: str
    agent: str = ""
    http_status: int = 0
    outcome: str = ""
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    error: str = ""
    elapsed: float = 0.0
    fields: dict[str, Any] | None = None
    links: list[str] | None = None
    title: str | None = None
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.status == OK

    @classmethod
    def from_message(cls, header: dict[str, Any], body: bytes) -> Reply:
        return cls(
            rid=str(header.get("rid") or ""), status=str(header.get("status") or FAILED),
            agent=str(header.get("agent") or ""), http_status=int(header.get("code") or 0),
            outcome=str(header.get("outcome") or ""), url=str(header.get("url") or ""),
            headers={str(k): str(v) for k, v in (header.get("headers") or {}).items()},
            body=body, error=str(header.get("error") or ""),
            elapsed=float(header.get("elapsed") or 0.0), fields=header.get("fields"),
            links=header.get("links"), title=header.get("title"))
