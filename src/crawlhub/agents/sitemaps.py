"""Sitemaps: the page URLs (and their ``<lastmod>``) a site lists for crawlers, read as a
stream so a 1,000,000-URL sitemap index costs no more memory than one batch of URLs.

Sources, as Scrapy's ``SitemapSpider`` and Crawlee read them: a start URL that is a
sitemap itself (its path ends in ``.xml``, ``.xml.gz`` or ``.txt``, or names "sitemap"),
else the ``Sitemap:`` lines of its site's robots.txt, else the site's ``/sitemap.xml``.
A sitemap is an XML ``<urlset>``, a ``<sitemapindex>`` naming more sitemaps (followed,
each once, up to ``max_sitemaps``), or plain text (one URL a line); gzip-compressed ones
(``.xml.gz``: the body starts with gzip's magic bytes) are inflated as they arrive.

Streaming: the body is read in 64 KiB chunks, inflated in slices of at most 1 MiB (a gzip
bomb stops at ``max_bytes`` of XML, the protocol's limit being 50 MB) and fed to lxml's
pull parser; each ``<url>`` element is cleared, and its finished siblings dropped, once
read, so the tree never holds more than one entry. Entities are not resolved and no DTD
or network is loaded (a sitemap is untrusted input). URLs come out in batches of
``batch`` for the caller to submit before more are read.

``lastmod`` becomes epoch seconds (UTC) on each :class:`SitemapURL`; the crawl puts it
on the seeded task as ``lastmod`` so a recrawl can skip a page unchanged since its last
fetch (:func:`unchanged_since`).
"""

from __future__ import annotations

import logging
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from lxml import etree

from crawlhub.agents.politeness.robots import origin_of

log = logging.getLogger("crawlhub.agents.sitemaps")

#: Bytes of (inflated) sitemap read at most: the protocol allows 50 MB.
MAX_BYTES = 64 * 1024 * 1024
#: Sitemaps read at most from one crawl's sources (an index names up to 50,000).
MAX_SITEMAPS = 10_000
#: URLs handed to the caller at once.
BATCH = 1000
_CHUNK = 64 * 1024
_INFLATE_SLICE = 1024 * 1024
#: The elements whose events the parser reports, in any namespace (or none): the others
#: (``loc``, ``lastmod``, extensions) are read from their entry when it ends.
_TAGS = ("{*}url", "{*}sitemap")


@dataclass(slots=True)
class SitemapURL:
    """One ``<url>`` of a sitemap (or ``<sitemap>`` of an index): its ``<loc>`` and its
    ``<lastmod>`` as epoch seconds UTC (None when absent or not a W3C datetime)."""

    url: str
    lastmod: int | None = None


@dataclass
class SitemapReport:
    """What reading the sitemaps came to: sitemaps read, page URLs found, URLs left out
    (another site's, or refused by the include / exclude patterns) and the sitemaps that
    could not be read, with why."""

    sitemaps: int = 0
    urls: int = 0
    left_out: int = 0
    failures: dict[str, str] = field(default_factory=dict)


def parse_lastmod(text: str | None) -> int | None:
    """A W3C datetime (``2024-05-01``, ``2024-05-01T10:00:00+02:00``, ``...Z``) as epoch
    seconds UTC; None for anything else. A date alone is midnight UTC."""
    if not text:
        return None
    text = text.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp())


def unchanged_since(task: dict[str, Any], fetched_at: float | None) -> bool:
    """Whether a page whose task carries a sitemap ``lastmod`` is known unchanged since it
    was last fetched at ``fetched_at`` (epoch seconds): the recrawl decision may then skip
    it. False when either is unknown."""
    lastmod = task.get("lastmod")
    return isinstance(lastmod, int) and fetched_at is not None and lastmod <= fetched_at


def looks_like_sitemap(url: str) -> bool:
    """Whether a start URL names a sitemap rather than a page."""
    path = urlsplit(url).path.lower()
    name = path.rsplit("/", 1)[-1]
    return (path.endswith((".xml", ".xml.gz", ".txt")) and name != "robots.txt") or \
        "sitemap" in name


