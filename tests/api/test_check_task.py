"""``POST /inbound/{name}/check_task/``: the dry run reports the converted task, the
selectors and outbound that decide, and the exact params that would be sent, or why
nothing takes the task; it changes nothing, not even for a result message."""

from __future__ import annotations

from typing import Any

from crawlhub.core.task import BUILTIN_KEYS

from .conftest import Api, MakeApi

SELECTOR = "task_src in [3] and not detail_url and data_type and task_parms['province'] == 'GD'"
INBOUNDS = [
    {"name": "http", "class": "http", "selector": ["task_src is not None", "detail_url"],
     "convert": ["common.ExtractTaskParams"]},
    {"name": "raw", "class": "http"},
]
OUTBOUNDS: list[dict[str, Any]] = [
    {"name": "off", "disable": True, "init": {"key": "q_off"}},
    {"name": "zongju_captcha_ts3", "selector": [SELECTOR], "init": {"key": "q_captcha"},
     "task_params": ["company_name", "credit_no", "data_type"], "task_src": 3,
     "task_type": "破码", "priority": 1000, "rt_priority": 2000, "retry_limits": 5},
    {"name": "wrapped", "selector": ["detail_url"], "init": {"key": "q_wrapped"},
     "task_params": ["detail_url"], "task_params_wrapped": True},
]
TASK = {"task_params": {"task_src": 3, "data_type": "change", "company_name": "ACME",
                        "credit_no": "9144", "task_parms": {"province": "GD"}},
        "noise": "not a param"}


async def dry_run(api: Api, message: dict[str, Any], inbound: str = "http") -> dict[str, Any]:
    r = await api.client.post(f"/inbound/{inbound}/check_task/", json=message)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def snapshot(api: Api) -> tuple[Any, ...]:
    """Everything the dry run must leave alone."""
    queues = {name: await api.queued(name) for name in ("q_off", "q_captcha", "q_wrapped")}
    rows = [{k: v for k, v in row.items() if k != "rate"}
            for row in (await api.client.get("/outbound/")).json()]
    stats = (await api.client.get("/queues/")).json()
    metrics = sorted(line for line in (await api.client.get("/metrics")).text.splitlines()
                     if line.startswith("crawlhub_"))
    return queues, await api.svc.state.pending(), rows, stats, metrics


async def test_reports_conversion_selectors_outbound_and_exact_unwrapped_params(
        make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    report = await dry_run(api, {**TASK, "rt": True})
    assert report["converted"]["company_name"] == "ACME"  # lifted out of task_params
    assert report["inbound_selector"] == "task_src is not None"
    assert report["outbound"] == "zongju_captcha_ts3"
    assert report["selector"] == SELECTOR
    params = report["params"]
    assert list(params)[:5] == ["company_name", "credit_no", "data_type", "task_src",
                                "task_type"]
    assert {k: params[k] for k in list(params)[:5]} == {
        "company_name": "ACME", "credit_no": "9144", "data_type": "change", "task_src": 3,
        "task_type": "破码"}
    assert "noise" not in params
    assert set(params) - set(list(params)[:5]) == set(BUILTIN_KEYS)
    assert params["outbound"] == "zongju_captcha_ts3" and params["routed_count"] == 1
    assert params["retry_limits"] == 5 and params["rt"] is True
    assert params["priority"] == report["priority"] == 2000  # rt_priority


async def test_reports_wrapped_params_under_task_params(make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    report = await dry_run(api, {"detail_url": "https://example.com/1"})
    assert report["outbound"] == "wrapped"
    assert list(report["params"]) == ["task_params"]
    inner = report["params"]["task_params"]
    assert inner["detail_url"] == "https://example.com/1"
    assert set(inner) == {"detail_url", *BUILTIN_KEYS}


async def test_says_why_no_outbound_takes_the_task(make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    report = await dry_run(api, {"task_src": 4})
    assert report["outbound"] is None
    assert "no outbound" in report["reason"]
    assert report["candidates"] == [
        {"outbound": "off", "matched": False, "reason": "disabled"},
        {"outbound": "zongju_captcha_ts3", "matched": False, "reason": "no selector matched"},
        {"outbound": "wrapped", "matched": False, "reason": "no selector matched"},
    ]


async def test_says_when_no_inbound_selector_takes_the_message(make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    report = await dry_run(api, {"unrelated": 1})
    assert report["action"] == "ignore"
    assert report["inbound_selector"] is None and "http" in report["reason"]


async def test_an_inbound_without_converters_reports_the_message_as_is(
        make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    report = await dry_run(api, TASK, inbound="raw")
    assert report["converted"] == TASK
    assert report["outbound"] is None  # task_src sits inside task_params, unconverted


async def test_an_unknown_inbound_is_404(make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    r = await api.client.post("/inbound/nope/check_task/", json=TASK)
    assert r.status_code == 404 and "nope" in r.json()["detail"]


async def test_a_dry_run_of_a_task_writes_nothing(make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    await api.client.post("/inbound/http/", json=TASK)  # something to leave alone
    before = await snapshot(api)
    for message in (TASK, {"detail_url": "u"}, {"task_src": 4}, {"unrelated": 1}):
        await dry_run(api, message)
    assert await snapshot(api) == before


async def test_a_dry_run_of_a_result_previews_the_outcome_and_changes_nothing(
        make_api: MakeApi) -> None:
    api = await make_api(inbound=INBOUNDS, outbound=OUTBOUNDS)
    uuid = (await api.client.post("/inbound/http/", json=TASK)).json()["task_uuid"]
    before = await snapshot(api)
    report = await dry_run(api, {"task_uuid": uuid, "task_result": 1500, "task_src": 3})
    assert report["action"] == "result" and report["outcome"] == "retry"
    assert report["outbound"] == "zongju_captcha_ts3"
    assert report["params"]["task_uuid"] == uuid and report["params"]["retry_times"] == 1
    assert (await dry_run(api, {"task_uuid": uuid, "task_result": 1000,
                                "task_src": 3}))["outcome"] == "success"
    assert await snapshot(api) == before
    assert (await api.svc.state.get(uuid)) is not None  # the ledger entry still waits
    real = await api.client.post("/inbound/http/", json={"task_uuid": uuid,
                                                         "task_result": 1000, "task_src": 3})
    assert real.json()["status"] == "success"
