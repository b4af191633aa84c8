"""``/queues/``: stats of every reliable queue, and lease / ack / nack over HTTP so a
worker needs nothing but an HTTP client; ``/queues/{name}/dead`` peeks at dead letters.

An invalid queue name is the backend's QueueNameError (400), a backend out of reach its
outage error (503): the app answers them (:mod:`crawlhub.api.errors`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Query, Response
from pydantic import BaseModel, Field

from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import Acked, DeadLetter, LeasedMessage, Nacked, QueueStatsRow
from crawlhub.api.openapi import BACKEND, BODY, errors
from crawlhub.core import jsoncodec
from crawlhub.core.errors import CrawlhubError
from crawlhub.queues.base import Message, ReliableQueue

router = routing.router(tags=["queues"])
log = logging.getLogger("crawlhub.api.queues")


class LeaseRequest(BaseModel):
    n: int = Field(1, ge=1, le=10000, description="how many messages at most")
    visibility_timeout: float = Field(60.0, gt=0, le=86400,
                                      description="seconds before an unacked lease returns")


class AckRequest(BaseModel):
    ids: list[str] = Field(..., min_length=1, max_length=10000,
                           description="message ids, or receipts (id#attempt) to finish only"
                           " the lease you hold")
    dead: bool = Field(False, description="nack only: to the dead letter instead of ready")
    reason: str | None = Field(None, max_length=500,
                               description="nack only: why; kept with a dead letter")


@router.get("/queues/", summary="Stats of every queue", response_model=list[QueueStatsRow],
            responses=errors(*BACKEND))
async def queue_stats(svc: ServicesDep) -> list[dict[str, Any]]:
    return [(await svc.queues.queue(name).stats()).as_dict()
            for name in sorted(await svc.queues.names())]


@router.post("/queues/{name}/lease", summary="Lease messages",
             response_model=list[LeasedMessage], responses=errors(*BODY, *BACKEND))
async def lease(name: str, body: LeaseRequest, svc: ServicesDep) -> Response:
    """A message that cannot be sent as JSON goes to the dead letter with the reason; the
    others are delivered. One bad message never fails the batch."""
    queue = svc.queues.queue(name)
    messages = await queue.lease(body.n, body.visibility_timeout)
    parts = []
    for m in messages:
        encoded = await _encode_or_set_aside(queue, m)
        if encoded is not None:
            parts.append(encoded)
    return Response(b"[" + b",".join(parts) + b"]", media_type="application/json")


async def _encode_or_set_aside(queue: ReliableQueue, m: Message) -> bytes | None:
    item = {"id": m.id, "receipt": m.receipt, "payload": m.payload, "priority": m.priority,
            "attempts": m.attempts, "lease_until": m.lease_until}
    try:
        return jsoncodec.dumps_strict(item).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        reason = f"undeliverable: cannot be sent as JSON ({type(exc).__name__}: {exc})"
        try:
            await queue.nack([m.receipt], dead=True, reason=reason[:500])
        except CrawlhubError:  # its lease runs out and the next lease sets it aside
            log.exception("queue %r: could not dead-letter message %s", queue.name, m.id)
        return None


@router.get("/queues/{name}/dead", summary="Peek at dead letters (oldest first)",
            response_model=list[DeadLetter], responses=errors(400, 422, *BACKEND))
async def dead_letters(name: str, n: int = Query(100, ge=1, le=10000,
                                                 description="how many at most"),
                       *, svc: ServicesDep) -> list[dict[str, Any]]:
    """Each dead letter with the reason it died: nacked there by a worker (with the
    worker's reason), delivered ``max_attempts`` times without an ack, or a payload that
    could not be delivered."""
    dead = await svc.queues.queue(name).dead_letters(n)
    return [{"id": d.id, "payload": d.payload, "priority": d.priority,
             "attempts": d.attempts, "reason": d.reason} for d in dead]


@router.post("/queues/{name}/ack", summary="Finish leased messages", response_model=Acked,
             responses=errors(*BODY, *BACKEND))
async def ack(name: str, body: AckRequest, svc: ServicesDep) -> dict[str, int]:
    return {"acked": await svc.queues.queue(name).ack(body.ids)}


@router.post("/queues/{name}/nack", summary="Return leased messages (or dead-letter them)",
             response_model=Nacked, responses=errors(*BODY, *BACKEND))
async def nack(name: str, body: AckRequest, svc: ServicesDep) -> dict[str, int]:
    queue = svc.queues.queue(name)
    return {"nacked": await queue.nack(body.ids, dead=body.dead, reason=body.reason)}
