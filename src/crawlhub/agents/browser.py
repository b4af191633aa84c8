"""The browser downloader: a page rendered by headless Chromium, answered as a ``Fetched``.

A task is rendered when it says ``render: true`` (or ``{wait_until, wait_for}``), when its
extraction rules say so (``extract.render``), or when the agent renders every page
(``crawlhub crawl --render``). Chromium runs through Playwright's Python package on the
system's browser (``executable`` / ``$CRAWLHUB_CHROMIUM``, default Debian's
``/usr/bin/chromium``): Playwright's own browser download is never used. Playwright is
imported when the first page is rendered, so a crawl or an agent that renders nothing
never pays for it.

What a render costs and how it stays bounded:

- one browser context per job, shared by the job's pages: the job's cookies live there,
  and Chromium starts a WebUI renderer process of its own (~100 MB) for every context, so
  a context per page would cost that ``concurrency`` times over;
- a pool of *slots*, pages of those contexts, at most ``concurrency``
  (``--render-concurrency``) rendering at once and at most as many open; a slot serves
  navigation after navigation (a new page costs a renderer process) and is closed after
  ``recycle_after`` of them, before its renderer has grown much; a free slot of another
  job makes way when the pool is full, and a context is closed with its last page; the
  browser itself is replaced after ``restart_after`` pages (a new one takes the next
  pages, the old one closes when its last page is done): memory stays flat over any
  number of pages;
- images, fonts and media are blocked by the browser itself (CDP ``setBlockedURLs`` on
  their file extensions, as Crawlee does): no request of theirs reaches Python or the site;
- the body is the rendered DOM (``page.content()``, UTF-8), so links and fields are taken
  from what the scripts built;
- cookies are the job's: before a page the job's context gets what changed in the cookie
  jar of the job's HTTP session since it last looked, after it the cookies the pages set
  go back to that jar - an HTTP login is seen by the browser and the other way round; a
  job with an HTTP downloader of its own (the download center's agents make one per job)
  has its context made with that downloader's headers, size limit and jar, in the same
  browser as every other job;
- a browser that crashes or is killed is replaced, and the pages it was rendering are
  rendered again on the new one (``crash_retries`` times), so no task is lost.

Per page, three driver round trips (``goto``, ``content``, ``cookies``), plus the wait
for a selector when one is asked for; the rest is Chromium's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from crawlhub.agents.codes import (
    CONNECTION_ERROR,
    HTTP_ERROR,
    INVALID_URL,
    SUCCESS,
    TIMEOUT,
    TOO_LARGE,
    config_error,
)
from crawlhub.agents.config import (  # (kept here under their old names too)
    CHROMIUM,
    DEFAULT_USER_AGENT,
    RenderConfig,
    RenderWait,
)
from crawlhub.agents.downloader import Fetched
from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.core.redact import redact_url

if TYPE_CHECKING:
    from crawlhub.agents.downloader import Downloader

log = logging.getLogger("crawlhub.agents.browser")

INSTALL = ("install Debian's browser ('apt-get install chromium', or name another with"
           " $CRAWLHUB_CHROMIUM) and the Playwright package (pip install 'crawlhub[render]');"
           " Playwright's own browser download is not needed")

#: Seconds a render whose page was closed under it waits for the driver to say whether
#: the whole browser is gone.
GONE_WAIT = 5.0
#: Seconds a close (page, context, browser) may take: a browser that does not answer is
#: not waited for forever (its process goes with the driver at the end).
CLOSE_WAIT = 10.0


async def _close(handle: Any) -> None:
    """Close a page, context or browser, giving up on an error or after CLOSE_WAIT s."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(handle.close(), CLOSE_WAIT)

#: The file extensions blocked for each kind: the browser drops these requests itself.
BLOCKED_EXTENSIONS: dict[str, tuple[str, ...]] = {
    "image": ("png", "jpg", "jpeg", "gif", "webp", "avif", "svg", "ico", "bmp", "tif",
              "tiff"),
    "font": ("woff", "woff2", "ttf", "otf", "eot"),
    "media": ("mp4", "webm", "ogg", "ogv", "mp3", "wav", "m4a", "m4v", "avi", "mov",
              "mkv", "flac", "aac"),
}


#: What a task's, a rule set's or the agent's ``render`` may hold: true / false, or how
#: to wait (a mapping of ``RenderWait``'s keys).
RenderSpec = bool | RenderWait


