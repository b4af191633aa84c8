"""Scrapy requests to JSON and back (what the frontier stores): every field a request
carries survives; what JSON cannot hold is refused by name, never pickled."""

from __future__ import annotations

import json

import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st

from crawlhub.contrib.scrapy.codec import (
    Unserializable,
    dumps,
    loads,
    request_from_data,
    request_to_data,
)


class S(scrapy.Spider):
    name = "s"

    def parse_item(self, response: object) -> None: ...

    def failed(self, failure: object) -> None: ...


def test_a_request_survives_json_with_every_field() -> None:
    spider = S()
    request = scrapy.FormRequest(
        "http://127.0.0.1/search?q=1", formdata={"q": "café"}, callback=spider.parse_item,
        errback=spider.failed, headers={"X-A": ["1", "2"]}, cookies={"s": "1"},
        meta={"depth": 3, "raw": b"\x00\xff", "pair": (1, "a"), "keys": {1: "int key"},
              "nested": [{"a": None, "b": 1.5}], "\x00b": "looks like a tag"},
        priority=-7, dont_filter=True, cb_kwargs={"page": 2}, flags=["f"])
    text = dumps(request_to_data(request, spider))
    json.loads(text)  # plain JSON
    back = request_from_data(loads(text), spider)
    assert type(back) is scrapy.FormRequest
    assert (back.url, back.method, back.body, back.priority, back.dont_filter) == (
        request.url, "POST", request.body, -7, True)
    assert back.headers.getlist("X-A") == [b"1", b"2"]
    assert back.cookies == {"s": "1"} and back.cb_kwargs == {"page": 2}
    assert back.callback == spider.parse_item and back.errback == spider.failed
    assert back.meta == request.meta and back.flags == ["f"]


def test_what_json_cannot_hold_is_refused_by_name() -> None:
    spider = S()
    with pytest.raises(Unserializable, match="builtins.object"):
        request_to_data(scrapy.Request("http://127.0.0.1/", meta={"o": object()}), spider)
    with pytest.raises(Unserializable, match="http://127.0.0.1/"):
        request_to_data(scrapy.Request("http://127.0.0.1/", meta={"s": {1, 2}}), spider)
    with pytest.raises(Unserializable):  # a callback that is not a spider method
        request_to_data(scrapy.Request("http://127.0.0.1/", callback=lambda r: None), spider)
    deep: list[object] = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(Unserializable, match="deeper"):
        dumps(deep)


def test_stored_text_is_data_never_code() -> None:
    # a record naming a class or a callable is looked up on the spider, never imported
    # from elsewhere or evaluated
    spider = S()
    data = request_to_data(scrapy.Request("http://127.0.0.1/"), spider)
    data["callback"] = "__import__('os').system('false')"
    with pytest.raises(ValueError):
        request_from_data(loads(dumps(data)), spider)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_tagged_json_round_trips_any_meta(value: object) -> None:
    assert loads(dumps(value)) == value


def test_dupefilter_keys_as_scrapy_by_default_and_canonical_when_asked() -> None:
    from scrapy.utils.test import get_crawler

    from crawlhub.contrib.scrapy import DupeFilter
    from crawlhub.contrib.scrapy.settings import read_settings

    crawler = get_crawler(S, {"CRAWLHUB_URL": "redis://127.0.0.1:6379/0",
                              "CRAWLHUB_KEY": "canonical"})
    df = DupeFilter.from_crawler(crawler)
    df.configure(read_settings(crawler.settings, "s"))
    a = scrapy.Request("http://127.0.0.1/p?b=2&a=1&utm_source=x")
    b = scrapy.Request("http://127.0.0.1/p?a=1&b=2")
    post = scrapy.Request("http://127.0.0.1/p?a=1&b=2", method="POST", body=b"q=1")
    assert df.key(a) == df.key(b) != df.key(post)  # volatile params dropped; POST differs

    crawler = get_crawler(S, {"CRAWLHUB_URL": "redis://127.0.0.1:6379/0"})
    crawler._apply_settings()
    df = DupeFilter.from_crawler(crawler)
    df.configure(read_settings(crawler.settings, "s"))
    fp = crawler.request_fingerprinter.fingerprint(a).hex()
    assert df.key(a) == fp and df.key(a) != df.key(b)  # exactly Scrapy's notion


def test_keys_remembered_under_the_default_fingerprinter_are_scrapys() -> None:
    """A request like one keyed before (method, URL, body, verbatim_url) gets its key from
    the memo; each key is still exactly the default fingerprinter's."""
    import scrapy
    from scrapy.utils.test import get_crawler

    from crawlhub.contrib.scrapy import DupeFilter
    from crawlhub.contrib.scrapy.settings import read_settings

    crawler = get_crawler(S, {"CRAWLHUB_URL": "redis://127.0.0.1:6379/0"})
    crawler._apply_settings()
    df = DupeFilter.from_crawler(crawler)
    df.configure(read_settings(crawler.settings, "s"))
    requests = [
        scrapy.Request("http://127.0.0.1/p?b=2&a=1"),
        scrapy.Request("http://127.0.0.1/p?b=2&a=1", headers={"X": "1"}, meta={"m": 1}),
        scrapy.Request("http://127.0.0.1/p?b=2&a=1", meta={"verbatim_url": True}),
        scrapy.Request("http://127.0.0.1/p?b=2&a=1", method="POST", body=b"q=1"),
        scrapy.Request("http://127.0.0.1/p?b=2&a=1", method="POST", body=b"q=2"),
    ]
    fingerprint = crawler.request_fingerprinter.fingerprint
    for _ in range(2):  # keyed, then remembered
        assert [df.key(r) for r in requests] == [fingerprint(r).hex() for r in requests]
    assert len({df.key(r) for r in requests}) == 4  # headers and meta are not hashed


def test_the_stored_form_is_scrapys_to_dict() -> None:
    """The codec names callbacks from a memo instead of listing the spider's members on
    every request; what it stores stays exactly ``Request.to_dict``."""
    spider = S()
    requests = [
        scrapy.Request("http://127.0.0.1/a"),
        scrapy.Request("http://127.0.0.1/b", callback=spider.parse_item, errback=spider.failed,
                       meta={"m": 1}, priority=3, cb_kwargs={"k": 2}, flags=["x"]),
        scrapy.FormRequest("http://127.0.0.1/c", formdata={"q": "1"}, callback=spider.parse),
    ]
    for request in requests * 2:  # the second time from the memo
        stored = loads(json.dumps(request_to_data(request, spider)))
        assert stored == request.to_dict(spider=spider)
        assert list(stored) == list(request.to_dict(spider=spider))
