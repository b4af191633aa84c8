"""The fetching side of a conditional recrawl, over one frontier: before a batch of URLs
is fetched their validators are read (one store read); each answer is settled (a 304, or
a 200 whose body hashes as before, is *unchanged*: not extracted again, no item); the
new validators of a flush's pages are written after its items (one store write), so a
page whose item a kill lost is never taken for unchanged.

Callers: ``crawlhub.agents.agent.Agent`` (its ``revalidate``) in ``crawlhub crawl
--recrawl``. Keys are the frontier's canonical keys, so ``?utm_source=x`` and the bare
URL share their validators as they share their dedup.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from crawlhub.core.errors import FrontierError
from crawlhub.frontier.manager import Frontier
from crawlhub.frontier.seed import Seed
from crawlhub.frontier.validators import Validators, clean_etag, clean_http_date, validators_of


class Revalidation:
    """Conditional requests and change detection for the URLs of one frontier.

    ``skip_unchanged`` (default): a 200 whose body hashes as the last one is unchanged
    too (not extracted, no item); False: only a 304 is, and every body fetched is
    extracted and emitted again.
    """

    def __init__(self, frontier: Frontier, *, skip_unchanged: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.frontier = frontier
        self.skip_unchanged = skip_unchanged
        self.clock = clock
        #: url -> (key, validators kept, or None) for URLs prepared and not yet settled
        self._known: dict[str, tuple[str, Validators | None]] = {}
        #: answers settled: 304s, unchanged 200s, changed or new 200s
        self.not_modified = 0
        self.same = 0
        self.changed = 0
        #: URLs not fetched at all: a sitemap's ``lastmod`` says unchanged since kept
        self.unfetched = 0

    def _key(self, url: str) -> str | None:
        try:
            return self.frontier.keys.key(Seed(url))
        except (FrontierError, ValueError):
            return None  # not a URL the frontier keys: fetched plainly

    async def prepare(self, urls: Sequence[str], keys: Sequence[str] | None = None) -> None:
        """Read the validators of ``urls`` (one store read) for :meth:`headers`;
        ``keys``: their frontier keys when the caller has them already."""
        if keys is None:
            keyed = {u: k for u in urls if u not in self._known and (k := self._key(u))}
        else:
            keyed = {u: k for u, k in zip(urls, keys, strict=True) if u not in self._known}
        if not keyed:
            return
        found = await self.frontier.store.validators(list(set(keyed.values())))
        for url, key in keyed.items():
            self._known[url] = (key, found.get(key))

    def headers(self, url: str) -> dict[str, str]:
        """The conditional headers for ``url`` (none if nothing is kept of it)."""
        known = self._known.get(url)
        return {} if known is None or known[1] is None else known[1].headers()

    def fetched_at(self, url: str) -> float | None:
        """When ``url``'s kept answer came (epoch seconds; None: nothing kept of it)."""
        known = self._known.get(url)
        return None if known is None or known[1] is None else known[1].seen

    def skip(self, url: str) -> None:
        """``url`` is not fetched: known unchanged without asking (a sitemap's
        ``lastmod`` not after :meth:`fetched_at`); its validators stay as kept."""
        if self._known.pop(url, None) is not None:
            self.unfetched += 1

    def settle(self, url: str, status: int, headers: Mapping[str, str], body: bytes
               ) -> tuple[bool, tuple[str, Validators] | None]:
        """Judge ``url``'s answer: whether the page is unchanged since the last one, and
        what to :meth:`remember` of it once its page is flushed (None: nothing) - never
        before, or a kill in between would make the page look done when it was not."""
        key, old = self._known.pop(url, (None, None))
        if key is None:
            return False, None
        now = self.clock()
        if status == 304 and old is not None:
            # a 304 may carry fresher validators; the body (and its hash) is the old one
            self.not_modified += 1
            return True, (key, Validators(clean_etag(headers.get("ETag")) or old.etag,
                                          clean_http_date(headers.get("Last-Modified"))
                                          or old.last_modified, old.hash, now))
        if not 200 <= status < 300:
            return False, None
        new = validators_of(headers, body, now)
        if old is not None and old.hash == new.hash and self.skip_unchanged:
            self.same += 1
            return True, (key, new)
        self.changed += 1
        return False, (key, new)

    def forget(self, url: str) -> None:
        """Drop what :meth:`prepare` read for ``url`` (not fetched after all)."""
        self._known.pop(url, None)

    async def remember(self, settled: Sequence[tuple[str, Validators] | None]) -> None:
        """Write what :meth:`settle` gave for pages now flushed (one store write)."""
        items = [x for x in settled if x is not None]
        if items:
            await self.frontier.store.remember(items)
