"""URL canonicalization equal to w3lib's ``canonicalize_url``, split into parts, and fast.

Plain ASCII http(s) URLs take a fast path proven equal to w3lib by a differential test;
anything unusual (IDNA, IP literals, userinfo, dot segments, odd escapes) goes to w3lib.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote_plus, unquote_to_bytes

from w3lib.url import canonicalize_url

from crawlhub.errors import FrontierError

#: Ports a scheme uses when none is given; the key drops them.
DEFAULT_PORTS: dict[str, str] = {"http": "80", "https": "443", "ws": "80", "wss": "443", "ftp": "21"}

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

# scheme://host[:port][/path][?query][#fragment] with conservative character classes;
# a URL that does not match here is handed to w3lib unchanged.
_FAST_URL = re.compile(
    r"(?P<scheme>[Hh][Tt][Tt][Pp][Ss]?)://"
    r"(?P<host>[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)"
    r"(?::(?P<port>[1-9][0-9]{0,4}))?"
    r"(?P<path>/[A-Za-z0-9\-._~!$&'()*+,=:@/%]*)?"
    r"(?:\?(?P<query>[A-Za-z0-9\-._~!$&()*+,;=:@/?%]*))?"
    r"(?:#.*)?",
    re.DOTALL,
)
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
_HEX = frozenset("0123456789abcdefABCDEF")
_PLAIN_QUERY = re.compile(r"[A-Za-z0-9\-._~=&]*")
# Escapes w3lib keeps encoded in a path (after upper-casing them): % / ; ?
_KEPT_PATH_ESCAPES = frozenset((0x25, 0x2F, 0x3B, 0x3F))
# the authority and the rest of a canonical URL, for the slow path
_CANONICAL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*):(?://(?P<netloc>[^/]*))?(?P<rest>.*)", re.S)


#: One query parameter: (name, value) decoded for matching rules, then its encoded text.
QueryParam = tuple[str, str, str]


@dataclass(slots=True)
class CanonicalURL:
    """w3lib's canonical form of a URL, in parts; ``str()`` rebuilds it exactly."""

    scheme: str
    #: ``[userinfo@]host[:port]`` with the host lower-cased; None when there is no authority.
    netloc: str | None
    path: str
    params: list[QueryParam]
    #: True when the fast path produced it; False when w3lib did.
    fast: bool = True

    @property
    def host(self) -> str:
        host = (self.netloc or "").rpartition("@")[2]
        if host.startswith("["):
            return host[: host.find("]") + 1]
        return host.partition(":")[0]

    @property
    def port(self) -> str | None:
        host = (self.netloc or "").rpartition("@")[2]
        tail = host[host.find("]") + 1 :] if host.startswith("[") else host
        _, sep, port = tail.partition(":")
        return port if sep else None

    def query(self) -> str:
        return "&".join(p[2] for p in self.params)

    def __str__(self) -> str:
        authority = "" if self.netloc is None else f"//{self.netloc}"
        query = f"?{self.query()}" if self.params else ""
        return f"{self.scheme}:{authority}{self.path}{query}"


def canonicalize(url: str) -> CanonicalURL:
    """Split ``url`` into the parts of ``w3lib.url.canonicalize_url(url)`` (fragment dropped)."""
    fast = _fast(url)
    return fast if fast is not None else _slow(url)


def _fast(url: str) -> CanonicalURL | None:
    m = _FAST_URL.fullmatch(url)
    if m is None:
        return None
    host = m.group("host").lower()
    last_label = host.rsplit(".", 1)[-1]
    if _NUMERIC_LABEL.fullmatch(last_label) or "xn--" in host:
        return None  # IPv4 parsing and IDNA belong to w3lib
    port = m.group("port")
    if port is not None:
        if int(port) > 65535:
            return None
        netloc = f"{host}:{port}"
    else:
        netloc = host
    path = m.group("path") or "/"
    if "%" in path:
        decoded = _fast_path_escapes(path)
        if decoded is None:
            return None
        path = decoded
    if "/." in path:
        for segment in path.split("/"):
            if segment == "." or segment == "..":
                return None  # dot segments: let w3lib resolve them
    query = m.group("query")
    params = _fast_query(query) if query else []
    return CanonicalURL(m.group("scheme").lower(), netloc, path, params, True)


def _fast_path_escapes(path: str) -> str | None:
    """Normalise ``%XX`` in a path as w3lib does, or None when w3lib must decide."""
    parts = path.split("%")
    out = [parts[0]]
    for part in parts[1:]:
        if len(part) < 2 or part[0] not in _HEX or part[1] not in _HEX:
            return None
        byte = int(part[:2], 16)
        if byte >= 0x80 or byte in _KEPT_PATH_ESCAPES:
            out.append("%" + part[:2].upper() + part[2:])
        elif chr(byte) in _UNRESERVED:
            out.append(chr(byte) + part[2:])
        else:
            return None
    return "".join(out)


def _fast_query(query: str) -> list[QueryParam]:
    if not _PLAIN_QUERY.fullmatch(query):
        return _decoded_query(query)
    simple: list[tuple[str, str]] = []
    for field in query.split("&"):
        if field:
            key, _, value = field.partition("=")
            if "=" in value:
                return _decoded_query(query)
            simple.append((key, value))
    # ASCII-only names and values: str order is w3lib's byte order
    simple.sort()
    return [(k, v, f"{k}={v}") for k, v in simple]


def _decoded_query(query: str) -> list[QueryParam]:
    pairs: list[tuple[bytes, bytes]] = []
    for field in query.split("&"):
        if field:
            key, _, value = field.partition("=")
            pairs.append(
                (unquote_to_bytes(key.replace("+", " ")), unquote_to_bytes(value.replace("+", " ")))
            )
    pairs.sort()
    return [
        (
            kb.decode("utf-8", "replace"),
            vb.decode("utf-8", "replace"),
            f"{quote_plus(kb, safe='')}={quote_plus(vb, safe='')}",
        )
        for kb, vb in pairs
    ]


def _slow(url: str) -> CanonicalURL:
    try:
        text = canonicalize_url(url)
    except (ValueError, UnicodeError) as exc:
        raise FrontierError(f"URL {url!r} is not valid ({exc}): fix or drop this seed") from None
    m = _CANONICAL.fullmatch(text)
    if m is None:  # pragma: no cover - w3lib always returns scheme:...
        return CanonicalURL("", None, text, [], False)
    # w3lib encodes '?' inside a path and inside query values, so the query (if any)
    # is whatever follows the first '?'.
    path, sep, query = m.group("rest").partition("?")
    params: list[QueryParam] = []
    for field in query.split("&") if sep else ():
        if not field:
            continue
        key, _, value = field.partition("=")
        params.append((_decode(key), _decode(value), field))
    return CanonicalURL(m.group("scheme"), m.group("netloc"), path, params, False)


def _decode(text: str) -> str:
    return unquote_to_bytes(text.replace("+", " ")).decode("utf-8", "replace")
