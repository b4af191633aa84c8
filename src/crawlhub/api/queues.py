"""``/queues/``: stats of every reliable queue, and lease / ack / nack over HTTP so a
worker needs nothing but an HTTP client."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from crawlhub.api.deps import ApiError, services
from crawlhub.errors import QueueError
from crawlhub.service import Services

router = APIRouter(tags=["queues"])


class LeaseRequest(BaseModel):
    n: int = Field(1, ge=1, le=10000, description="how many messages at most")
    visibility_timeout: float = Field(60.0, gt=0, le=86400,
                                      description="seconds before an unacked lease returns")


class AckRequest(BaseModel):
    ids: list[str] = Field(..., min_length=1, max_length=10000,
                           description="message ids, or receipts (id#attempt) to finish only"
                           " the lease you hold")
    dead: bool = Field(False, description="nack only: to the dead letter instead of ready")


@router.get("/queues/", summary="Stats of every queue")
async def queue_stats(svc: Services = Depends(services)) -> list[dict[str, Any]]:
    return [(await svc.queues.queue(name).stats()).as_dict()
            for name in sorted(await svc.queues.names())]


@router.post("/queues/{name}/lease", summary="Lease messages")
async def lease(name: str, body: LeaseRequest, svc: Services = Depends(services)
                ) -> list[dict[str, Any]]:
    try:
        messages = await svc.queues.queue(name).lease(body.n, body.visibility_timeout)
    except QueueError as exc:
        raise ApiError(400, str(exc)) from None
    return [{"id": m.id, "receipt": m.receipt, "payload": m.payload, "priority": m.priority,
             "attempts": m.attempts, "lease_until": m.lease_until} for m in messages]


@router.post("/queues/{name}/ack", summary="Finish leased messages")
async def ack(name: str, body: AckRequest, svc: Services = Depends(services)) -> dict[str, int]:
    try:
        return {"acked": await svc.queues.queue(name).ack(body.ids)}
    except QueueError as exc:  # e.g. an invalid queue name
        raise ApiError(400, str(exc)) from None


@router.post("/queues/{name}/nack", summary="Return leased messages (or dead-letter them)")
async def nack(name: str, body: AckRequest, request: Request,
               svc: Services = Depends(services)) -> dict[str, int]:
    try:
        return {"nacked": await svc.queues.queue(name).nack(body.ids, dead=body.dead)}
    except QueueError as exc:
        raise ApiError(400, str(exc)) from None
