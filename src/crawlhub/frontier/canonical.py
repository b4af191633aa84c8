"""URL canonicalization equal to w3lib's ``canonicalize_url``, split into parts, and fast.

Plain ASCII http(s) URLs take a fast path proven equal to w3lib by a differential test;
anything unusual (IDNA, IP literals, userinfo, dot segments, odd escapes) goes to w3lib.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote_plus, unquote_to_bytes

from w3lib.url import canonicalize_url

from crawlhub.core.errors import FrontierError

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
_HEX = frozenset("0123456789abcdefABCDEF")
_NOT_UPPER_HIGH_ESCAPE = re.compile(r"%(?![89A-F][0-9A-F])")
# fields of unreserved characters and '+', each with at most one '='
#: A dotted-quad IPv4 address in its canonical form (no leading zeros, each part 0-255),
#: which w3lib keeps as it is; other numeric hosts (``127.1``, ``0x7f.1``) are its to parse.
_PLAIN_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
                         r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)")
_PLAIN_QUERY = re.compile(r"(?:[A-Za-z0-9\-._~+]*(?:=[A-Za-z0-9\-._~+]*)?(?:&|\Z))*")
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
    #: lower-cased host ("" when the URL has none, like ``mailto:``)
    host: str
    port: str | None
    path: str
    params: list[QueryParam]
    #: True when the fast path produced it; False when w3lib did.
    fast: bool = True
    #: ``user:password@`` as w3lib writes it, or ""
    userinfo: str = ""
    #: False for URLs without an authority (``mailto:a@b``)
    authority: bool = True

    def netloc(self, port: str | None = None) -> str:
        """``userinfo host :port``; ``port`` replaces the URL's own when given."""
        port = self.port if port is None else port
        return f"{self.userinfo}{self.host}:{port}" if port else f"{self.userinfo}{self.host}"

    def query(self) -> str:
        return "&".join(p[2] for p in self.params)

    def __str__(self) -> str:
        authority = f"//{self.netloc()}" if self.authority else ""
        query = f"?{self.query()}" if self.params else ""
        return f"{self.scheme}:{authority}{self.path}{query}"


def canonicalize(url: str) -> CanonicalURL:
    """Split ``url`` into the parts of ``w3lib.url.canonicalize_url(url)`` (fragment dropped)."""
    fast = _fast(url)
    return fast if fast is not None else _slow(url)


def _fast(url: str) -> CanonicalURL | None:
    parts = fast_split(url)
    if parts is None:
        return None
    scheme, host, port, path, query = parts
    authority = fast_authority(scheme, host, port)
    if authority is None:
        return None
    scheme, host = authority
    return CanonicalURL(scheme, host, port, path, _fast_query(query) if query else [])


def fast_split(url: str) -> tuple[str, str, str | None, str, str | None] | None:
    """The raw scheme, host, port and query of a plain http(s) URL and its canonical path,
    or None when the URL is not for the fast path (``fast_authority`` checks the rest)."""
    m = _FAST_URL.fullmatch(url)
    if m is None:
        return None
    scheme, host, port, path, query = m.group(1, 2, 3, 4, 5)
    if not path:
        path = "/"
    elif "%" in path:
        path = _fast_path_escapes(path)  # type: ignore[assignment]
        if path is None:
            return None
    if "/." in path:
        for segment in path.split("/"):
            if segment == "." or segment == "..":
                return None  # dot segments: let w3lib resolve them
    return scheme, host, port, path, query


def fast_authority(scheme: str, host: str, port: str | None) -> tuple[str, str] | None:
    """The canonical scheme and host of a ``fast_split`` URL, or None when w3lib must
    decide (IP addresses, IDNA, a port out of range)."""
    host = host.lower()
    last = host[host.rfind(".") + 1 :]
    if (last.isdigit() and _PLAIN_IPV4.fullmatch(host) is None) or last.startswith("0x") \
            or "xn--" in host:
        return None  # IPv4 parsing and IDNA belong to w3lib
    if port is not None and int(port) > 65535:
        return None
    return scheme.lower(), host


def is_plain_query(query: str) -> bool:
    """True for a query of unreserved characters and '+' only (no escapes to decode)."""
    return _PLAIN_QUERY.fullmatch(query) is not None


def _fast_path_escapes(path: str) -> str | None:
    """Normalise ``%XX`` in a path as w3lib does, or None when w3lib must decide."""
    if _NOT_UPPER_HIGH_ESCAPE.search(path) is None:
        return path  # only upper-case escapes of non-ASCII bytes (UTF-8 text): kept as is
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
    # ASCII names and values: str order is w3lib's byte order, '+' included (it decodes
    # to ' ' and both sort below every other character allowed here)
    fields = sorted([f.partition("=") for f in query.split("&") if f])
    if "+" in query:
        return [(k.replace("+", " "), v.replace("+", " "), f"{k}={v}") for k, _, v in fields]
    return [(k, v, f"{k}={v}") for k, _, v in fields]


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
        return CanonicalURL("", "", None, text, [], False, "", False)
    # w3lib encodes '?' inside a path and inside query values, so the query (if any)
    # is whatever follows the first '?'.
    path, sep, query = m.group("rest").partition("?")
    params: list[QueryParam] = []
    for field in query.split("&") if sep else ():
        if not field:
            continue
        key, _, value = field.partition("=")
        params.append((_decode(key), _decode(value), field))
    netloc = m.group("netloc")
    if netloc is None:
        return CanonicalURL(m.group("scheme"), "", None, path, params, False, "", False)
    userinfo, at, hostport = netloc.rpartition("@")
    end = hostport.find("]") + 1 if hostport.startswith("[") else 0  # an IPv6 literal
    tail, sep, port = hostport[end:].partition(":")
    host = hostport[:end] + tail
    return CanonicalURL(
        m.group("scheme"), host, port if sep else None, path, params, False, userinfo + at
    )


def _decode(text: str) -> str:
    return unquote_to_bytes(text.replace("+", " ")).decode("utf-8", "replace")
