"""robots.txt in the agent and the one-process crawl: a disallowed URL is never requested,
its result is 2007 and it is acked; ``--no-robots`` fetches it. And the agent's registry
heartbeat: memory/CPU filled in, a forgotten agent registers again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from crawlhub.agents.agent import Agent, HubReport
from crawlhub.agents.downloader import DEFAULT_USER_AGENT, Downloader, DownloaderConfig
from crawlhub.agents.politeness import RobotsCache, http_fetcher, open_gate_store
from crawlhub.agents.registry import LoadMeter, open_registry
from crawlhub.app.crawl import Crawl, CrawlOptions
from crawlhub.services import Services
from tests.agents.servers import Site
from tests.agents.test_agent import config, run_until_idle
from tests.agents.test_crawl import rows

ROBOTS = "User-agent: *\nDisallow: /page/5\n"


class RobotsSite(Site):
    """The test site with a robots.txt that disallows ``/page/5``."""

    def __init__(self, pages: int) -> None:
        super().__init__(pages=pages)
        self.app.router.add_get("/robots.txt", self.robots)

    async def robots(self, request: web.Request) -> web.Response:
        return web.Response(text=ROBOTS, content_type="text/plain")


async def test_crawl_never_requests_a_path_robots_disallows_and_counts_it(
        tmp_path: Path) -> None:
    async with RobotsSite(pages=30) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, concurrency=8)
        progress = await Crawl(opts).run()
        assert site.hits["/page/5"] == 0
        assert site.hits["/robots.txt"] == 1  # once per origin, then from memory
        assert progress.robots == 1 and progress.errors == 0
        assert progress.pages == 29 and progress.items == 29
        assert f"{site.url}/page/5" not in {i["url"] for i in rows(out)}


class UserAgentRobotsSite(Site):
    """A site whose robots.txt disallows ``/page/5`` only to the downloader's User-Agent
    (every other asker gets an empty file); ``asked`` lists the User-Agents that read it."""

    def __init__(self, pages: int, refused: str = DEFAULT_USER_AGENT) -> None:
        super().__init__(pages=pages)
        self.refused = refused
        self.asked: list[str] = []
        self.agents: set[str] = set()  # the User-Agents of page requests
        self.app.router.add_get("/robots.txt", self.robots)
        self.app.middlewares.append(self._agents)

    @web.middleware
    async def _agents(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.agents.add(request.headers.get("User-Agent", ""))
        return await handler(request)  # type: ignore[no-any-return]

    async def robots(self, request: web.Request) -> web.Response:
        agent = request.headers.get("User-Agent", "")
        self.asked.append(agent)
        text = ROBOTS if agent == self.refused else ""
        return web.Response(text=text, content_type="text/plain")


async def test_crawl_reads_robots_txt_with_its_downloaders_user_agent(tmp_path: Path) -> None:
    async with UserAgentRobotsSite(pages=30) as site:
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", follow=True, concurrency=8)
        progress = await Crawl(opts).run()
        assert site.asked == [DEFAULT_USER_AGENT]
        assert site.hits["/page/5"] == 0 and progress.robots == 1


async def test_crawl_user_agent_is_sent_with_every_request_and_robots_read_for_it(
        tmp_path: Path) -> None:
    async with UserAgentRobotsSite(pages=30, refused="mybot/1.0") as site:
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", follow=True, concurrency=8,
                            user_agent="mybot/1.0")
        progress = await Crawl(opts).run()
        assert site.asked == ["mybot/1.0"] and site.agents == {"mybot/1.0"}
        assert site.hits["/page/5"] == 0 and progress.robots == 1


async def test_crawl_with_robots_off_fetches_the_disallowed_path(tmp_path: Path) -> None:
    async with RobotsSite(pages=30) as site:
        out = tmp_path / "items.jsonl"
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=out, data_dir=tmp_path / "data",
                            follow=True, concurrency=8, robots=False)
        progress = await Crawl(opts).run()
        assert site.hits["/page/5"] == 1
        assert site.hits["/robots.txt"] == 0
        assert progress.robots == 0 and progress.pages == 30


async def test_crawl_with_a_per_domain_limit_also_honours_robots(tmp_path: Path) -> None:
    async with RobotsSite(pages=30) as site:
        opts = CrawlOptions(urls=[f"{site.url}/page/0"], out=tmp_path / "items.jsonl",
                            data_dir=tmp_path / "data", follow=True, concurrency=8,
                            per_domain=2)
        progress = await Crawl(opts).run()
        assert site.hits["/page/5"] == 0 and progress.robots == 1
        assert site.peak <= 2


async def test_agent_reports_a_robots_disallowed_url_with_2007_and_acks_it(
        tmp_path: Path) -> None:
    async with RobotsSite(pages=10) as site:
        services = await Services.open(config(tmp_path, dont_retry_status=[2007]))
        robots = RobotsCache(open_gate_store(f"sqlite:///{tmp_path / 'gate.db'}"),
                             http_fetcher("crawlhub-test"))
        downloader = Downloader(DownloaderConfig())
        try:
            await services.hub.submit([{"url": f"{site.url}/page/5"},
                                       {"url": f"{site.url}/page/1"}])
            agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                          report=HubReport(services.hub, "http"), concurrency=2,
                          robots=robots)
            await run_until_idle(services, agent)
            assert site.hits["/page/5"] == 0 and site.hits["/page/1"] == 1
            assert agent.stats.by_code == {1000: 1, 2007: 1}
            stats = await services.queues.queue("pages").stats()
            assert stats.left == 0 and stats.success == 2  # both acked
        finally:
            await downloader.close()
            await robots.store.close()
            await services.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_heartbeat_the_registry_refuses_registers_the_agent_again_with_its_load(
        tmp_path: Path) -> None:
    clock = Clock()
    registry = open_registry(f"sqlite:///{tmp_path / 'agents.db'}", dead_after=11,
                             retention=60, clock=clock)
    services = await Services.open(config(tmp_path))
    downloader = Downloader(DownloaderConfig())
    try:
        agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                      report=HubReport(services.hub, "http"), registry=registry,
                      agent_id="a1")
        meter = LoadMeter()
        assert await agent.heartbeat(meter)  # never registered: registers, then beats
        clock.now += 11 + 60 + 1  # silent past dead_after + retention: forgotten
        assert await registry.forget_dead() == 1
        assert await registry.get("a1") is None
        assert await agent.heartbeat(meter)
        status = await registry.get("a1")
        assert status is not None and status.alive
        assert status.beat is not None and status.beat.memory > 0
    finally:
        await downloader.close()
        await registry.close()
        await services.close()