def render_wait(spec: Any, default: RenderWait, *, key: str = "render") -> RenderWait | None:
    """The waits of a page whose ``render`` is ``spec``: None when it is not rendered
    (``false``), ``default`` for ``true``, ``default`` updated by a mapping. A bad value
    is a ``ConfigError`` naming ``key``."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return default
    if isinstance(spec, RenderWait):
        return spec
    if isinstance(spec, Mapping):
        try:
            return RenderWait.model_validate({"wait_until": default.wait_until,
                                              "wait_for": default.wait_for, **spec})
        except ValidationError as exc:
            raise config_error(exc, prefix=key) from None
    raise ConfigError(f"expected true, false or a mapping with wait_until / wait_for, not"
                      f" {type(spec).__name__}", key=key)


class BrowserUnavailable(CrawlhubError):
    """Chromium or Playwright is missing, or Chromium would not start."""


@dataclass(eq=False)
class _Browser:
    """One launched Chromium and what it has served."""

    handle: Any
    generation: int
    served: int = 0
    #: slots (pages) open on it, in use or free
    active: int = 0
    #: no new slot opens on it (it served ``restart_after`` pages); closed once unused
    retired: bool = False
    #: set when the process is gone (killed, crashed, closed)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    #: the open context of each job
    contexts: dict[tuple[str, Downloader | None], _Context] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return not self.gone.is_set() and bool(self.handle.is_connected())


@dataclass(eq=False)
class _Context:
    """A job's browser context: its pages share the job's cookies."""

    browser: _Browser
    handle: Any
    job: str
    #: the job's HTTP downloader: its cookie jar, headers and size limit (None: none)
    http: Downloader | None = None
    #: the largest body its pages may answer (the job's downloader's ``max_size``)
    max_size: int = 10 * 1024 * 1024
    #: the job is over (``forget``): its pages close as their renders end
    over: bool = False
    #: its pages open, in use or free; it is closed with the last
    pages: int = 0
    #: the job's cookies as the context held them when last looked at (by a page's end
    #: or by a sync from the job's jar)
    cookies: dict[tuple[str, str, str], str] = field(default_factory=dict)


@dataclass(eq=False)
class _Slot:
    """A page of a job's context, reused navigation after navigation."""

    context: _Context
    page: Any
    uses: int = 0

    @property
    def browser(self) -> _Browser:
        return self.context.browser


class _BrowserGone(Exception):
    """The slot's browser (or its page's renderer) died under a render."""


