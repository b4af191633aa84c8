"""The one lease and clock convention (crawlhub.core.clock): every Redis script gets ``now``
from its caller and none reads the server's clock, so one fake clock drives every lease."""

from __future__ import annotations

from typing import Any

from crawlhub.agents.politeness.redis import RedisGateStore
from crawlhub.agents.registry.redis import RedisAgentRegistry
from crawlhub.core.clock import system_clock
from crawlhub.hub.state import RedisHubState
from crawlhub.queues.redis import RedisQueueBackend
from tests.helpers import FakeClock


def scripts_of(obj: Any) -> list[str]:
    found = [v.script for v in vars(obj).values() if hasattr(v, "script")]
    for value in vars(obj).values():
        if isinstance(value, dict):
            found += [v.script for v in value.values() if hasattr(v, "script")]
    return [s.decode() if isinstance(s, bytes) else s for s in found]


def test_no_redis_script_reads_the_server_clock() -> None:
    url = "redis://127.0.0.1:1/0"  # never contacted: scripts are registered, not sent
    owners = [RedisQueueBackend(url), RedisHubState(url), RedisAgentRegistry(url),
              RedisGateStore(url)]
    for owner in owners:
        scripts = scripts_of(owner)
        assert scripts, f"{type(owner).__name__} registers no script"
        for script in scripts:
            assert "'TIME'" not in script and '"TIME"' not in script, type(owner).__name__


def test_every_redis_backend_defaults_to_the_system_clock_and_takes_a_fake_one() -> None:
    url = "redis://127.0.0.1:1/0"
    fake = FakeClock()
    for cls in (RedisQueueBackend, RedisHubState, RedisAgentRegistry):
        assert cls(url).clock is system_clock
        assert cls(url, clock=fake).clock is fake


async def test_a_redis_token_bucket_refills_by_the_callers_clock(
        redis_url: str, unique_name: str, clock: FakeClock) -> None:
    from tests.queues.conftest import delete_prefix

    prefix = f"test:{unique_name}:"
    state = RedisHubState(redis_url, prefix=prefix, clock=clock)
    try:
        assert await state.take_tokens("s", 1.0, 1, 1.0) == 0
        assert await state.take_tokens("s", 1.0, 1, 1.0) == 1.0
        clock.advance(1)
        assert await state.take_tokens("s", 1.0, 1, 1.0) == 0
    finally:
        await state.close()
        await delete_prefix(redis_url, prefix)
