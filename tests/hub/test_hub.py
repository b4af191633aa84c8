"""The live hub on SQLite and on real Redis: intake, results, lost tasks, backpressure,
token scopes, derive, and the taskHUB-compatible Redis list outbound and Redis inbound."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crawlhub.core.errors import BackpressureError
from crawlhub.hub.failures import FailureLog
from crawlhub.services import Services
from tests.helpers import wait_for
from tests.hub.conftest import delete_prefix

Opener = Callable[[Any], Any]


async def drain(svc: Services, queue: str, n: int = 100) -> list[dict[str, Any]]:
    messages = await svc.queues.queue(queue).lease(n, 60)
    await svc.queues.queue(queue).ack([m.id for m in messages])
    return [m.payload for m in messages]


async def test_submitted_task_lands_on_its_outbound_queue_with_builtin_keys(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "gd", "selector": ["province == 'GD'"], "init": {"key": "q_gd"},
         "task_src": 3},
        {"name": "rest", "init": {"key": "q_rest"}},
    ]))
    results = await svc.hub.submit([{"province": "GD", "n": 1}, {"province": "JS", "n": 2}])
    assert [r.outbound for r in results] == ["gd", "rest"]
    [gd] = await drain(svc, "q_gd")
    assert gd["n"] == 1 and gd["task_src"] == 3 and gd["outbound"] == "gd"
    assert gd["task_uuid"] == results[0].task_uuid and gd["submitter"] == "crawlhub"
    assert gd["routed_count"] == 1 and gd["retry_times"] == 0
    assert [m["n"] for m in await drain(svc, "q_rest")] == [2]


async def test_rt_tasks_are_leased_before_normal_tasks(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "o", "priority": 1, "rt_priority": 9}]))
    await svc.hub.submit([{"n": 1}, {"n": 2, "rt": True}, {"n": 3}])
    assert [m["n"] for m in await drain(svc, "o")] == [2, 1, 3]


async def test_task_no_outbound_takes_is_rejected_with_reason(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o", "selector": ["x == 1"]}]))
    [result] = await svc.hub.submit([{"x": 2}])
    assert result.status == "rejected" and "no outbound" in (result.reason or "")
    assert await svc.queues.queue("o").length() == 0


async def length_at_least(svc: Services, queue: str, n: int) -> bool:
    return await svc.queues.queue(queue).length() >= n


async def post_result(svc: Services, task: dict[str, Any], code: Any) -> dict[str, Any]:
    [outcome] = await svc.hub.receive("http", [{"task_uuid": task["task_uuid"],
                                                "task_result": code}])
    return outcome


async def test_terminal_result_counts_success(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o"}],
                                          routing={"terminal_codes": [1000]}))
    await svc.hub.submit([{"n": 1}])
    [task] = await drain(svc, "o")
    assert (await post_result(svc, task, 1000))["status"] == "success"
    [row] = await svc.hub.outbound_stats()
    assert row["success"] == 1 and row["total"] == 1 and row["left"] == 0


async def test_failed_result_is_retried_then_written_to_failure_file(
        make_config: Callable[..., Any], open_services: Opener, tmp_path: Path) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o", "retry_limits": 1}]))
    await svc.hub.submit([{"url": "http://x/1"}])
    [task] = await drain(svc, "o")
    assert (await post_result(svc, task, 500))["status"] == "retry"
    [again] = await drain(svc, "o")
    assert again["task_uuid"] == task["task_uuid"] and again["retry_times"] == 1
    assert again["routed_count"] == 2
    outcome = await post_result(svc, again, 500)
    assert outcome["status"] == "failed" and "retry_limits (1)" in outcome["reason"]
    [failure] = FailureLog(tmp_path / "failures.jsonl").read()
    assert failure["task"]["task_uuid"] == task["task_uuid"] and failure["task_result"] == 500
    [row] = await svc.hub.outbound_stats()
    assert (row["retried"], row["failed"], row["total"]) == (1, 1, 2)


async def test_failure_file_is_gzip_when_compress(
        make_config: Callable[..., Any], open_services: Opener, tmp_path: Path) -> None:
    svc = await open_services(make_config(
        outbound=[{"name": "o", "retry_limits": 0}],
        failure={"path": str(tmp_path / "failed.jsonl"), "compress": True}))
    await svc.hub.submit([{"n": 1}, {"n": 2}])
    for task in await drain(svc, "o"):
        await post_result(svc, task, 500)
    with gzip.open(tmp_path / "failed.jsonl.gz", "rt") as fh:
        lines = [json.loads(line) for line in fh]
    assert sorted(line["task"]["n"] for line in lines) == [1, 2]


async def test_failback_after_retries_goes_to_failback_outbound(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "main", "selector": ["kind == 'a'"], "retry_limits": 0, "failback": "backup",
         "reset_retry_times": True},
        {"name": "backup", "selector": ["False"]},
    ]))
    await svc.hub.submit([{"kind": "a"}])
    [task] = await drain(svc, "main")
    assert (await post_result(svc, task, 500))["status"] == "failback"
    [moved] = await drain(svc, "backup")
    assert moved["task_uuid"] == task["task_uuid"] and moved["outbound"] == "backup"


async def test_dont_retry_status_reroutes_to_another_outbound(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "fast", "selector": ["kind == 'a'"], "dont_retry_status": [404]},
        {"name": "slow", "selector": ["kind == 'a'"]},
    ]))
    await svc.hub.submit([{"kind": "a"}])
    [task] = await drain(svc, "fast")
    assert (await post_result(svc, task, 404))["status"] == "reroute"
    assert [t["task_uuid"] for t in await drain(svc, "slow")] == [task["task_uuid"]]


async def test_result_for_unknown_task_is_an_orphan_and_changes_nothing(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    outcome = await post_result(svc, {"task_uuid": "f" * 32}, 500)
    assert outcome["status"] == "orphan"
    assert await svc.queues.queue("o").length() == 0


async def test_redelivered_result_is_not_applied_twice(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o"}]))
    await svc.hub.submit([{"n": 1}])
    [task] = await drain(svc, "o")
    result = {"task_uuid": task["task_uuid"], "routed_count": task["routed_count"],
              "task_result": 500}
    assert (await svc.hub.receive("http", [result]))[0]["status"] == "retry"
    assert (await svc.hub.receive("http", [result]))[0]["status"] == "stale"
    [again] = await drain(svc, "o")
    assert again["retry_times"] == 1
    assert await svc.queues.queue("o").length() == 0
    done = {**result, "routed_count": again["routed_count"], "task_result": 1000}
    assert (await svc.hub.receive("http", [done]))[0]["status"] == "success"
    assert (await svc.hub.receive("http", [done]))[0]["status"] == "orphan"


async def test_a_batch_of_results_is_settled_as_each_result_alone_would_be(
        make_config: Callable[..., Any], open_services: Opener, tmp_path: Path) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o", "retry_limits": 1,
                                                     "dont_retry_status": [404]}]))
    await svc.hub.submit([{"n": i} for i in range(5)])
    tasks = sorted(await drain(svc, "o"), key=lambda t: t["n"])

    def result(task: dict[str, Any], code: int) -> dict[str, Any]:
        return {"task_uuid": task["task_uuid"], "routed_count": task["routed_count"],
                "task_result": code}

    batch = [result(tasks[0], 1000), result(tasks[1], 500), result(tasks[2], 404),
             result(tasks[3], 1000), {"task_uuid": "f" * 32, "task_result": 1000},
             result(tasks[3], 500),  # the same task twice in one batch: the second is late
             {"url": "http://x/new"}]  # a new task beside the results
    outcomes = await svc.hub.receive("http", batch, wait=True)
    assert [o["status"] for o in outcomes] == ["success", "retry", "failed", "success",
                                               "orphan", "orphan", "routed"]
    [again] = [t for t in await drain(svc, "o") if t.get("task_uuid") == tasks[1]["task_uuid"]]
    assert again["retry_times"] == 1
    [failure] = FailureLog(tmp_path / "failures.jsonl").read()
    assert failure["task"]["task_uuid"] == tasks[2]["task_uuid"]
    counters = (await svc.hub.state.counters())["o"]
    assert (counters["success"], counters["retried"], counters["failed"]) == (2, 1, 1)
    assert counters["total"] == 7  # 5 + the retry + the new task
    assert (await svc.hub.state.counters())[""]["orphan"] == 2
    # waiting: task 4 (no result yet), the retry of task 1, the new task
    assert await svc.hub.state.pending() == 3


async def test_task_without_result_within_result_timeout_is_retried_as_timeout(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "o", "result_timeout": "30s", "retry_limits": 1}]))
    await svc.hub.submit([{"n": 1}])
    [task] = await drain(svc, "o")
    assert await svc.hub.sweep_lost(now=time.time()) == 0
    assert await svc.hub.sweep_lost(now=time.time() + 31) == 1
    [again] = await drain(svc, "o")
    assert again["task_uuid"] == task["task_uuid"] and again["retry_times"] == 1
    [row] = await svc.hub.outbound_stats()
    assert row["timeout"] == 1 and row["retried"] == 1


async def test_lost_task_sweeper_runs_by_itself(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "o", "result_timeout": 0.2, "retry_limits": 0}]))
    await svc.start()
    await svc.hub.submit([{"n": 1}])
    await drain(svc, "o")
    async def failed() -> dict[str, Any] | None:
        [row] = await svc.hub.outbound_stats()
        return row if row["failed"] else None

    row = await wait_for(failed, "the sweeper to fail the lost task")
    assert row["failed"] == 1 and row["timeout"] == 1


async def test_max_lag_refuses_intake_without_writing_anything(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o", "max_lag": 2}]))
    await svc.hub.submit([{"n": 1}, {"n": 2}])
    with pytest.raises(BackpressureError) as info:
        await svc.hub.submit([{"n": 3}])
    assert "max_lag of 2" in str(info.value) and info.value.retry_after > 0
    assert await svc.queues.queue("o").length() == 2
    assert await svc.state.pending() == 2


async def test_max_lag_with_wait_pauses_until_consumers_catch_up(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[{"name": "o", "max_lag": 1}]))
    await svc.hub.submit([{"n": 1}])
    waiting = asyncio.create_task(svc.hub.submit([{"n": 2}], wait=True))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await drain(svc, "o")
    [result] = await asyncio.wait_for(waiting, 10)
    assert result.status == "routed"
    assert [m["n"] for m in await drain(svc, "o")] == [2]


async def test_token_scope_is_shared_by_outbounds_and_defers_the_excess(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "a", "selector": ["k == 'a'"], "token_scope": "site", "token_per_second": 3},
        {"name": "b", "selector": ["k == 'b'"], "token_scope": "site", "token_per_second": 3},
    ]))
    results = await svc.hub.submit([{"k": "a"}] * 2 + [{"k": "b"}] * 2)
    statuses = [r.status for r in results]
    assert statuses.count("routed") == 3 and statuses.count("deferred") == 1
    deferred = next(r for r in results if r.status == "deferred")
    assert "token scope 'site'" in (deferred.reason or "")
    total = await svc.queues.queue("a").length() + await svc.queues.queue("b").length()
    assert total == 3


async def test_token_wait_paces_dispatch_instead_of_deferring(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "a", "token_per_second": 20}]))
    results = await svc.hub.submit([{"n": i} for i in range(30)], wait=True)
    assert all(r.status == "routed" for r in results)
    assert await svc.queues.queue("a").length() == 30


async def test_token_scope_is_shared_across_hub_processes_on_redis(
        redis_url: str, tmp_path: Path, unique_name: str) -> None:
    from crawlhub.config.schema import CrawlhubConfig

    cfg = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path),
        "storage": {"queues": redis_url, "state": redis_url,
                    "redis_prefix": f"{unique_name}:"},
        "failure": {"path": str(tmp_path / "f.jsonl")},
        "outbound": [{"name": "o", "token_scope": "s", "token_per_second": 2}],
    })
    one, two = await Services.open(cfg), await Services.open(cfg)
    try:
        first = await one.hub.submit([{"n": 1}, {"n": 2}])
        second = await two.hub.submit([{"n": 3}])
        assert [r.status for r in first] == ["routed", "routed"]
        assert [r.status for r in second] == ["deferred"]
    finally:
        await one.close()
        await two.close()
        await delete_prefix(redis_url, f"{unique_name}:")


async def test_derive_inbound_turns_results_into_new_tasks(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(
        inbound=[{"name": "http", "class": "http"},
                 {"name": "spider_log", "class": "http", "derive": True,
                  "selector": ["task_result == 1000 and next_url"],
                  "convert": [{"class": "common.ExtractTaskParams"}]}],
        outbound=[{"name": "list", "selector": ["not next_url"]},
                  {"name": "detail", "selector": ["next_url"], "task_params": ["next_url"]}]))
    await svc.hub.submit([{"page": 1}])
    [task] = await drain(svc, "list")
    log_line = {"task_result": 1000, "next_url": "http://x/2",
                "task_params": {"page": 1, "task_uuid": task["task_uuid"]}}
    [outcome] = await svc.hub.receive("spider_log", [log_line])
    assert outcome["status"] == "routed" and outcome["outbound"] == "detail"
    [derived] = await drain(svc, "detail")
    assert derived["next_url"] == "http://x/2"
    assert derived["task_uuid"] != task["task_uuid"] and derived["retry_times"] == 0
    ignored = await svc.hub.receive("spider_log", [{"task_result": 500}])
    assert ignored[0]["status"] == "ignored"


async def test_result_inside_logged_task_params_is_matched_after_extract(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(
        inbound=[{"name": "logs", "class": "http",
                  "convert": ["logstash.RemoveBuildinKeys", "common.ExtractTaskParams"]}],
        outbound=[{"name": "o", "task_params_wrapped": True}]))
    await svc.hub.submit([{"company": "c"}])
    [wrapped] = await drain(svc, "o")
    sent = wrapped["task_params"]
    log_line = {"@timestamp": "2021-10-22", "host": "10.0.0.1", "task_result": 1000,
                "task_params": sent}
    [outcome] = await svc.hub.receive("logs", [log_line])
    assert outcome["status"] == "success" and outcome["task_uuid"] == sent["task_uuid"]


async def test_check_task_reports_route_and_params_without_side_effects(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    svc = await open_services(make_config(outbound=[
        {"name": "o", "selector": ["kind == 'a'"], "task_params": ["kind"], "task_src": 7}]))
    report = await svc.hub.check_task("http", {"kind": "a", "other": 1})
    assert report["outbound"] == "o" and report["selector"] == "kind == 'a'"
    assert report["params"]["kind"] == "a" and report["params"]["task_src"] == 7
    assert "other" not in report["params"]
    assert await svc.queues.queue("o").length() == 0 and await svc.state.pending() == 0
    none = await svc.hub.check_task("http", {"kind": "b"})
    assert none["outbound"] is None and none["candidates"][0]["reason"] == "no selector matched"


@pytest.mark.parametrize("sorted_set", [False, True])
async def test_redis_list_outbound_is_taskhub_compatible(
        sorted_set: bool, redis_url: str, tmp_path: Path, unique_name: str) -> None:
    import redis.asyncio as aioredis

    from crawlhub.config.schema import CrawlhubConfig

    key = f"{unique_name}:spider"
    cfg = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "failure": {"path": str(tmp_path / "f.jsonl")},
        "storage": {"queues": f"sqlite:///{tmp_path}/q.db", "state": f"sqlite:///{tmp_path}/h.db"},
        "outbound": [{"name": "captcha", "class": "redis_queue.RedisListOutbound",
                      "init": {"url": redis_url, "key": key, "sorted": sorted_set},
                      "task_params": ["company_name"], "task_params_wrapped": True,
                      "task_type": "破码", "priority": 1000, "rt_priority": 2000}],
    })
    svc = await Services.open(cfg)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await svc.hub.submit([{"company_name": "a"}, {"company_name": "b", "rt": True},
                              {"company_name": "c"}])
        if sorted_set:
            popped = [json.loads(m) for m, _ in await client.zpopmin(key, 3)]
        else:
            popped = [json.loads((await client.brpop([key], 1))[1]) for _ in range(3)]
        params = [p["task_params"] for p in popped]
        assert [p["company_name"] for p in params] == ["b", "a", "c"]
        assert params[0]["task_type"] == "破码" and params[0]["priority"] == 2000
        [row] = await svc.hub.outbound_stats()
        assert row["total"] == 3 and row["left"] == 0
    finally:
        await client.delete(key)
        await client.aclose()
        await svc.close()


@pytest.mark.parametrize("kind", ["list", "stream"])
async def test_redis_inbound_feeds_the_hub_at_least_once(
        kind: str, make_config: Callable[..., Any], open_services: Opener, redis_url: str,
        unique_name: str) -> None:
    import redis.asyncio as aioredis

    key = f"{unique_name}:in"
    svc = await open_services(make_config(
        inbound=[{"name": "feed", "class": "redis", "threads": 2,
                  "init": {"url": redis_url, "key": key, "type": kind, "block": 0.1}}],
        outbound=[{"name": "o"}]))
    client = aioredis.Redis.from_url(redis_url)
    try:
        for n in range(5):
            raw = json.dumps({"n": n})
            if kind == "list":
                await client.lpush(key, raw)
            else:
                await client.xadd(key, {"data": raw})
        if kind == "list":
            await client.lpush(key, "not json")
        await svc.start()
        await wait_for(lambda: length_at_least(svc, "o", 5), "5 tasks from the inbound")
        assert sorted(m["n"] for m in await drain(svc, "o")) == [0, 1, 2, 3, 4]
        if kind == "list":
            assert await client.llen(key) == 0
            assert await client.llen(f"{key}:processing:feed") == 0
        else:
            pending = await client.xpending(key, "crawlhub-feed")
            assert pending["pending"] == 0
    finally:
        await client.delete(key, f"{key}:processing:feed", f"{key}:dead:feed")
        await client.aclose()


async def test_redis_list_inbound_redelivers_what_a_crash_left_in_processing(
        make_config: Callable[..., Any], open_services: Opener, redis_url: str,
        unique_name: str) -> None:
    import redis.asyncio as aioredis

    key = f"{unique_name}:in"
    client = aioredis.Redis.from_url(redis_url)
    # A previous hub took this message off the list and died before delivering it.
    await client.lpush(f"{key}:processing:feed", json.dumps({"n": 42}))
    svc = await open_services(make_config(
        inbound=[{"name": "feed", "class": "redis",
                  "init": {"url": redis_url, "key": key, "block": 0.1}}],
        outbound=[{"name": "o"}]))
    try:
        await svc.start()
        await wait_for(lambda: length_at_least(svc, "o", 1), "the inbound's task")
        assert [m["n"] for m in await drain(svc, "o")] == [42]
    finally:
        await client.delete(key, f"{key}:processing:feed")
        await client.aclose()


async def test_a_push_that_fails_leaves_no_ledger_entry_behind(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    from tests.servers import free_port

    svc = await open_services(make_config(outbound=[
        {"name": "ok", "selector": ["k == 1"]},
        {"name": "down", "class": "redis_list", "selector": ["k == 2"],
         "init": {"url": f"redis://127.0.0.1:{free_port()}/0", "key": "nowhere"}}]))
    results = await svc.hub.submit([{"k": 1}, {"k": 2}])
    # Answered per task: the one pushed is routed, the other says its push failed.
    assert [r.status for r in results] == ["routed", "unavailable"]
    assert "connect" in (results[1].reason or "").lower()
    # The task that reached its queue stays known; the one that reached nothing is gone.
    assert await svc.state.pending() == 1
    [queued] = await drain(svc, "ok")
    assert await svc.state.get(queued["task_uuid"]) is not None


@pytest.mark.parametrize("kind", ["list", "stream"])
async def test_redis_inbound_sets_aside_a_message_the_hub_keeps_refusing(
        kind: str, make_config: Callable[..., Any], open_services: Opener, redis_url: str,
        unique_name: str) -> None:
    import redis.asyncio as aioredis

    key = f"{unique_name}:in"
    svc = await open_services(make_config(
        inbound=[{"name": "feed", "class": "redis",
                  "convert": [{"class": "tests.hub.converters:ExplodeOn", "init": {"value": 2}}],
                  "init": {"url": redis_url, "key": key, "type": kind, "block": 0.1}}],
        outbound=[{"name": "o"}]))
    client = aioredis.Redis.from_url(redis_url)
    try:
        for raw in ['{"n": 1}', '{"n": 2}', '{"n": 3}', '{"n": NaN}']:
            if kind == "list":
                await client.lpush(key, raw)
            else:
                await client.xadd(key, {"data": raw})
        await svc.start()
        async def set_aside() -> bool:
            return await client.llen(f"{key}:dead:feed") >= 2

        await wait_for(set_aside, "the refused and the malformed message set aside")
        assert sorted(m["n"] for m in await drain(svc, "o")) == [1, 3]
        # the one the hub refuses, and the one that is not JSON (NaN), kept for inspection
        assert sorted(await client.lrange(f"{key}:dead:feed", 0, -1)) == [
            b'{"n": 2}', b'{"n": NaN}']
    finally:
        await client.delete(key, f"{key}:processing:feed", f"{key}:dead:feed")
        await client.aclose()


async def test_converter_failure_is_a_convert_error_naming_inbound_and_converter(
        make_config: Callable[..., Any], open_services: Opener) -> None:
    from crawlhub.core.errors import ConvertError

    svc = await open_services(make_config(
        inbound=[{"name": "feed", "class": "http",
                  "convert": [{"class": "tests.hub.converters:ExplodeOn", "init": {"value": 2}}]}],
        outbound=[{"name": "o"}]))
    with pytest.raises(ConvertError, match=r"inbound 'feed': convert\[0\] \(ExplodeOn\)"):
        await svc.hub.receive("feed", [{"n": 2}])
    assert await svc.queues.queue("o").length() == 0
