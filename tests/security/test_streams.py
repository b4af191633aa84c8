"""No one in through a stream: every stream, list and channel crawlhub reads takes a
malformed entry - and, where messages are commands, a forged one - without stopping.
The entry is acked (or dropped), counted in ``crawlhub_stream_entries_rejected_total``,
logged once with its id and kept aside for inspection; the reader goes on serving.

``INVENTORY`` lists every read site in ``src/``; :func:`test_the_inventory_names_every
_read_site` fails when a new one appears, so a new stream cannot escape these tests.
Everything runs on the real test Redis, with real centers, agents, collectors and
inbounds, under a key prefix of each test's own.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from crawlhub.center import CenterClient, CenterWorker, DownloadCenter, open_bus
from crawlhub.center.bus import Envelope
from crawlhub.center.messages import ALLOCATIONS, BEATS, REGISTER, REQUESTS
from crawlhub.core import keys, rejects
from crawlhub.core.signing import Signer
from tests.agents.servers import Site
from tests.helpers import FakeClock, wait_for

SRC = Path(__file__).resolve().parents[2] / "src" / "crawlhub"
KEY = "k" * 8 + uuid.uuid4().hex  # the fleet's key (40 characters)
OTHER_KEY = "o" * 8 + uuid.uuid4().hex  # a forger's: well formed, not the fleet's
DEAD_AFTER = 1.0

#: Every place in src/ that reads a stream, list or channel (file -> read commands in it),
#: and what each reader does with an entry it cannot take. A new read command anywhere
#: fails test_the_inventory_names_every_read_site until it is listed here - and tested.
INVENTORY: dict[str, dict[str, Any]] = {
    "center/bus.py": {  # every channel of the download center, agents' included
        "reads": {"xreadgroup": 1, "xautoclaim": 1, "xread": 1, "xrevrange": 1},
        "streams": ["center:requests", "center:register", "center:beats", "center:ctl",
                    "center:agent", "center:job",
                    "center:allocations"],  # a hash (HGETALL) every center merges
        "signed": True,
    },
    "center/lua/take_all.lua": {  # the bus's script (center/bus.py): its streams above
        "reads": {"xrange": 1},
        "streams": [],
        "signed": True,
    },
    "control/logs/transport.py": {
        "reads": {"xreadgroup": 1, "xautoclaim": 1},
        "streams": ["logs"],
        # log lines are data a job writes about itself, not commands: not signed
        "signed": False,
    },
    "control/channel.py": {
        "reads": {"psubscribe": 1},
        "streams": ["control"],
        "signed": True,
    },
    "hub/inbounds/redis.py": {
        "reads": {"blmove": 1, "lmove": 1, "lrange": 1, "xreadgroup": 1, "xautoclaim": 1},
        "streams": ["inbound:redis"],
        # tasks from third-party producers (taskHUB-compatible): they cannot sign;
        # whoever may write the key may submit tasks - Redis ACLs decide that
        "signed": False,
    },
    "agents/registry/redis.py": {  # hashes read whole by a script (HGETALL), not a stream,
        # but what every center merges: one bad entry must not hide the fleet
        "reads": {},
        "streams": ["agents:registry"],
        "signed": False,  # written by the centers from signed messages; ACLs guard it
    },
    "frontier/redis.py": {  # a wake-up whose content is never read
        "reads": {"subscribe": 2},
        "streams": [],
        "signed": False,
    },
    "frontier/lua/claim.lua": {  # ZPOPMIN takes the frontier's own ready set (its seeds
        # are checked when admitted)
        "reads": {"zpopmin": 1},
        "streams": [],
        "signed": False,
    },
    "collect/logship.py": {  # an in-process JobLog subscription, not Redis
        "reads": {"subscribe": 1},
        "streams": [],
        "signed": False,
    },
    "queues/lua/lease.lua": {  # queues/redis.py's lease: payloads go through
        # queues.common.decode_payload; an undeliverable one is dead-lettered by the queue
        # itself (tests/queues)
        "reads": {"zpopmin": 1},
        "streams": [],
        "signed": False,
    },
    "contrib/scrapy/scheduler.py": {  # scrapy-redis's REDIS_START_URLS_KEY (a list; SPOP
        # for a set): an entry that is no URL or JSON object, or is too long, is logged and
        # dropped, the rest crawled (tests/contrib/test_scrapy_contract.py)
        "reads": {"lpop": 1},
        "streams": [],
        "signed": False,
    },
    "queues/lua/dead_letters.lua": {  # the dead letters, read back for the API and CLI
        "reads": {"lrange": 1},
        "streams": [],
        "signed": False,
    },
}

_READ = re.compile(r"\b(xreadgroup|xautoclaim|xread|xrevrange|xrange|blmove|lmove|lrange|"
                   r"blpop|brpop|lpop|rpop|zpopmin|bzpopmin|psubscribe|subscribe)\b",
                   re.IGNORECASE)


def test_the_inventory_names_every_read_site() -> None:
    found: dict[str, Counter[str]] = {}
    for path in [*SRC.rglob("*.py"), *SRC.rglob("*.lua")]:
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("web/static"):
            continue
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            # calls (client.xreadgroup(...)) and Lua (redis.call('XRANGE', ...)) only
            for name in _READ.findall(code):
                if re.search(rf"(\.{name}\(|'{name}'|\"{name}\")", code, re.IGNORECASE):
                    found.setdefault(rel, Counter())[name.lower()] += 1
    expected = {f: dict(v["reads"]) for f, v in INVENTORY.items() if v["reads"]}
    assert {f: dict(c) for f, c in found.items()} == expected, (
        "a read site was added or moved: list it in INVENTORY and give it a malformed (and,"
        " for commands, a forged) entry test here")


def test_every_stream_is_either_signed_or_says_why_not() -> None:
    streams = [s for entry in INVENTORY.values() for s in entry["streams"]]
    assert len(streams) == len(set(streams))
    assert {*CENTER_CHANNELS, "center:allocations"} == {
        s for s in streams if s.startswith("center:")}


def rejected(stream: str, reason: str) -> float:
    return rejects.count(stream, reason)


async def dead_entries(redis: aioredis.Redis, key: str) -> list[dict[str, bytes]]:
    return [{k.decode(): v for k, v in fields.items()}
            for _, fields in await redis.xrange(key)]


# ------------------------------------------------------------------ the center's channels
class Fleet:
    """A center ``c1``, an agent ``a0`` and a site on the test Redis (a fresh prefix);
    every part signs with ``key`` when given."""

    def __init__(self, url: str, tmp: Path, key: str | None) -> None:
        self.url = url
        self.tmp = tmp
        self.prefix = f"t{uuid.uuid4().hex[:10]}:"
        self.signer = Signer(key) if key else None
        self.redis = aioredis.Redis.from_url(url)
        self.buses: list[Any] = []
        self.tasks: dict[str, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self.center: DownloadCenter | None = None
        self.agent: CenterWorker | None = None

    def bus(self) -> Any:
        bus = open_bus(self.url, prefix=self.prefix, signer=self.signer)
        self.buses.append(bus)
        return bus

    def key(self, channel: str) -> str:
        return f"{self.prefix}center:{channel}"

    @property
    def dead(self) -> str:
        return keys.dead_stream(self.prefix, "center")

    def _run(self, name: str, part: Any) -> None:
        stop = asyncio.Event()
        self.tasks[name] = (asyncio.create_task(part.run(stop)), stop)

    async def start(self) -> None:
        self.center = DownloadCenter(self.bus(), center_id="c1", dead_after=DEAD_AFTER,
                                     check_every=0.1, claim_after=0.5, sync_interval=0.5)
        self._run("c1", self.center)
        self.agent = CenterWorker(self.bus(), "a0", beat_every=0.1, state_dir=self.tmp)
        self._run("a0", self.agent)
        center = self.center
        await wait_for(lambda: center.live_agents() == ["a0"], "agent a0 live")

    def client(self, job: str) -> CenterClient:
        return CenterClient(self.bus(), job, strategy="fixed", agents=1,
                            allocate_timeout=5.0, timeout=5.0)

    async def serves(self, site: Site, job: str = "j1") -> None:
        """A job allocates and downloads: every channel carried its part."""
        async with self.client(job) as client:
            assert client.agents == ["a0"]
            reply = await client.fetch(f"{site.url}/page/1")
            assert reply.ok and reply.http_status == 200 and reply.agent == "a0"

    async def close(self) -> None:
        for _, stop in self.tasks.values():
            stop.set()
        if self.tasks:
            await asyncio.wait([t for t, _ in self.tasks.values()], timeout=10)
        for bus in self.buses:
            await bus.close()
        found = [k async for k in self.redis.scan_iter(match=f"{self.prefix}*", count=500)]
        if found:
            await self.redis.delete(*found)
        await self.redis.aclose()


@pytest.fixture
async def fleet(redis_url: str, tmp_path: Path) -> AsyncIterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(key: str | None = None) -> Fleet:
        f = Fleet(redis_url, tmp_path, key)
        made.append(f)
        return f

    yield make
    for f in made:
        await f.close()


#: channel family -> the channel a test writes to (``a0``'s, ``c1``'s, job ``j1``'s)
CENTER_CHANNELS = {
    "center:requests": REQUESTS, "center:register": REGISTER, "center:beats": BEATS,
    "center:ctl": "ctl:c1", "center:agent": "agent:a0", "center:job": "job:j1",
}
#: per family, a message of the right form and the wrong content (a field of the wrong
#: type), which its reader finds only when it serves it
WRONG_CONTENT: dict[str, dict[str, Any]] = {
    "center:requests": {"kind": "download", "job": "j1", "rid": "x", "exp": "soon"},
    "center:register": {"kind": "register", "info": {"agent_id": "zz", "pid": "many"},
                        "ts": 0},
    "center:beats": {"kind": "beat", "agent": "zz", "ts": "now", "beat": {}},
    "center:ctl": {"kind": "allocated", "agent": "a0", "token": ["x"], "ok": True},
    "center:agent": {"kind": "download", "job": "j1", "exp": [1]},
    "center:job": {"kind": "refused", "token": {"x": 1}},
}


@pytest.mark.parametrize("family", sorted(CENTER_CHANNELS))
async def test_a_malformed_entry_on_a_center_channel_is_set_aside_and_the_fleet_serves(
        fleet: Callable[..., Fleet], family: str) -> None:
    f = fleet()
    channel = CENTER_CHANNELS[family]
    before = rejected(family, rejects.MALFORMED)
    now = time.time()
    wrong = dict(WRONG_CONTENT[family])
    if "ts" in wrong and wrong["ts"] == 0:
        wrong["ts"] = now
    # written before anyone reads: a group channel's reader meets them first
    for header in (b"not-json{", b"[1, 2]", json.dumps(wrong).encode()):
        await f.redis.xadd(f.key(channel), {"h": header})
    await f.redis.xadd(f.key(channel), {"b": b"no header at all"})
    async with Site(pages=5) as site:
        await f.start()
        await f.serves(site)
    # the three the bus cannot take are counted at once; the wrong-content one when
    # its reader meets it (the ctl and job ones only once they are read)
    await wait_for(lambda: rejected(family, rejects.MALFORMED) - before >= 3,
                   f"the malformed entries of {family} counted")
    dead = await dead_entries(f.redis, f.dead)
    assert {d["stream"] for d in dead} == {f.key(channel).encode()}
    assert {d["reason"] for d in dead} == {b"malformed"}
    assert b"not-json{" in {d.get("h") for d in dead}
    # group channels: acked, nothing left pending for ever (a job's channel goes with it)
    if channel != BEATS and await f.redis.exists(f.key(channel)):
        pending = await f.redis.xpending(f.key(channel), "g")
        assert pending["pending"] == 0


async def test_a_wrong_content_request_does_not_stop_the_upkeep(
        fleet: Callable[..., Fleet]) -> None:
    # the second case: a bad request pending at a dead center is claimed by the
    # upkeep of a live one, which served nothing else until it was deleted by hand
    f = fleet()
    bus = f.bus()
    await bus.send(REQUESTS, {"kind": "download", "job": "j1", "exp": "soon"})
    await bus.read(REQUESTS, "dead-center", block=0.1)  # read, never acked: pending
    before = rejected("center:requests", rejects.MALFORMED)
    async with Site(pages=5) as site:
        await f.start()
        await f.serves(site)
    await wait_for(lambda: rejected("center:requests", rejects.MALFORMED) > before,
                   "the claimed request rejected")
    await wait_for(lambda: _pending(f, REQUESTS), "nothing pending on requests")


async def test_a_malformed_allocation_record_stops_neither_upkeep_nor_listing(
        fleet: Callable[..., Fleet]) -> None:
    from crawlhub.center import center_jobs

    f = fleet()
    table = f.key(ALLOCATIONS)
    await f.redis.hset(table, mapping={"bad1": "not-json{", "bad2": '{"agents": 5}',
                                       "bad3": '{"agents": ["a0"], "released": "no"}'})
    before = rejected("center:allocations", rejects.MALFORMED)
    async with Site(pages=5) as site:
        await f.start()
        await f.serves(site)
        assert f.center is not None
        center = f.center
        await wait_for(lambda: "a0" in center.infos, "a0 registered")
        await center.sync()  # the upkeep's own step: it used to raise here for good
        assert await center.take_back_dead() == 0
        async with f.client("j3") as client:
            assert [row["job"] for row in await center_jobs(f.bus())] == ["j3"]
            assert client.agents == ["a0"]
    # each counted once, however often and by however many readers it is read
    assert rejected("center:allocations", rejects.MALFORMED) - before == 3


async def _pending(f: Fleet, channel: str) -> bool:
    return (await f.redis.xpending(f.key(channel), "g"))["pending"] == 0


def forged(channel: str, header: dict[str, Any], key: str | None) -> dict[str, Any]:
    """The stream fields of a message on ``channel``: unsigned, or signed with ``key``."""
    head = json.dumps(header).encode()
    fields: dict[str, Any] = {"h": head}
    if key is not None:
        fields["t"], fields["s"] = Signer(key).sign(channel, head)
    return fields


#: per family, a forged message that would do harm if it were served
FORGED: dict[str, dict[str, Any]] = {
    "center:requests": {"kind": "allocate", "job": "evil", "strategy": "random", "n": 1,
                        "token": "t", "exp": 4e9},
    "center:register": {"kind": "register", "info": {"agent_id": "ghost"}, "ts": 0},
    "center:beats": {"kind": "beat", "agent": "ghost", "ts": 0, "beat": {}},
    "center:ctl": {"kind": "allocated", "agent": "ghost", "token": "join:j1", "job": "j1",
                   "ok": True},
    "center:agent": {"kind": "exit"},
    "center:job": {"kind": "reply", "rid": "j1-1", "status": "ok", "code": 200},
}


@pytest.mark.parametrize("family", sorted(CENTER_CHANNELS))
async def test_a_forged_entry_on_a_center_channel_is_dropped_and_counted(
        fleet: Callable[..., Fleet], family: str) -> None:
    f = fleet(KEY)
    channel = CENTER_CHANNELS[family]
    unsigned, bad = (rejected(family, rejects.UNSIGNED),
                     rejected(family, rejects.BAD_SIGNATURE))
    header = dict(FORGED[family])
    if header.get("ts") == 0:
        header["ts"] = time.time()
    await f.redis.xadd(f.key(channel), forged(channel, header, None))
    await f.redis.xadd(f.key(channel), forged(channel, header, OTHER_KEY))
    # signed right, but for another channel: a signature does not travel
    await f.redis.xadd(f.key(channel), forged("elsewhere", header, KEY))
    async with Site(pages=5) as site:
        await f.start()
        await f.serves(site)
        await wait_for(lambda: rejected(family, rejects.UNSIGNED) > unsigned
                       and rejected(family, rejects.BAD_SIGNATURE) - bad >= 2,
                       f"the forged entries of {family} counted")
        # none of them was obeyed: the agent runs, no ghost, no evil allocation
        await f.serves(site, job="j2")
    assert f.agent is not None and not f.agent.stop_event.is_set()  # type: ignore[union-attr]
    assert f.center is not None and "ghost" not in f.center.seen
    assert "ghost" not in f.center.infos
    assert await f.bus().get(ALLOCATIONS, "evil") is None
    dead = await dead_entries(f.redis, f.dead)
    assert {d["reason"] for d in dead} == {b"unsigned", b"bad_signature"}


async def test_without_the_key_an_agent_is_not_heard(fleet: Callable[..., Fleet]) -> None:
    f = fleet(KEY)
    before = rejected("center:beats", rejects.UNSIGNED)
    center = DownloadCenter(f.bus(), center_id="c1", dead_after=DEAD_AFTER)
    f._run("c1", center)
    stranger = CenterWorker(open_bus(f.url, prefix=f.prefix), "stranger", beat_every=0.1,
                            state_dir=f.tmp)
    f.buses.append(stranger.bus)
    f._run("stranger", stranger)
    await wait_for(lambda: rejected("center:beats", rejects.UNSIGNED) - before >= 3,
                   "the stranger's beats refused")
    assert center.live_agents() == []


async def test_a_beat_stamped_a_year_ahead_does_not_keep_an_exited_agent_alive(
        fleet: Callable[..., Fleet]) -> None:
    # the first forged case, on a fleet without a key: the stamp is refused
    f = fleet()
    before = rejected("center:beats", rejects.SKEW)
    await f.start()
    assert f.center is not None
    center = f.center
    task, stop = f.tasks.pop("a0")
    stop.set()
    await asyncio.wait([task], timeout=10)
    await f.bus().send(BEATS, {"kind": "beat", "agent": "a0", "ts": time.time() + 365 * 86400,
                               "beat": {}})
    await wait_for(lambda: rejected("center:beats", rejects.SKEW) > before,
                   "the far-future beat refused")
    await wait_for(lambda: center.live_agents() == [], "a0 dead after dead_after")
    assert center.seen["a0"] <= time.time()


async def test_liveness_is_the_centers_clock_at_receipt() -> None:
    clock = FakeClock(1_000_000.0)
    center = DownloadCenter(open_bus(f"memory://{uuid.uuid4().hex}"), dead_after=10,
                            max_skew=300, clock=clock)
    # ahead by 200 s (inside max_skew): alive from now, for dead_after - not 200 s more
    await center.beat([Envelope("1-0", {"kind": "beat", "agent": "a", "ts": clock() + 200,
                                        "beat": {}})])
    assert center.seen["a"] == clock() and center.alive("a")
    clock.advance(10)
    assert not center.alive("a")
    # a year ahead: refused outright
    skew = rejected("center:beats", rejects.SKEW)
    await center.beat([Envelope("2-0", {"kind": "beat", "agent": "b", "ts": clock() + 3e7,
                                        "beat": {}})])
    assert "b" not in center.seen and rejected("center:beats", rejects.SKEW) == skew + 1
    # a registration stamped ahead is refused too; an old one records, not revives
    await center.registered([Envelope("3-0", {"kind": "register", "ts": clock() + 3e7,
                                              "info": {"agent_id": "c"}})])
    await center.registered([Envelope("4-0", {"kind": "register", "ts": clock() - 3600,
                                              "info": {"agent_id": "d"}})])
    assert "c" not in center.infos and "d" in center.infos and not center.alive("d")
    await center.bus.close()


async def test_a_message_signed_outside_the_window_is_refused(
        fleet: Callable[..., Fleet]) -> None:
    f = fleet(KEY)
    bus = f.bus()
    head = json.dumps({"kind": "exit"}).encode()
    signer = Signer(KEY)
    for when in (time.time() + 3600, time.time() - 3600):
        t, s = signer.sign("agent:a0", head, now=when)
        await f.redis.xadd(f.key("agent:a0"), {"h": head, "t": t, "s": s})
    before = rejected("center:agent", rejects.SKEW)
    assert await bus.read("agent:a0", "a0", block=0.1) == []
    assert rejected("center:agent", rejects.SKEW) == before + 2
    # a registration may be old (queued while no center ran), never ahead
    t, s = signer.sign(REGISTER, head, now=time.time() - 3600)
    await f.redis.xadd(f.key(REGISTER), {"h": head, "t": t, "s": s})
    assert [e.header for e in await bus.read(REGISTER, "c1", block=0.1)] == [{"kind": "exit"}]


# ------------------------------------------------------------------ the log transport
async def test_a_malformed_log_entry_is_set_aside_and_the_collector_goes_on(
        redis_url: str, unique_name: str, tmp_path: Path) -> None:
    from crawlhub.backends.redis import redis_client
    from crawlhub.control.db import ControlDB
    from crawlhub.control.logs import LogLine, LogQuery, open_log_store
    from crawlhub.control.logs.transport import LogCollector, encode_batch

    prefix = f"{unique_name}:"
    stream = keys.log_keys(prefix)["stream"]
    store = open_log_store(await ControlDB.open(f"sqlite:///{tmp_path}/logs.db"))
    await store.open()
    collector = LogCollector(redis_client(redis_url, name="collector"), stream, store,
                             block=0.05)
    redis = aioredis.Redis.from_url(redis_url)
    before = rejected("logs", rejects.MALFORMED)
    try:
        await collector.ensure_group()
        for fields in ({"lines": "not-json{"}, {"lines": '[["x"]]'}, {"other": "x"},
                       {"lines": encode_batch([LogLine(message="good", ts=time.time())])}):
            await redis.xadd(stream, fields)
        collector.start()
        await wait_for(lambda: collector.stored == 1, "the good line stored")
        page = await store.search(LogQuery(limit=10))
        assert [x.message for x in page.lines] == ["good"]
        assert rejected("logs", rejects.MALFORMED) - before == 3
        assert await redis.xlen(stream) == 0
        dead = await dead_entries(redis, keys.dead_stream(prefix, "logs"))
        assert [d.get("lines") for d in dead] == [b"not-json{", b'[["x"]]', None]
    finally:
        await collector.close()
        await store.close()
        await redis.delete(stream, keys.dead_stream(prefix, "logs"))
        await redis.aclose()


# ------------------------------------------------------------------ the control channel
@pytest.mark.parametrize("signed", [False, True], ids=["no-key", "key"])
async def test_a_malformed_or_forged_control_announcement_changes_nothing(
        redis_url: str, unique_name: str, tmp_path: Path, signed: bool) -> None:
    from crawlhub.control.channel import ControlChannel, RedisNotifier
    from crawlhub.control.db import ControlDB

    prefix = f"{unique_name}:"
    signer = Signer(KEY) if signed else None
    db = await ControlDB.open(f"sqlite:///{tmp_path}/control.db")
    setter = ControlChannel(db, RedisNotifier(redis_url, prefix=prefix, signer=signer))
    watcher = ControlChannel(db, RedisNotifier(redis_url, prefix=prefix, signer=signer),
                             reread=60)
    redis = aioredis.Redis.from_url(redis_url)
    channel = keys.control_channel(prefix, "nightly")
    counts = {r: rejected("control", r) for r in (rejects.MALFORMED, rejects.SKEW,
                                                   rejects.UNSIGNED)}
    await setter.open()
    try:
        watch = watcher.watch("nightly")
        assert await anext(watch) == "run"
        # a forger's pause, stamped far ahead: obeyed, it would also hide every real
        # change made before that time
        far = json.dumps({"job": "nightly", "state": "pause", "changed_at": time.time() + 1e6})
        near = json.dumps({"job": "nightly", "state": "pause", "changed_at": time.time() + 1})

        # an unsigned pause stamped now is obeyed without a key (the documented default),
        # refused with one
        payloads = ("not-json{", far, near) if signed else ("not-json{", far)

        async def heard() -> bool:  # published until the watcher hears them
            for payload in payloads:
                await redis.publish(channel, payload)
            grew = {r: rejected("control", r) - counts[r] for r in counts}
            return grew[rejects.MALFORMED] > 0 and grew[rejects.SKEW] > 0 and (
                not signed or grew[rejects.UNSIGNED] > 0)

        await wait_for(heard, "the bad announcements heard and counted")
        await setter.set("nightly", "exit")
        # the next state the job sees is the real one, not the forged pause
        assert await asyncio.wait_for(anext(watch), 10) == "exit"
        await watch.aclose()  # type: ignore[attr-defined]
        dead = await dead_entries(redis, keys.dead_stream(prefix, "control"))
        assert {d["stream"] for d in dead} == {channel.encode()}
    finally:
        await setter.close()
        await watcher.close()
        await db.close()
        await redis.delete(keys.dead_stream(prefix, "control"))
        await redis.aclose()


# ------------------------------------------------------------------ Redis inbounds
@pytest.mark.parametrize("kind", ["list", "stream"])
async def test_a_malformed_inbound_message_is_set_aside_and_the_inbound_goes_on(
        redis_url: str, unique_name: str, kind: str) -> None:
    from crawlhub.hub.inbounds.redis import RedisInbound

    key = f"{unique_name}:in"
    inbound = RedisInbound("feed", {"url": redis_url, "key": key, "type": kind,
                                    "block": 0.1})
    redis = aioredis.Redis.from_url(redis_url)
    got: list[dict[str, Any]] = []

    async def deliver(messages: list[dict[str, Any]]) -> None:
        got.extend(messages)

    raws = [b"not-json{", b"[1, 2]", b'{"n": NaN}', b"\xff\xfe", b'{"n": 1}']
    for raw in raws:
        if kind == "list":
            await redis.lpush(key, raw)
        else:
            await redis.xadd(key, {"data": raw})
    if kind == "stream":
        await redis.xadd(key, {b"\xff": b"\xfe"})  # no payload field, not UTF-8: taken as text
    before = rejected("inbound:redis", rejects.MALFORMED)
    stop = asyncio.Event()
    task = asyncio.create_task(inbound.run(deliver, stop))
    try:
        await wait_for(lambda: {"n": 1} in got, "the good message delivered")
        await wait_for(lambda: rejected("inbound:redis", rejects.MALFORMED) - before >= 4,
                       "the malformed messages counted")
        assert sorted(await redis.lrange(inbound.dead_key, 0, -1)) == sorted(raws[:4])
    finally:
        stop.set()
        await asyncio.wait([task], timeout=5)
        await redis.delete(key, inbound.processing, inbound.dead_key)
        await redis.aclose()


def test_a_junk_kafka_message_is_counted_and_skipped() -> None:
    from types import SimpleNamespace

    from crawlhub.hub.inbounds.kafka import KafkaInbound

    inbound = KafkaInbound("k", {"consumer_settings": {"bootstrap.servers": "127.0.0.1:9",
                                                       "group.id": "g"}, "topics": ["t"]})
    partition = SimpleNamespace(topic="t", partition=0)
    before = rejected("inbound:kafka", rejects.MALFORMED)
    for n, value in enumerate([b"not-json{", b"[1]", b"\xff", b'{"n": 1}']):
        got = inbound._decode(partition, SimpleNamespace(value=value, offset=n))
    assert got == {"n": 1}
    assert rejected("inbound:kafka", rejects.MALFORMED) == before + 3


# ------------------------------------------------------------------ the agent registry
async def test_a_malformed_registry_entry_hides_no_other_agent(redis_url: str,
                                                               unique_name: str) -> None:
    from crawlhub.agents.registry import AgentInfo, open_registry

    prefix = f"{unique_name}:"
    registry = open_registry(redis_url, prefix=prefix, dead_after=10)
    k = keys.agent_keys(prefix)
    redis = aioredis.Redis.from_url(redis_url)
    before = {r: rejected("agents:registry", r) for r in (rejects.MALFORMED, rejects.SKEW)}
    try:
        await registry.register(AgentInfo("good", "h", 1, "1"))
        await redis.hset(k["info"], "junk", "not-json{")
        await redis.zadd(k["seen"], {"junk": time.time()})
        await registry.register(AgentInfo("ahead", "h", 2, "1"))
        await redis.zadd(k["seen"], {"ahead": time.time() + 365 * 86400})  # forged
        for _ in range(3):  # read on every sync: counted once
            assert [a.agent_id for a in await registry.agents()] == ["good"]
        assert rejected("agents:registry", rejects.MALFORMED) == before[rejects.MALFORMED] + 1
        assert rejected("agents:registry", rejects.SKEW) == before[rejects.SKEW] + 1
    finally:
        await redis.delete(*k.values())
        await redis.aclose()
        await registry.close()


# ------------------------------------------------------------------ what an operator sees
async def test_rejections_are_on_the_metrics_page(tmp_path: Path) -> None:
    import httpx2

    from crawlhub.app.asgi import create_app
    from crawlhub.config.schema import CrawlhubConfig
    from crawlhub.services import Services

    bus = open_bus(f"memory://{uuid.uuid4().hex}")
    await bus.reject("beats", Envelope("7-0", {"kind": "beat"}), rejects.MALFORMED, "test")
    await bus.close()
    svc = await Services.open(CrawlhubConfig.model_validate({"data_dir": str(tmp_path)}))
    try:
        client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(services=svc)),
                                    base_url="http://crawlhub.test")
        text = (await client.get("/metrics")).text
        await client.aclose()
    finally:
        await svc.close()
    assert any(line.startswith("crawlhub_stream_entries_rejected_total{")
               and 'stream="center:beats"' in line and 'reason="malformed"' in line
               for line in text.splitlines())


def test_a_signature_binds_channel_header_and_body_and_never_shows_the_key() -> None:
    signer = Signer(KEY)
    t, s = signer.sign("agent:a0", b'{"kind":"exit"}', b"")
    assert signer.verify("agent:a0", b'{"kind":"exit"}', b"", t, s) is None
    for change in (("agent:a1", b'{"kind":"exit"}', b""), ("agent:a0", b'{"kind":"exix"}', b""),
                   ("agent:a0", b'{"kind":"exit"}', b"x")):
        assert signer.verify(*change, t, s) == (rejects.BAD_SIGNATURE, ANY_TEXT)
    assert KEY not in repr(signer) and KEY not in str(signer)


class _AnyText(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)

    def __hash__(self) -> int:
        return 0


ANY_TEXT = _AnyText()
