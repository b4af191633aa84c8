"""The key resolver: w3lib's canonical URL plus port, parameter and domain rules."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from w3lib.url import canonicalize_url

from crawlhub.core.errors import ConfigError, FrontierError
from crawlhub.frontier import KeyResolver, Seed
from crawlhub.frontier.canonical import canonicalize
from crawlhub.frontier.config import KeyConfig
from crawlhub.frontier.urlkeys import is_timestamp_like


def key(url: str, **config: object) -> str:
    return KeyResolver(KeyConfig.model_validate(config)).key(url)


# ------------------------------------------------------------------ equal to w3lib
TRICKY = [
    "http://a.com",
    "http://a.com?b=2&a=1",
    "HTTP://A.COM:8080/a b?x=1 2&a&b=&&c=%2f#f",
    "http://a.com/a%3Fb?c=1",
    "http://a.com/a%2e%2E/b",
    "http://a.com/./a/../b/",
    "http://a.com/%7e%41%e4%b8%ad",
    "http://a.com/?a=%zz&b=%4",
    "http://a.com/x?",
    "http://a.com/x?&",
    "http://a.com/x?=",
    "http://a.com:0080/",
    "http://A.COM.:80/",
    "http://xn--bcher-kva.example/",
    "http://bücher.example/straße?q=ä",
    "http://[::0:1]:80/a",
    "http://127.0.0.1/",
    "http://127.0.0.1:8600/p/1?b=2&a=1",
    "http://10.0.0.255/",
    "http://0127.0.0.1/",
    "http://127.1/",
    "http://256.1.1.1/",
    "http://1.2.3.4.5/",
    "http://01.2.3.4/",
    "http://1.2.3.4./",
    "http://0x7f.1/",
    "http://user:Pass@Host.com/",
    "http://a.com/p;x=1?z",
    "http://a.com/?q=a+b&r=a%20b&s=%2B",
    "http://a.com/?a=b=c&a==",
    "http://a.com/?q='x'&r=\"y\"",
    "http://a.com/a|b[c]{d}^e`",
    "  http://a.com/\t\n",
    "mailto:someone@example.com",
    "file:///tmp/x",
    "ftp://a.com:21/x",
]


@pytest.mark.parametrize("url", TRICKY)
def test_canonical_url_equals_w3lib_on_tricky_urls(url: str) -> None:
    assert str(canonicalize(url)) == canonicalize_url(url)


_FAST_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@/?%#"
_parts = st.text(alphabet=_FAST_CHARS, max_size=25)
_escapes = st.sampled_from(["%41", "%7e", "%2F", "%2f", "%25", "%3F", "%e4%b8%ad", "%zz", "%20",
                            "%2B", "%2e", "%3D", "%26", "+", "=", "&"])
_piece = st.lists(st.one_of(_parts, _escapes), max_size=6).map("".join)


@settings(max_examples=1000, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "Https"]),
    host=st.sampled_from(["a.com", "Shop.Example.COM", "x-y.b_c.org", "localhost", "a1.b2",
                          "127.0.0.1", "192.168.0.10", "255.255.255.255", "1.2.3.04",
                          "300.1.1.1", "1.2.3"]),
    port=st.sampled_from(["", ":80", ":443", ":8080", ":65535", ":65536", ":0", ":007"]),
    path=_piece,
    query=st.one_of(st.just(""), _piece.map(lambda q: "?" + q)),
    fragment=st.one_of(st.just(""), _parts.map(lambda f: "#" + f)),
)
def test_canonical_url_equals_w3lib_on_generated_urls(
    scheme: str, host: str, port: str, path: str, query: str, fragment: str
) -> None:
    url = f"{scheme}://{host}{port}/{path}{query}{fragment}"
    try:
        expected = canonicalize_url(url)
    except ValueError:
        with pytest.raises(FrontierError, match="is not valid"):
            canonicalize(url)
    else:
        assert str(canonicalize(url)) == expected


_field = st.tuples(
    st.sampled_from(["id", "page", "page2", "a", "a-b", "q+x", "utm_source", "_", "callback",
                     "ref", "Ref", "t", ""]),
    st.sampled_from(["", "=", "=2", "=x+y", "=1700000000", "=1700000000123", "=9999999999",
                     "=a=b"]),
).map("".join)
_query = st.one_of(
    st.lists(_field, max_size=6), st.lists(st.one_of(_field, _piece), max_size=6)
).map("&".join)
_path = st.lists(
    st.sampled_from(["a", "B", "item", "7.html", "-", "~x", "%41", "%e4%b8%ad", "/", "%2f"]),
    max_size=5,
).map("".join)
_RULES = [
    {},
    {"drop_params": ["ref"], "drop_timestamp_values": False},
    {"keep_params": ["t"]},
    {"domains": {"a.com": {"case_sensitive_path": False, "drop_params": ["page*"]},
                 "example.com": {"only_params": ["id"]}}},
]


@settings(max_examples=1000, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP"]),
    host=st.sampled_from(["a.com", "www.A.com", "Shop.Example.COM", "1.2.3.4", "xn--bcher-kva.x"]),
    port=st.sampled_from(["", ":80", ":443", ":8080", ":65536"]),
    path=st.one_of(_path, _piece),
    query=st.one_of(st.just(""), _query.map(lambda q: "?" + q)),
    rules=st.sampled_from(_RULES),
)
def test_the_fast_key_path_equals_the_general_one(
    scheme: str, host: str, port: str, path: str, query: str, rules: dict[str, object]
) -> None:
    resolver = KeyResolver(KeyConfig.model_validate(rules))
    url = f"{scheme}://{host}{port}/{path}{query}"
    fast = resolver._fast_key(url)
    if fast is not None:  # (explain always takes the general path)
        assert fast == resolver.explain(url).key


def test_an_invalid_url_is_a_frontier_error_naming_it() -> None:
    with pytest.raises(FrontierError, match="http://a.com:99999/"):
        KeyResolver().key("http://a.com:99999/")


def test_plain_urls_take_the_fast_path() -> None:
    assert canonicalize("https://www.example.com/a/b.html?id=3&p=2#x").fast
    assert not canonicalize("http://bücher.example/").fast


# ------------------------------------------------------------------ the key rules
def test_default_port_fragment_and_query_order_do_not_matter() -> None:
    assert key("HTTPS://Example.com:443/a?b=2&a=1#top") == "https://example.com/a?a=1&b=2"
    assert key("http://example.com:80/") == "http://example.com/"


def test_a_non_default_port_stays() -> None:
    assert key("http://example.com:8080/") == "http://example.com:8080/"
    assert key("https://example.com:80/") == "https://example.com:80/"


def test_default_port_is_dropped_on_the_w3lib_path_too() -> None:
    assert key("http://bücher.example:80/x") == "http://xn--bcher-kva.example/x"


@pytest.mark.parametrize(
    "param",
    ["callback=jQuery1234_5678", "_=1700000000000", "utm_source=news", "UTM_Medium=x",
     "jsonp=cb", "gclid=abc", "fbclid=abc"],
)
def test_volatile_params_are_dropped_by_default(param: str) -> None:
    assert key(f"http://a.com/list?page=2&{param}") == "http://a.com/list?page=2"


def test_timestamp_like_values_are_dropped() -> None:
    assert key("http://a.com/x?t=1700000000&id=9") == "http://a.com/x?id=9"
    assert key("http://a.com/x?ts=1700000000123&id=9") == "http://a.com/x?id=9"


@pytest.mark.parametrize("value", ["123456789", "9999999999", "0123456789", "17000000001",
                                   "1700000000x", "3000000000000"])
def test_other_numbers_are_not_timestamps(value: str) -> None:
    assert not is_timestamp_like(value)
    assert key(f"http://a.com/x?id={value}") == f"http://a.com/x?id={value}"


def test_timestamp_dropping_can_be_turned_off() -> None:
    assert key("http://a.com/x?t=1700000000", drop_timestamp_values=False) == (
        "http://a.com/x?t=1700000000"
    )


def test_drop_params_add_to_the_volatile_ones() -> None:
    assert key("http://a.com/?sid=1&q=a&utm_x=1", drop_params=["sid"]) == "http://a.com/?q=a"


def test_volatile_params_can_be_replaced() -> None:
    assert key("http://a.com/?_=1&cb=2", volatile_params=["cb"]) == "http://a.com/?_=1"


def test_keep_params_win_over_every_drop_rule() -> None:
    url = "http://a.com/?callback=x&t=1700000000"
    assert key(url, keep_params=["callback", "t"]) == url


def test_domain_rules_apply_to_the_domain_and_its_subdomains() -> None:
    config = {"domains": {"example.com": {"drop_params": ["ref"]}}}
    assert key("http://www.example.com/?ref=a&q=1", **config) == "http://www.example.com/?q=1"
    assert key("http://example.com/?ref=a", **config) == "http://example.com/"
    assert key("http://notexample.com/?ref=a", **config) == "http://notexample.com/?ref=a"


def test_the_most_specific_domain_rule_wins() -> None:
    config = {"domains": {"example.com": {"drop_params": ["ref"]},
                          "shop.example.com": {"keep_params": ["ref"]}}}
    assert key("http://shop.example.com/?ref=a", **config) == "http://shop.example.com/?ref=a"


def test_only_params_keeps_just_those() -> None:
    config = {"domains": {"a.com": {"only_params": ["id", "page*"]}}}
    assert key("http://a.com/item?id=1&session=x&page_no=2&z=0", **config) == (
        "http://a.com/item?id=1&page_no=2"
    )


def test_case_insensitive_paths_are_lower_cased_per_domain() -> None:
    config = {"domains": {"a.com": {"case_sensitive_path": False}}}
    assert key("http://a.com/Item/ABC?Q=X", **config) == "http://a.com/item/abc?Q=X"
    assert key("http://b.com/Item", **config) == "http://b.com/Item"


def test_method_and_body_enter_the_key_when_asked() -> None:
    resolver = KeyResolver(KeyConfig(include_method=True, include_body=True))
    get = resolver.key(Seed("http://a.com/s"))
    post_a = resolver.key(Seed("http://a.com/s", method="post", body="q=a"))
    post_b = resolver.key(Seed("http://a.com/s", method="POST", body=b"q=b"))
    assert get == "GET http://a.com/s"
    assert post_a.startswith("POST http://a.com/s body:")
    assert len({get, post_a, post_b}) == 3


def test_method_and_body_are_ignored_by_default() -> None:
    resolver = KeyResolver()
    assert resolver.key(Seed("http://a.com/s", method="POST", body="q")) == "http://a.com/s"


def path_only(seed: Seed) -> str:
    """A user key function for the tests: the path, nothing else."""
    return seed.url.split("/", 3)[3]


def test_a_user_function_replaces_the_rules() -> None:
    resolver = KeyResolver(KeyConfig(function="tests.frontier.test_keys:path_only"))
    assert resolver.key("http://a.com/x/y?z=1") == "x/y?z=1"
    assert "user function" in resolver.explain("http://a.com/x").steps[0]


def test_a_bad_function_path_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot import module"):
        KeyResolver(KeyConfig(function="no.such.module:f"))
    with pytest.raises(ConfigError, match="has no"):
        KeyResolver(KeyConfig(function="tests.frontier.test_keys:nothing"))


def test_a_user_function_returning_nothing_is_an_error() -> None:
    resolver = KeyResolver(KeyConfig(function="tests.frontier.test_keys:returns_none"))
    with pytest.raises(FrontierError, match="must return a non-empty string"):
        resolver.key("http://a.com/")


def returns_none(seed: Seed) -> None:
    return None


def test_explain_says_why_for_every_change() -> None:
    config = KeyConfig.model_validate(
        {"domains": {"example.com": {"case_sensitive_path": False, "drop_params": ["ref"]}}}
    )
    explanation = KeyResolver(config).explain(
        "HTTPS://www.Example.com:443/A?z=1&ref=x&utm_source=q&t=1700000000#frag"
    )
    assert explanation.key == "https://www.example.com/a?z=1"
    text = "\n".join(explanation.steps)
    for reason in ("fast path", "scheme and host lower-cased", "fragment #frag dropped",
                   "query parameters sorted", "default port :443", "path lower-cased",
                   "'ref' dropped (domains.example.com.drop_params 'ref')",
                   "'t' dropped (timestamp-like value", "'utm_source' dropped (volatile_params"):
        assert reason in text


def test_explain_gives_the_same_key_as_key() -> None:
    resolver = KeyResolver()
    for url in TRICKY:
        assert resolver.explain(url).key == resolver.key(url)
