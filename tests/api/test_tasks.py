"""``POST /task/``: one task or a list is routed and queued; every malformed, oversized or
unroutable request is a 4xx that says why, and never writes anything."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from crawlhub.core.task import BUILTIN_KEYS

from .conftest import MakeApi

#: What a client says of a JSON body (without it the body is refused: 415).
JSON = {"Content-Type": "application/json"}

ROUTES = [
    {"name": "gd", "selector": ["province == 'GD'"], "init": {"key": "q_gd"}, "task_src": 3},
    {"name": "urls", "selector": ["url"], "init": {"key": "q_urls"}},
]


async def test_one_task_is_routed_and_its_message_carries_the_builtin_keys(
        make_api: MakeApi) -> None:
    api = await make_api(outbound=ROUTES)
    r = await api.client.post("/task/", json={"province": "GD", "company_name": "ACME"})
    assert r.status_code == 200
    answer = r.json()
    assert answer["outbound"] == "gd" and answer["status"] == "routed"
    [message] = await api.payloads("q_gd")
    assert set(BUILTIN_KEYS) <= set(message)
    assert message["task_uuid"] == answer["task_uuid"]
    assert message["outbound"] == "gd" and message["routed_count"] == 1
    assert message["company_name"] == "ACME" and message["task_src"] == 3


async def test_a_list_gets_one_result_per_task_in_order(make_api: MakeApi) -> None:
    api = await make_api(outbound=ROUTES)
    r = await api.client.post("/task/", json=[{"url": "u1"}, {"province": "GD"},
                                              {"other": 1}, {"url": "u2"}])
    assert r.status_code == 200
    body = r.json()
    assert body["accepted"] == 3
    assert [t["status"] for t in body["tasks"]] == ["routed", "routed", "rejected", "routed"]
    assert [t.get("outbound") for t in body["tasks"]] == ["urls", "gd", None, "urls"]
    assert "no outbound" in body["tasks"][2]["reason"]
    assert len({t["task_uuid"] for t in body["tasks"]}) == 4
    assert [m["url"] for m in await api.payloads("q_urls")] == ["u1", "u2"]


async def test_a_task_no_outbound_takes_is_422_with_the_reason(make_api: MakeApi) -> None:
    api = await make_api(outbound=ROUTES)
    r = await api.client.post("/task/", json={"province": "JS"})
    assert r.status_code == 422
    assert "no outbound" in r.json()["detail"]
    assert await api.queued("q_gd") == await api.queued("q_urls") == 0
    assert await api.svc.state.pending() == 0


async def test_a_list_of_which_nothing_routes_is_422(make_api: MakeApi) -> None:
    api = await make_api(outbound=ROUTES)
    r = await api.client.post("/task/", json=[{"a": 1}, {"b": 2}])
    assert r.status_code == 422
    assert [t["status"] for t in r.json()["tasks"]] == ["rejected", "rejected"]


@pytest.mark.parametrize("raw", [b"{", b'{"url": }', b"{'url': 'single quotes'}",
                                 b'{"url": "x"} trailing', b"\xff\xfe\x00garbage"])
async def test_malformed_json_is_400(make_api: MakeApi, raw: bytes) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=raw,
                              headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "JSON" in r.json()["detail"] or "UTF-8" in r.json()["detail"]
    assert await api.queued("default") == 0


@pytest.mark.parametrize(("body", "named"), [
    ("a string", "the body"), (42, "the body"), (None, "the body"), (True, "the body"),
    ([1], "item 0"), ([{"url": "ok"}, "nope"], "item 1"), ([{"url": "ok"}, [{}]], "item 1"),
])
async def test_a_body_that_is_not_an_object_or_list_of_objects_is_422_naming_the_item(
        make_api: MakeApi, body: object, named: str) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=json.dumps(body), headers=JSON)
    assert r.status_code == 422
    assert r.json()["detail"].startswith(named)
    assert await api.queued("default") == 0


@pytest.mark.parametrize("raw", [b"", b"   \n", b"[]"])
async def test_an_empty_body_or_empty_list_is_4xx(make_api: MakeApi, raw: bytes) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=raw, headers=JSON)
    assert 400 <= r.status_code < 500
    assert r.json()["detail"]


LIMITED = {"server": {"max_body_bytes": 1000, "max_tasks_per_request": 5}}


def _big_list(size: int) -> bytes:
    return json.dumps([{"url": "x" * 50}] * 4 + [{"url": "y" * size}]).encode()


async def test_a_body_over_max_body_bytes_is_413(make_api: MakeApi) -> None:
    api = await make_api(**LIMITED)
    r = await api.client.post("/task/", content=_big_list(2000), headers=JSON)
    assert r.status_code == 413
    assert "max_body_bytes" in r.json()["detail"]
    assert await api.queued("default") == 0


async def test_a_body_under_max_body_bytes_is_accepted(make_api: MakeApi) -> None:
    api = await make_api(**LIMITED)
    r = await api.client.post("/task/", content=_big_list(100), headers=JSON)
    assert r.status_code == 200 and r.json()["accepted"] == 5


async def test_a_streamed_body_without_content_length_over_the_limit_is_413(
        make_api: MakeApi) -> None:
    api = await make_api(**LIMITED)

    async def chunks() -> AsyncIterator[bytes]:
        body = _big_list(2000)
        for start in range(0, len(body), 100):
            yield body[start:start + 100]

    r = await api.client.post("/task/", content=chunks(), headers=JSON)
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert r.status_code == 413
    assert await api.queued("default") == 0


async def test_a_body_longer_than_its_content_length_says_is_413(make_api: MakeApi) -> None:
    api = await make_api(**LIMITED)
    r = await api.client.post("/task/", content=_big_list(2000),
                              headers={"content-length": "20", **JSON})
    assert r.status_code == 413
    assert await api.queued("default") == 0


async def test_more_tasks_than_max_tasks_per_request_is_413(make_api: MakeApi) -> None:
    api = await make_api(**LIMITED)
    r = await api.client.post("/task/", json=[{"n": i} for i in range(6)])
    assert r.status_code == 413
    assert "max_tasks_per_request" in r.json()["detail"]
    assert await api.queued("default") == 0


@pytest.mark.parametrize("raw", [b'{"url": "x", "n": NaN}', b'{"url": "x", "n": Infinity}',
                                 b'{"url": "x", "n": -Infinity}', b'{"url": "x", "n": 1e400}',
                                 b'{"url": "x", "routed_count": 1e999}'])
async def test_numbers_json_cannot_carry_are_400(make_api: MakeApi, raw: bytes) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=raw, headers=JSON)
    assert r.status_code == 400
    assert "number" in r.json()["detail"]
    assert await api.queued("default") == 0
    assert await api.svc.state.pending() == 0


async def test_an_integer_too_long_to_read_is_400(make_api: MakeApi) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=b'{"n": ' + b"7" * 5000 + b"}",
                              headers=JSON)
    assert r.status_code == 400


async def test_json_nested_too_deeply_is_400(make_api: MakeApi) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=b'{"a": ' + b"[" * 100_000 + b"]" * 100_000
                              + b"}", headers=JSON)
    assert r.status_code == 400
    assert "nested" in r.json()["detail"]


@pytest.mark.parametrize("raw", [b'{"url": "\\ud800"}', b'{"\\udfff": 1, "url": "x"}',
                                 b'[{"url": "x", "deep": [{"k": "a\\udbffb"}]}]'])
async def test_text_with_a_lone_surrogate_is_400(make_api: MakeApi, raw: bytes) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=raw, headers=JSON)
    assert r.status_code == 400
    assert "surrogate" in r.json()["detail"]
    assert await api.queued("default") == 0


async def test_escaped_surrogate_pairs_and_backslashes_are_plain_text(make_api: MakeApi
                                                                      ) -> None:
    api = await make_api()
    r = await api.client.post("/task/",
                              content=b'{"url": "\\ud83d\\ude00", "path": "C:\\\\ud800"}',
                              headers=JSON)
    assert r.status_code == 200
    [message] = await api.payloads("default")
    assert message["url"] == "\U0001f600" and message["path"] == "C:\\ud800"


@pytest.mark.parametrize("given", [{"a": 1}, [1, 2], True, "", None])
async def test_a_task_uuid_that_is_not_text_or_a_number_is_replaced(
        make_api: MakeApi, given: object) -> None:
    api = await make_api()
    r = await api.client.post("/task/", json={"url": "x", "task_uuid": given})
    assert r.status_code == 200
    uuid = r.json()["task_uuid"]
    assert isinstance(uuid, str) and len(uuid) == 32
    [message] = await api.payloads("default")
    assert message["task_uuid"] == uuid


async def test_a_numeric_task_uuid_is_kept_as_text(make_api: MakeApi) -> None:
    api = await make_api()
    r = await api.client.post("/task/", json={"url": "x", "task_uuid": 12345})
    assert r.status_code == 200 and r.json()["task_uuid"] == "12345"
    [message] = await api.payloads("default")
    assert message["task_uuid"] == "12345"


async def test_integers_beyond_64_bits_keep_their_exact_value(make_api: MakeApi) -> None:
    api = await make_api()
    numbers = {"a": 2**64 + 1, "b": -(2**63) - 1, "c": 12345678901234567890123,
               "d": 2**64 - 1, "e": 1e19, "in_text": "9" * 30}
    body = json.dumps(numbers).encode()
    # (the dry run answers the message as the API read it)
    r = await api.client.post("/inbound/http/check_task/", content=body, headers=JSON)
    assert r.status_code == 200, r.text
    read = json.loads(r.content)["converted"]
    assert {k: read[k] for k in numbers} == numbers
    assert type(read["a"]) is int and type(read["e"]) is float
    assert (await api.client.post("/task/", content=body, headers=JSON)).status_code == 200
    # and as a worker leases them back (orjson alone reads 2**64 + 1 as a float)
    [message] = await api.payloads("default")
    assert {k: message[k] for k in numbers} == numbers
    assert type(message["a"]) is int and type(message["c"]) is int


async def test_a_body_with_a_utf8_bom_is_read_as_before(make_api: MakeApi) -> None:
    api = await make_api()
    r = await api.client.post("/task/", content=b'\xef\xbb\xbf{"url": "x"}', headers=JSON)
    assert r.status_code == 200, r.text
    assert [m["url"] for m in await api.payloads("default")] == ["x"]


def test_the_fast_parse_gives_what_the_strict_parse_gives_or_leaves_it_to_it() -> None:
    import math
    import random
    import struct

    from fastapi import HTTPException

    from crawlhub.api.deps import _SLOW, _fast_loads, _loads

    rng = random.Random(24)
    bodies = [b'{"a": 1}', b"[1, 2.5, -0.0, 1e308, 0.1e-400]", b'{"a": 1, "a": 2}',
              b'"\\u0000\\/\\ud83d\\ude00"', b"18446744073709551615", b"-9223372036854775808",
              b"-9223372036854775809", b"1" * 19, b"[1,]", b"NaN", b"1e400", b'"\\ud800"',
              b"\xef\xbb\xbf[]", b'"a\x01"', b"[01]", b"{'a': 1}", b" [ 1 ] ", b"[" * 1100]
    for _ in range(3000):
        bits = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(bits):
            bodies.append(repr(bits).encode())
        bodies.append(str(rng.randint(-2**70, 2**70)).encode())
        bodies.append(f"{rng.random() * 10 ** rng.randint(-30, 30):.{rng.randint(1, 20)}e}"
                      .encode())
    slow = 0
    for body in bodies:
        fast = _fast_loads(body)
        if fast is _SLOW:
            slow += 1
            continue
        try:
            strict = _loads(body)
        except HTTPException as exc:
            raise AssertionError(f"{body[:40]!r}: fast {fast!r}, strict {exc.detail}") from None
        assert json.dumps(fast) == json.dumps(strict), body[:40]
        assert type(fast) is type(strict), body[:40]
    assert 0 < slow < len(bodies) / 2
