"""Per-task extraction rules: a task's ``extract`` names a set of the agent's --extract file
or holds inline rules (compiled once per distinct set); invalid rules make that task a
parse error (2005), never the agent's or the flush's; links carry the parent's ``extract``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from crawlhub.agents.agent import Agent, CrawledPage, HubReport, link_tasks
from crawlhub.agents.downloader import Downloader, Fetched
from crawlhub.agents.extract import Extracted, ExtractionRules, RuleSets
from crawlhub.core.errors import ConfigError
from crawlhub.queues.base import Message
from crawlhub.services import Services
from tests.agents.servers import Site
from tests.agents.test_agent import config, run_until_idle

FILE = {
    "fields": {"title_text": {"css": "title::text"}},
    "rules": {"heading": {"fields": {"h1": {"css": "h1::text"}}},
              "linked": {"links": {"follow": True}}},
}


def test_a_task_without_extract_gets_the_default_and_a_name_its_named_set() -> None:
    sets = RuleSets.from_config(FILE)
    assert sets.for_task(None) is sets.default
    assert list(sets.default.config.fields) == ["title_text"]
    assert list(sets.for_task("heading").config.fields) == ["h1"]
    assert sets.for_task("linked").follow


def test_inline_rules_are_compiled_once_per_distinct_set_whatever_the_key_order() -> None:
    sets = RuleSets()
    a = {"fields": {"h1": {"css": "h1::text"}, "t": {"regex": "<title>(.*?)<"}},
         "links": {"follow": True}}
    b = {"links": {"follow": True},
         "fields": {"t": {"regex": "<title>(.*?)<"}, "h1": {"css": "h1::text"}}}
    first = sets.for_task(a)
    assert sets.for_task(b) is first
    assert sets.for_task({"fields": {"h1": {"css": "h2::text"}}}) is not first


def test_the_inline_cache_keeps_the_most_recently_used_sets_up_to_its_size() -> None:
    sets = RuleSets(cache_size=2)
    one, two, three = ({"fields": {f"f{n}": {"css": "h1"}}} for n in range(3))
    kept = sets.for_task(one)
    sets.for_task(two)
    assert sets.for_task(one) is kept  # used again: now the newest
    sets.for_task(three)  # evicts two, the least recently used
    assert sets.for_task(one) is kept
    assert len(sets._inline) == 2


@pytest.mark.parametrize(("spec", "key", "words"), [
    ({"fields": {"x": {"css": "a[["}}}, "extract.fields.x.css", "not a valid CSS"),
    ({"fields": {}, "bogus": 1}, "extract.bogus", "Extra inputs"),
    ({"fields": {"x": {"css": "a", "xpath": "//a"}}}, "extract.fields.x", "exactly one"),
    ("nope", "extract", "no rule set named 'nope'"),
    (42, "extract", "not int"),
    (["fields"], "extract", "not list"),
])
def test_invalid_task_rules_are_a_config_error_naming_the_key(spec: Any, key: str,
                                                              words: str) -> None:
    sets = RuleSets.from_config(FILE)
    for _ in range(2):  # the second time from the cache, with the same answer
        with pytest.raises(ConfigError, match=words) as caught:
            sets.for_task(spec)
        assert caught.value.key == key


def test_a_bad_named_set_in_the_file_is_refused_naming_its_key() -> None:
    with pytest.raises(ConfigError) as caught:
        RuleSets.from_config({"rules": {"product": {"fields": {"p": {"xpath": "//["}}}}},
                             file="rules.yaml")
    assert caught.value.key == "extract.rules.product.fields.p.xpath"
    assert caught.value.file == "rules.yaml"
    with pytest.raises(ConfigError) as caught:
        RuleSets.from_config({"rules": ["product"]})
    assert caught.value.key == "extract.rules"


def page(task: dict[str, Any], links: list[str] | None) -> CrawledPage:
    url = str(task["url"])
    fetched = Fetched(url, url, 200, {}, b"", 0.0, None, "success")
    extracted = None if links is None else Extracted(links=links)
    return CrawledPage("q", Message("1", task, 0, 1, 0.0), fetched, extracted, 1000)


def test_links_carry_the_extract_of_the_page_that_found_them_first() -> None:
    spec = {"fields": {"h1": {"css": "h1::text"}}, "links": {"follow": True}}
    pages = [page({"url": "http://s/a"}, ["http://s/1"]),
             page({"url": "http://s/b", "extract": spec}, ["http://s/1", "http://s/2"]),
             page({"url": "http://s/c", "extract": "heading"}, ["http://s/3"]),
             page({"url": "http://s/d", "extract": "heading"}, None)]
    links = {"http://s/1": 1, "http://s/2": 2, "http://s/3": 1}
    assert link_tasks(links, pages) == [
        {"url": "http://s/1", "depth": 1},  # page a found it first, and had none
        {"url": "http://s/2", "depth": 2, "extract": spec},
        {"url": "http://s/3", "depth": 1, "extract": "heading"},
    ]
    assert link_tasks(links, pages[:1]) == [{"url": u, "depth": d} for u, d in links.items()]


async def test_the_agent_runs_each_tasks_rules_and_a_task_with_bad_rules_is_a_parse_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "crawlhub.agents.agent")
    inline = {"fields": {"first_link": {"css": "li a::attr(href)"}}}
    tasks: list[dict[str, Any]] = [
        {"task_uuid": "plain", "url": "/page/1"},
        {"task_uuid": "named", "url": "/page/2", "extract": "heading"},
        {"task_uuid": "inline", "url": "/page/3", "extract": inline},
        {"task_uuid": "inline-again", "url": "/page/4", "extract": inline},
        {"task_uuid": "bad-css", "url": "/page/5",
         "extract": {"fields": {"x": {"css": "a[["}}}},
        {"task_uuid": "unknown-name", "url": "/page/6", "extract": "nope"},
        {"task_uuid": "unknown-key", "url": "/page/7", "extract": {"feilds": {}}},
        {"task_uuid": "not-rules", "url": "/page/8", "extract": 42},
    ]
    fields: dict[str, dict[str, Any]] = {}

    async def on_pages(pages: list[CrawledPage]) -> None:
        for p in pages:
            if p.extracted is not None:
                fields[p.task["task_uuid"]] = p.extracted.fields

    async with Site() as site:
        services = await Services.open(config(tmp_path, dont_retry_status=[2005]))
        downloader = Downloader()
        try:
            submitted = await services.hub.submit([{**t, "url": site.url + t["url"]}
                                                   for t in tasks])
            # invalid inline rules never reach an agent: the hub refuses them at intake
            refused = {r.task_uuid: r.reason for r in submitted if r.status == "rejected"}
            assert sorted(refused) == ["bad-css", "not-rules", "unknown-key"]
            assert "extract.fields.x.css" in str(refused["bad-css"])
            agent = Agent({"pages": services.queues.queue("pages")}, downloader,
                          report=HubReport(services.hub, "http"),
                          rules=RuleSets.from_config(FILE), on_pages=on_pages, concurrency=4)
            await run_until_idle(services, agent)
            assert fields == {
                "plain": {"title_text": "Page 1"},
                "named": {"h1": "Page 2"},
                "inline": {"first_link": "/page/31"},
                "inline-again": {"first_link": "/page/41"},
            }
            assert agent.stats.by_code == {1000: 4, 2005: 1}
            assert [site.hits[f"/page/{n}"] for n in range(1, 9)] == [1, 1, 1, 1, 0, 0, 0, 0]
            stats = await services.queues.queue("pages").stats()
            assert stats.left == 0 and stats.success == 5  # the bad one acked too
            counters = (await services.state.counters())["pages"]
            assert counters["success"] == 4 and counters["failed"] == 1
            logged = "\n".join(r.getMessage() for r in caplog.records)
            for uuid, key in [("unknown-name", "'extract'")]:
                line = next(x for x in logged.splitlines() if f"task {uuid} " in x)
                assert key in line and "parse error" in line
        finally:
            await downloader.close()
            await services.close()


def test_an_agent_given_plain_rules_uses_them_as_the_default() -> None:
    rules = ExtractionRules.from_config({"links": {"follow": True}})
    sets = RuleSets(rules)
    assert sets.for_task(None) is rules