class BrowserDownloader:
    """Render URLs in headless Chromium: ``await browser.fetch(url, job=..., wait=...)``.

    ``cookies`` is the agent's HTTP ``Downloader``: a job's cookie jar is shared with the
    contexts that render the job's pages. ``headers`` (the downloader's, User-Agent
    included) go with every request of the page. A job with an HTTP downloader of its
    own (the download center's agent makes one per job, with the job's options) passes it
    to ``fetch(..., http=)``: its context takes that one's cookies, headers and size
    limit, and one browser serves every job. Launch happens on the first ``fetch`` (or
    ``start()``); ``close()`` ends the browser and the Playwright driver.
    """

    def __init__(self, config: RenderConfig | None = None, *,
                 cookies: Downloader | None = None,
                 headers: Mapping[str, str] | None = None, max_size: int | None = None) -> None:
        self.config = config = config or RenderConfig()
        self.default_wait = RenderWait(wait_until=config.wait_until, wait_for=config.wait_for)
        self._http = cookies
        if headers is None:
            headers = cookies.config.headers if cookies is not None else {}
        self._user_agent, self._headers = _agent_and_headers(headers)
        self._max_size = max_size or (cookies.config.max_size if cookies is not None
                                      else 10 * 1024 * 1024)
        self._timeout_ms = config.timeout * 1000
        patterns: list[str] = []
        for kind in config.block:
            for ext in BLOCKED_EXTENSIONS[kind]:
                patterns += [f"*.{ext}", f"*.{ext}?*"]
        self._blocked = patterns
        self._slots = asyncio.Semaphore(config.concurrency)
        self._free: list[_Slot] = []
        #: slots open (in use or free) on live browsers
        self._open = 0
        self._lock = asyncio.Lock()
        self._playwright: Any = None
        self._driver: Any = None
        self._browser: _Browser | None = None
        self._generation = 0
        self._closed = False
        self._errors: tuple[type[BaseException], type[BaseException]] | None = None
        # stats (see ``stats``)
        self.pages = 0
        self.launches = 0
        self.crashes = 0
        self.rerenders = 0
        self.recycled = 0
        self.restarts = 0
        self.outcomes: dict[str, int] = {}

    async def __aenter__(self) -> BrowserDownloader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def started(self) -> bool:
        return self._driver is not None

    # --- the browser ----------------------------------------------------------------

    async def start(self) -> None:
        """Import Playwright and launch Chromium now (``fetch`` does it when needed).
        Raises ``BrowserUnavailable`` naming what is missing and how to install it."""
        async with self._lock:
            await self._current()

    async def _current(self) -> _Browser:
        """The browser new slots open on (launched when there is none or it died). Call
        with ``_lock`` held."""
        browser = self._browser
        if browser is not None and not browser.retired and browser.alive:
            return browser
        if browser is not None and not browser.alive and not browser.retired:
            self.crashes += 1
            log.warning("the browser (Chromium, generation %d) died after %d pages; starting"
                        " another and rendering its pages again", browser.generation,
                        browser.served)
        if self._closed:
            raise BrowserUnavailable("the browser downloader is closed")
        if self._driver is None:
            from crawlhub.core.extras import require

            api = require("playwright.async_api", "render", needed_by="rendering (--render)")
            self._errors = (api.TimeoutError, api.Error)
            if not (os.path.isfile(self.config.executable)
                    and os.access(self.config.executable, os.X_OK)):
                raise BrowserUnavailable(f"no Chromium at {self.config.executable}: {INSTALL}")
            self._playwright = api.async_playwright()
            self._driver = await self._playwright.start()
        args = ["--disable-gpu", "--disable-dev-shm-usage", "--mute-audio", *self.config.args]
        if os.geteuid() == 0:  # Chromium refuses its sandbox to root
            args.append("--no-sandbox")
        try:
            handle = await self._driver.chromium.launch(
                executable_path=self.config.executable, headless=True, args=args)
        except Exception as exc:
            raise BrowserUnavailable(f"Chromium at {self.config.executable} did not start:"
                                     f" {str(exc).splitlines()[0][:300]}; {INSTALL}") from None
        self._generation += 1
        self.launches += 1
        fresh = self._browser = _Browser(handle, self._generation)
        handle.on("disconnected", lambda _: fresh.gone.set())
        if browser is not None:  # dead or retired: its idle slots go with it
            stale = [s for s in self._free if s.browser is browser]
            self._free = [s for s in self._free if s.browser is not browser]
            browser.active -= len(stale)
            self._open -= len(stale)
            if not browser.alive or browser.active <= 0:
                await _close(browser.handle)
        return fresh

    async def _slot(self, job: str, http: Downloader | None) -> _Slot:
        """A free page of ``job``'s context, else a new one (in a new context when the job
        has none); when the pool is full, a free page of another job is closed for it."""
        for i in range(len(self._free) - 1, -1, -1):
            slot = self._free[i]
            if slot.context.job == job and slot.context.http is http \
                    and slot.browser.alive and not slot.browser.retired:
                del self._free[i]
                return slot
        for slot in [s for s in self._free if not s.browser.alive or s.browser.retired]:
            self._free.remove(slot)
            await self._drop(slot)
        if self._free and self._open >= self.config.concurrency:
            await self._drop(self._free.pop(0))  # the one free the longest
        async with self._lock:
            browser = await self._current()
            browser.active += 1  # counted before the awaits: it must not close under us
            self._open += 1
            try:
                # (bounded: a browser that stops answering must not hold the lock, and
                # with it every render, forever)
                return await asyncio.wait_for(self._open_page(browser, job, http),
                                              self.config.timeout)
            except BaseException as exc:
                browser.active -= 1
                self._open -= 1
                if isinstance(exc, TimeoutError) and browser is self._browser:
                    log.warning("the browser (Chromium, generation %d) did not open a page"
                                " within %g s; starting another", browser.generation,
                                self.config.timeout)
                    browser.retired = True  # the next slot starts a new one
                    self.restarts += 1
                raise

    async def _open_page(self, browser: _Browser, job: str, http: Downloader | None
                         ) -> _Slot:
        """A new page in ``job``'s context on ``browser`` (the context opened if needed,
        with the headers of the job's HTTP downloader ``http``)."""
        context = browser.contexts.get((job, http))
        if context is None:
            user_agent, headers, max_size = self._user_agent, self._headers, self._max_size
            if http is not self._http and http is not None:  # a job's downloader of its own
                user_agent, headers = _agent_and_headers(http.config.headers)
                max_size = http.config.max_size
            handle = await browser.handle.new_context(
                user_agent=user_agent, extra_http_headers=headers or None,
                service_workers="block")
            context = browser.contexts[(job, http)] = _Context(browser, handle, job, http,
                                                               max_size=max_size)
        # Counted before the awaits: the context's last other page, dropped meanwhile
        # (recycled, or making way), must not close the context under this new one (its
        # navigation then failed with "frame was detached").
        context.pages += 1
        page = None
        try:
            page = await context.handle.new_page()
            if self._blocked:
                cdp = await context.handle.new_cdp_session(page)
                await cdp.send("Network.enable")
                await cdp.send("Network.setBlockedURLs", {"urls": self._blocked})
        except BaseException:
            context.pages -= 1
            if page is not None:
                await asyncio.shield(_close(page))
            if context.pages == 0:
                await asyncio.shield(self._close_context(context))
            raise
        return _Slot(context, page)

    async def _give_back(self, slot: _Slot) -> None:
        slot.uses += 1
        browser = slot.browser
        browser.served += 1
        if (browser is self._browser and not browser.retired
                and browser.served >= self.config.restart_after):
            browser.retired = True  # new slots go to a new browser; this one ends empty
            self.restarts += 1
        if browser.retired or slot.uses >= self.config.recycle_after or slot.context.over:
            await self._drop(slot)
            return
        self._free.append(slot)

    def _forget(self, slot: _Slot) -> None:
        """Count the slot out of its browser, its context and the pool."""
        slot.browser.active -= 1
        slot.context.pages -= 1
        self._open -= 1

    async def _drop(self, slot: _Slot) -> None:
        """Close the slot's page, its context when that was the last page, and its
        browser when that is retired and now unused (a browser in use is never closed
        under a page)."""
        self._forget(slot)
        self.recycled += 1
        browser = slot.browser
        await _close(slot.page)
        if slot.context.pages <= 0:
            await self._close_context(slot.context)
        if browser.retired and browser.active <= 0 and browser is not self._browser:
            await _close(browser.handle)

    async def _close_context(self, context: _Context) -> None:
        key = (context.job, context.http)
        if context.browser.contexts.get(key) is context:
            del context.browser.contexts[key]
        if context.browser.alive:
            await _close(context.handle)

    async def _lost(self, slot: _Slot, why: str) -> None:
        """A render's page died with its browser, or alone (its renderer crashed): forget
        the slot. A dead browser is replaced by the next ``_slot``; the driver may report
        a closed page just before it reports the browser gone, so that is waited for."""
        self._forget(slot)
        browser = slot.browser
        if "crash" not in why.lower():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(browser.gone.wait(), GONE_WAIT)
        if browser.alive:
            await _close(slot.page)
            if slot.context.pages <= 0:
                await self._close_context(slot.context)

    async def _abandon(self, slot: _Slot) -> None:
        """A render cancelled midway: its page's state is unknown, so it is closed."""
        self._forget(slot)
        await _close(slot.page)
        if slot.context.pages <= 0:
            await self._close_context(slot.context)

    # --- fetching -------------------------------------------------------------------

    async def fetch(self, url: str, *, job: str = "", wait: RenderWait | None = None,
                    http: Downloader | None = None) -> Fetched:
        """Render ``url`` in ``job``'s cookies, waiting as ``wait`` says (the config's
        waits when None). ``http``: the job's own HTTP downloader (its cookie jar, headers
        and size limit), when it is not the one this pool was made with. Never raises for
        what the site or the browser does: every end is a ``Fetched`` (``timeout``,
        ``connection_error``, ``http_error``...)."""
        wait = wait or self.default_wait
        http = http or self._http
        async with self._slots:
            tries = self.config.crash_retries + 1
            last = ""
            for attempt in range(1, tries + 1):
                try:
                    slot = await self._slot(job, http)
                except BrowserUnavailable as exc:
                    return self._count(Fetched(url, url, 0, {}, b"", 0.0, None,
                                               CONNECTION_ERROR, attempts=attempt,
                                               error=str(exc)))
                except Exception as exc:  # the browser died or hung while a page opened
                    last = _first_line(exc)
                    browser = self._browser
                    if browser is not None and not browser.retired:  # (a hung one is)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(browser.gone.wait(), GONE_WAIT)
                    continue
                try:
                    result = await self._render(slot, url, job, wait)
                except _BrowserGone as exc:
                    last = str(exc)
                    await self._lost(slot, last)
                    if attempt < tries:
                        self.rerenders += 1
                    continue
                except BaseException:  # cancelled mid-render
                    await asyncio.shield(self._abandon(slot))
                    raise
                result.attempts = attempt
                await self._give_back(slot)
                return self._count(result)
            return self._count(Fetched(
                url, url, 0, {}, b"", 0.0, None, CONNECTION_ERROR, attempts=tries,
                error=redact_url(f"the browser died {tries} times rendering it: {last}")[:300]))

    async def _render(self, slot: _Slot, url: str, job: str, wait: RenderWait) -> Fetched:
        assert self._errors is not None
        timeout_error, playwright_error = self._errors
        page = slot.page
        started = time.perf_counter()
        try:
            await self._cookies_in(slot, job)
            response = await page.goto(url, wait_until=wait.wait_until,
                                       timeout=self._timeout_ms)
            if response is None:
                return Fetched(url, page.url, 0, {}, b"", time.perf_counter() - started, None,
                               CONNECTION_ERROR, error="the navigation got no response")
            status = response.status
            if wait.wait_for and status < 400:
                left = max(self._timeout_ms - (time.perf_counter() - started) * 1000, 1.0)
                try:
                    await page.wait_for_selector(wait.wait_for, state="attached", timeout=left)
                except timeout_error:
                    return Fetched(url, page.url, status, {}, b"",
                                   time.perf_counter() - started, None, TIMEOUT,
                                   error=f"no element matched {wait.wait_for!r} within"
                                         f" {self.config.timeout:g}s")
            headers = dict(response.headers)
            kind = headers.get("content-type", "")
            if not kind or "html" in kind:
                body = (await page.content()).encode("utf-8")
                # the DOM is written out as UTF-8 whatever the page's own charset
                headers["content-type"] = "text/html; charset=utf-8"
            else:  # a JSON, text or binary answer: its bytes as they came
                body = await response.body()
            await self._cookies_out(slot, job)
        except timeout_error:
            return Fetched(url, page.url or url, 0, {}, b"", time.perf_counter() - started,
                           None, TIMEOUT, error=f"the page did not reach {wait.wait_until!r}"
                                                f" within {self.config.timeout:g}s")
        except playwright_error as exc:
            text = _first_line(exc)
            if not slot.browser.alive or "crash" in text.lower() \
                    or "closed" in text.lower():
                raise _BrowserGone(text) from None
            outcome = INVALID_URL if "invalid url" in text.lower() else CONNECTION_ERROR
            return Fetched(url, url, 0, {}, b"", time.perf_counter() - started, None,
                           outcome, error=redact_url(text)[:300])
        elapsed = time.perf_counter() - started
        hops = 0
        request = response.request.redirected_from
        while request is not None:
            hops += 1
            request = request.redirected_from
        final = response.url
        limit = slot.context.max_size
        if len(body) > limit:
            return Fetched(url, final, status, _Headers(headers), b"", elapsed, None, TOO_LARGE,
                           redirects=hops, error=f"body larger than max_size {limit} bytes")
        outcome = HTTP_ERROR if status >= 400 else SUCCESS
        return Fetched(url, final, status, _Headers(headers), body, elapsed, None, outcome,
                       redirects=hops)

    # --- cookies --------------------------------------------------------------------

    async def _cookies_in(self, slot: _Slot, job: str) -> None:
        """Give the job's context what changed in the job's jar since it last looked:
        cookies gone from the jar are cleared, new or changed ones set (cookies a page of
        the context set meanwhile stay: its end puts them in the jar)."""
        http = slot.context.http
        if http is None:
            return
        wanted: dict[tuple[str, str, str], str] = {}
        for morsel in http.cookie_jar(job):
            domain = str(morsel["domain"]).lstrip(".")
            if domain:
                wanted[(domain, morsel["path"] or "/", morsel.key)] = morsel.value
        context = slot.context
        held = context.cookies
        if wanted == held:
            return
        for key in [k for k in held if k not in wanted]:
            domain, path, name = key
            await context.handle.clear_cookies(
                name=name, path=path, domain=re.compile(rf"^\.?{re.escape(domain)}$"))
        changed = [(k, v) for k, v in wanted.items() if held.get(k) != v]
        if changed:
            await context.handle.add_cookies([
                {"name": name, "value": value, "domain": domain, "path": path}
                for (domain, path, name), value in changed])
        context.cookies = wanted

    async def _cookies_out(self, slot: _Slot, job: str) -> None:
        """Put the cookies the job's pages set (Set-Cookie or script) in the job's jar."""
        http = slot.context.http
        if http is None:
            return
        context = slot.context
        held: dict[tuple[str, str, str], str] = {}
        for c in await context.handle.cookies():
            held[(c["domain"].lstrip("."), c.get("path") or "/", c["name"])] = c["value"]
        if held == context.cookies:
            return
        from yarl import URL

        jar = http.cookie_jar(job)
        for (domain, path, name), value in held.items():
            if context.cookies.get((domain, path, name)) == value:
                continue
            cookie: SimpleCookie = SimpleCookie()
            cookie[name] = value
            cookie[name]["path"] = path
            jar.update_cookies(cookie, URL.build(scheme="http", host=domain, path=path))
        context.cookies = held

    # --- the rest -------------------------------------------------------------------

    async def forget(self, job: str, http: Downloader | None = None) -> None:
        """``job`` is over (with ``http``, its own HTTP downloader, as given to ``fetch``):
        its free pages close now, its pages in use as their renders end, and its context
        with the last of them."""
        http = http or self._http
        browser = self._browser
        # (out of the table: the job's next page, if any, opens a context of its own)
        if browser is not None and (context := browser.contexts.pop((job, http), None)):
            context.over = True
        mine = [s for s in self._free if s.context.job == job and s.context.http is http]
        self._free = [s for s in self._free if s not in mine]
        for slot in mine:
            await self._drop(slot)

    def _count(self, result: Fetched) -> Fetched:
        self.pages += 1
        self.outcomes[result.outcome] = self.outcomes.get(result.outcome, 0) + 1
        return result

    def stats(self) -> dict[str, Any]:
        """Namespaced counters: ``browser/pages``, ``browser/outcome/<name>``,
        ``browser/launches``, ``browser/crashes``, ``browser/rerenders`` (pages rendered
        again after a crash), ``browser/pages_recycled`` (slots closed after
        ``recycle_after`` navigations, or to make way), ``browser/contexts`` (open now, one
        per job), ``browser/restarts`` (browsers replaced after ``restart_after`` pages)."""
        contexts = len(self._browser.contexts) if self._browser is not None else 0
        out: dict[str, Any] = {
            "browser/pages": self.pages, "browser/launches": self.launches,
            "browser/crashes": self.crashes, "browser/rerenders": self.rerenders,
            "browser/pages_recycled": self.recycled, "browser/contexts": contexts,
            "browser/restarts": self.restarts,
        }
        for name, n in self.outcomes.items():
            out[f"browser/outcome/{name}"] = n
        return out

    async def close(self) -> None:
        """Close every page and context, the browser and the Playwright driver."""
        self._closed = True
        free, self._free = self._free, []
        for slot in free:
            self._forget(slot)
            await _close(slot.page)
            if slot.context.pages <= 0:
                await self._close_context(slot.context)
        if self._browser is not None:
            await _close(self._browser.handle)
            self._browser = None
        if self._playwright is not None:
            with contextlib.suppress(Exception):
                await self._playwright.__aexit__(None, None, None)
            self._playwright = self._driver = None


class _Headers(dict[str, str]):
    """A response's headers (Playwright gives them lower-case), looked up in any case."""

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


def _agent_and_headers(headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """A downloader's headers as a browser context takes them: the User-Agent apart."""
    return (str(headers.get("User-Agent") or DEFAULT_USER_AGENT),
            {k: v for k, v in headers.items() if k.lower() != "user-agent"})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


__all__ = ["BLOCKED_EXTENSIONS", "CHROMIUM", "BrowserDownloader", "BrowserUnavailable",
           "RenderConfig", "RenderSpec", "RenderWait", "render_wait"]
