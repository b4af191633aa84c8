"""The protocol of an inbound source: something that yields messages to the hub.

The hub awaits ``deliver`` for every batch; a source acknowledges its messages (Kafka
offset commit, XACK, removal from a processing list) only after ``deliver`` returns, so a
crash between the two redelivers instead of losing. ``deliver`` blocks while the hub
applies backpressure (an outbound over ``max_lag``): that is how consumption pauses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

Deliver = Callable[[list[dict[str, Any]]], Awaitable[None]]


@runtime_checkable
class InboundSource(Protocol):
    """Built as ``cls(name, init, threads=n)`` from an inbound's config entry."""

    name: str

    async def run(self, deliver: Deliver, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; call ``deliver`` with each batch of messages."""
        ...