class SitemapParser:
    """One sitemap's bytes in (``feed``, as they arrive, gzip or not), its entries out:
    ``feed`` returns the page URLs and the child sitemaps completed by that chunk.
    ``kind`` is ``urlset``, ``sitemapindex`` or ``text`` once known. Raises ``ValueError``
    for a body that is not a sitemap or larger than ``max_bytes`` inflated."""

    def __init__(self, *, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.kind = ""
        self.size = 0
        self._inflate: Any = None
        self._started = False
        self._xml: Any = None
        self._text_tail = b""
        self.kind_known = False

    def feed(self, data: bytes) -> tuple[list[SitemapURL], list[SitemapURL]]:
        if not self._started:
            if not data:
                return [], []
            self._started = True
            if data[:2] == b"\x1f\x8b":  # gzip's magic: a .xml.gz (not Content-Encoding)
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pages: list[SitemapURL] = []
        children: list[SitemapURL] = []
        if self._inflate is None:
            self._plain(data, pages, children)
            return pages, children
        try:
            while data:
                out = self._inflate.decompress(data, _INFLATE_SLICE)
                data = self._inflate.unconsumed_tail
                self._plain(out, pages, children)
        except zlib.error as exc:
            raise ValueError(f"not valid gzip ({exc})") from None
        return pages, children

    def close(self) -> tuple[list[SitemapURL], list[SitemapURL]]:
        pages: list[SitemapURL] = []
        children: list[SitemapURL] = []
        if self._inflate is not None and not self._inflate.eof:
            raise ValueError("not valid gzip (it ends before its end)")
        if self.kind == "text":
            self._text(b"\n", pages)
        elif self._xml is not None:
            try:
                root = self._xml.close()
            except etree.XMLSyntaxError as exc:
                raise ValueError(f"not well-formed XML ({exc})") from None
            self._events(pages, children)
            if not self.kind_known:  # no entry: the root still says whether it is one
                self.kind = root.tag.rpartition("}")[2] if isinstance(root.tag, str) else ""
                if self.kind not in ("urlset", "sitemapindex"):
                    raise ValueError(f"not a sitemap: its root is <{self.kind}>, not"
                                     " <urlset> or <sitemapindex>")
        elif not self.size:
            raise ValueError("empty")
        return pages, children

    def _plain(self, data: bytes, pages: list[SitemapURL], children: list[SitemapURL]) -> None:
        if not data:
            return
        self.size += len(data)
        if self.size > self.max_bytes:
            raise ValueError(f"larger than {self.max_bytes:,} bytes")
        if not self.kind:
            head = data.lstrip()
            if not head:
                return
            if head.startswith(b"\xef\xbb\xbf"):
                head = head[3:]
            if head[:1] == b"<":
                self.kind = "xml"
                self._xml = etree.XMLPullParser(
                    events=("end",), tag=_TAGS, resolve_entities=False, no_network=True,
                    load_dtd=False, huge_tree=False, remove_comments=True, remove_pis=True)
            else:
                self.kind = "text"
        if self.kind == "text":
            self._text(data, pages)
            return
        try:
            self._xml.feed(data)
        except etree.XMLSyntaxError as exc:
            raise ValueError(f"not well-formed XML ({exc})") from None
        self._events(pages, children)

    def _text(self, data: bytes, pages: list[SitemapURL]) -> None:
        lines = (self._text_tail + data).split(b"\n")
        self._text_tail = lines.pop()
        for line in lines:
            url = line.strip().decode("utf-8", errors="replace")
            if url.startswith(("http://", "https://")):
                pages.append(SitemapURL(url))

    def _events(self, pages: list[SitemapURL], children: list[SitemapURL]) -> None:
        for _, elem in self._xml.read_events():
            if not self.kind_known:
                root = elem.getparent()
                self.kind = root.tag.rpartition("}")[2] if root is not None else ""
                if self.kind not in ("urlset", "sitemapindex"):
                    raise ValueError(f"not a sitemap: its root is <{self.kind}>, not <urlset>"
                                     " or <sitemapindex>")
                self.kind_known = True
            loc = elem.findtext("{*}loc")
            if loc:
                loc = loc.strip()
                entry = SitemapURL(loc, parse_lastmod(elem.findtext("{*}lastmod")))
                (pages if self.kind == "urlset" else children).append(entry)
            # the entry is read: drop it and the finished ones before it (bounded tree)
            elem.clear()
            while elem.getprevious() is not None:
                del elem.getparent()[0]


Fetch = Callable[[str], AsyncIterator[bytes]]


def http_chunks(user_agent: str, *, timeout: float = 30.0) -> Fetch:
    """A fetch of a sitemap's body in chunks over aiohttp (``user_agent`` sent); a status
    other than 2xx is a ``ValueError`` naming it."""

    async def fetch(url: str) -> AsyncIterator[bytes]:
        from crawlhub.fetch.http import client_timeout, new_session, unreachable_reason

        async with new_session(timeout=client_timeout(None, timeout),
                               headers={"User-Agent": user_agent}) as session:
            try:
                async with session.get(url, max_redirects=5) as response:
                    if not 200 <= response.status < 300:
                        raise ValueError(f"answered {response.status}")
                    async for chunk in response.content.iter_chunked(_CHUNK):
                        yield chunk
            except ValueError:
                raise
            except Exception as exc:
                raise ValueError(f"unreachable: {unreachable_reason(exc)}") from None

    return fetch


async def robots_sitemaps(origin: str, user_agent: str, *, timeout: float = 10.0) -> list[str]:
    """The ``Sitemap:`` lines of ``origin``'s robots.txt (none when it cannot be had)."""
    from protego import Protego

    from crawlhub.agents.politeness.robots import http_fetcher

    try:
        status, body = await http_fetcher(user_agent, timeout=timeout)(
            f"{origin}/robots.txt", 512 * 1024)
    except Exception as exc:  # no robots.txt is no Sitemap: line, not an error
        log.debug("robots.txt of %s: %s", origin, exc)
        return []
    if not 200 <= status < 300:
        return []
    return list(Protego.parse(body.decode("utf-8", errors="replace")).sitemaps)


async def sources(starts: Iterable[str], user_agent: str) -> list[str]:
    """The sitemaps to read for ``starts``: those given, then per other start URL's site
    its robots.txt's ``Sitemap:`` lines, else its ``/sitemap.xml``."""
    found: dict[str, None] = {}
    origins: dict[str, None] = {}
    for url in starts:
        if looks_like_sitemap(url):
            found[url] = None
        else:
            origins[origin_of(url)] = None
    for origin in origins:
        listed = await robots_sitemaps(origin, user_agent)
        for url in listed or [f"{origin}/sitemap.xml"]:
            found[url] = None
    return list(found)


async def read_sitemaps(
    sitemaps: Iterable[str],
    *,
    fetch: Fetch,
    sites: Iterable[str] = (),
    admit: Callable[[str], bool] | None = None,
    report: SitemapReport | None = None,
    max_sitemaps: int = MAX_SITEMAPS,
    max_bytes: int = MAX_BYTES,
    batch: int = BATCH,
) -> AsyncIterator[list[SitemapURL]]:
    """The page URLs of ``sitemaps`` and of the sitemaps their indexes name, in batches.

    A URL is kept when its site (origin) is the sitemap's own or one of ``sites``, and
    ``admit`` (the crawl's include / exclude patterns) takes it; the others are counted
    in ``report.left_out``. A sitemap that cannot be read is named in ``report.failures``
    (the URLs it gave before the failure are kept). Memory: one batch of URLs, one
    sitemap's parser state and the set of sitemap URLs seen (at most ``max_sitemaps``).
    """
    report = report if report is not None else SitemapReport()
    allowed = {origin_of(s) for s in sites}
    todo: deque[str] = deque()
    seen: set[str] = set()
    for url in sitemaps:
        if url not in seen:
            seen.add(url)
            todo.append(url)
    out: list[SitemapURL] = []  # the batch being filled (cleared, never rebound)

    def take(pages: list[SitemapURL], children: list[SitemapURL], own: str) -> None:
        for child in children:
            if child.url in seen:
                continue
            if len(seen) >= max_sitemaps:
                report.failures.setdefault(
                    child.url, f"not read: more than {max_sitemaps:,} sitemaps")
                continue
            seen.add(child.url)
            todo.append(child.url)
        # a URL on the sitemap's site, or a start URL's: a prefix test (urlsplit costs
        # ~10x more), then the exact origin for what differs only in case or port
        prefixes = tuple(f"{o}/" for o in (own, *allowed))
        for page in pages:
            url = page.url
            if not url.startswith(prefixes):
                try:
                    site = origin_of(url)
                except ValueError:
                    site = ""
                if site != own and site not in allowed:
                    report.left_out += 1
                    continue
            if admit is not None and not admit(url):
                report.left_out += 1
                continue
            out.append(page)

    def batch_out() -> list[SitemapURL]:
        report.urls += len(out)
        done = list(out)
        out.clear()
        return done

    while todo:
        url = todo.popleft()
        report.sitemaps += 1
        try:
            own = origin_of(url)
        except ValueError:
            report.failures[url] = "not an http(s) URL"
            continue
        parser = SitemapParser(max_bytes=max_bytes)
        try:
            async for chunk in fetch(url):
                take(*parser.feed(chunk), own)
                if len(out) >= batch:
                    yield batch_out()
            take(*parser.close(), own)
        except ValueError as exc:
            report.failures[url] = str(exc)
            log.warning("sitemap %s: %s", url, exc)
        if len(out) >= batch or (out and not todo):
            yield batch_out()
    if out:
        yield batch_out()


__all__ = [
    "SitemapParser",
    "SitemapReport",
    "SitemapURL",
    "http_chunks",
    "looks_like_sitemap",
    "parse_lastmod",
    "read_sitemaps",
    "robots_sitemaps",
    "sources",
    "unchanged_since",
]
