"""``crawlhub crawl``: crawl URLs in one process (hub + frontier + agent + JSON lines
writer on embedded SQLite in the data dir); the same command on the same data dir resumes."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.markup import escape

from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.core.jobprotocol import EXIT
from crawlhub.core.keys import DEFAULT_PREFIX

err = Console(stderr=True)


def crawl_command(
    urls: Annotated[list[str], typer.Argument(help="Start URLs (http or https).")],
    follow: Annotated[bool, typer.Option("--follow", help="Follow the links found.")] = False,
    allow: Annotated[list[str] | None, typer.Option(
        "--allow", "--include",
        help="Follow only links matching this regex (repeatable).")] = None,
    deny: Annotated[list[str] | None, typer.Option(
        "--deny", "--exclude", help="Never follow links matching this regex (repeatable).")
    ] = None,
    depth: Annotated[int | None, typer.Option(
        "--depth", "--max-depth", min=0,
        help="Take no links from pages this many links away from a start URL.")
    ] = None,
    max_pages: Annotated[int | None, typer.Option(
        min=1, help="Fetch at most this many pages in this run, then stop (the same"
                    " command continues with as many more).")] = None,
    sitemaps: Annotated[bool, typer.Option(
        "--sitemaps", help="Also seed from the sites' sitemaps: robots.txt's Sitemap:"
                           " lines, else /sitemap.xml (indexes and .xml.gz followed); a"
                           " start URL may name a sitemap itself.")] = False,
    sitemaps_only: Annotated[bool, typer.Option(
        "--sitemaps-only", help="Crawl just the sitemaps' URLs: no start page, no links"
                                " followed.")] = False,
    canonical: Annotated[bool, typer.Option(
        "--canonical/--no-canonical",
        help="Write a page under its <link rel=canonical> URL (same host), so its copies"
             " make one item.")] = True,
    concurrency: Annotated[int, typer.Option(min=1, help="Requests at once.")] = 64,
    per_domain: Annotated[int, typer.Option(
        min=0, help="Requests at once per domain (0: no limit of its own).")] = 0,
    delay: Annotated[float, typer.Option(
        min=0.0, help="Seconds between two request starts on one domain.")] = 0.0,
    recrawl: Annotated[bool, typer.Option(
        "--recrawl", help="Crawl again: every URL the --data-dir knows is fetched with"
        " If-None-Match/If-Modified-Since; a 304 or an unchanged body writes no item,"
        " links of changed pages are followed.")] = False,
    emit_unchanged: Annotated[bool, typer.Option(
        "--emit-unchanged", help="With --recrawl: pages whose body did not change are"
        " extracted and written too (a 304 still is not).")] = False,
    adaptive: Annotated[bool, typer.Option(
        "--adaptive", help="Adaptive politeness: each domain's concurrency climbs to"
        " --per-domain (else --concurrency) while its server keeps up and falls, with a"
        " rising delay, when it slows down or answers 429/503.")] = False,
    extract: Annotated[Path | None, typer.Option(
        help="YAML file of extraction rules: fields (css/xpath/regex/json_path) and links.")
    ] = None,
    out: Annotated[Path, typer.Option(help="Items file (JSON lines, one line per page).")
                   ] = Path("items.jsonl"),
    data_dir: Annotated[Path, typer.Option(
        help="Where the crawl keeps its state; run again with the same one to resume.")
    ] = Path("crawl-data"),
    robots: Annotated[bool, typer.Option(
        "--robots/--no-robots", help="Honour robots.txt: disallowed URLs are not fetched.")
    ] = True,
    sink: Annotated[str | None, typer.Option(
        help="Write items to this sink instead of --out: a sink mapping in YAML, e.g."
             " '{type: postgres, url: postgresql://127.0.0.1/db, table: pages, key: [url]}'"
             " (any sink of `crawlhub collect`; keyed by url, so a resumed crawl writes no"
             " row twice).")] = None,
    user_agent: Annotated[str | None, typer.Option(
        help="User-Agent of every request (robots.txt is read for it), e.g."
             " 'mybot/1.0 (+https://example.com/bot)'. Default: crawlhub/0.1.")] = None,
    center: Annotated[str | None, typer.Option(
        help="Download through the download center on this broker (redis://...): its"
             " agents fetch and extract, this process keeps the frontier and the items."
             " Start `crawlhub center` and `crawlhub agent --center` first.")] = None,
    strategy: Annotated[str, typer.Option(
        help="With --center: random (every live agent), fixed (--agents kept) or chained"
             " (fixed, and the links found on agent m's page are fetched by m).")
    ] = "random",
    agents: Annotated[int, typer.Option(
        min=1, help="With --center: agents to allocate (random: at least this many).")
    ] = 1,
    center_prefix: Annotated[str, typer.Option(
        help="With --center: the key prefix of the center's broker (its config's"
             " storage.redis_prefix).")] = DEFAULT_PREFIX,
    render: Annotated[bool, typer.Option(
        "--render", help="Render every page in headless Chromium (Debian's chromium, via"
                         " Playwright: pip install 'crawlhub[render]'); links and fields"
                         " come from the DOM its scripts built.")] = False,
    render_concurrency: Annotated[int, typer.Option(
        min=1, help="With --render: pages rendered at once.")] = 4,
    wait_until: Annotated[str, typer.Option(
        help="With --render: the event a page is waited for: commit, domcontentloaded,"
             " load or networkidle.")] = "load",
    wait_for: Annotated[str | None, typer.Option(
        help="With --render: then wait for this CSS selector to be in the page, e.g."
             " '#app[data-ready]'.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Crawl URLs into JSON lines, resumably.

    Resumable: run the same command with the same --data-dir after a kill and it
    continues, fetching nothing again that is already in --out. SIGTERM (and a job
    runner's exit) stops it cleanly: the pages in flight are written first.
    """
    from crawlhub.core import heap

    with heap.starting():  # the crawl's start-up is mostly this import (crawlhub.core.heap)
        from crawlhub.app.crawl import Crawl, CrawlOptions, CrawlProgress

    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        err.print(f"[bold red]error[/] {bad[0]!r} is not an http(s) URL; give full URLs such"
                  " as http://127.0.0.1:8600/", highlight=False)
        raise typer.Exit(2)
    try:
        rules = read_extract(extract) if extract else None
        if rules and "rules" in rules:
            raise ConfigError(f"--extract {str(extract)!r}: named rule sets ('rules:') are for"
                              " the tasks of `crawlhub agent`; a crawl runs the top-level"
                              " fields and links on every page", file=str(extract),
                              key="extract.rules")
        opts = CrawlOptions(urls=list(urls), out=out, data_dir=data_dir, follow=follow,
                            allow=list(allow or []), deny=list(deny or []), depth=depth,
                            concurrency=concurrency, per_domain=per_domain, delay=delay,
                            adaptive=adaptive, recrawl=recrawl, emit_unchanged=emit_unchanged,
                            extract=rules, robots=robots, sink=read_sink(sink),
                            user_agent=user_agent, center=center, strategy=strategy,
                            agents=agents, center_prefix=center_prefix, render=render,
                            render_concurrency=render_concurrency, wait_until=wait_until,
                            wait_for=wait_for, sitemaps=sitemaps,
                            sitemaps_only=sitemaps_only, max_pages=max_pages,
                            canonical=canonical)
        if render:
            from crawlhub.agents.browser import RenderWait

            try:
                RenderWait(wait_until=wait_until, wait_for=wait_for)  # type: ignore[arg-type]
            except ValueError:
                raise ConfigError(f"--wait-until {wait_until!r}: use commit,"
                                  " domcontentloaded, load or networkidle",
                                  key="wait_until") from None
        from crawlhub.center.messages import STRATEGIES

        if strategy not in STRATEGIES:
            raise ConfigError(f"--strategy {strategy!r}: use {', '.join(STRATEGIES)}",
                              key="strategy")
        term = opts.control = TermControl(opts.control)
        crawl = Crawl(opts)
    except CrawlhubError as exc:
        err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    logging.getLogger("crawlhub").setLevel(logging.WARNING)
    # a robots.txt that cannot be had is named in the summary (and a start URL's host
    # that cannot be reached is the error): no warning for it on the way
    logging.getLogger("crawlhub.agents.robots").setLevel(logging.ERROR)
    progress: CrawlProgress
    previous = signal.signal(signal.SIGTERM, term.terminate)
    try:
        # (no bar when stderr is not a terminal: a log file gets the summary alone)
        bar = not quiet and err.is_terminal
        run = (lambda: _run_with_bar(crawl, term)) if bar else (
            lambda: asyncio.run(_interruptible(crawl.run(), term)))
        heap.started()
        progress = run()
        if term.interrupted:  # Ctrl-C whose cancel the crawl absorbed
            raise KeyboardInterrupt
    except CrawlhubError as exc:
        err.print(f"[bold red]error[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except (KeyboardInterrupt, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and not term.interrupted:
            raise
        p = crawl.progress
        err.print(f"interrupted: {p.items:,} items of this run are in {crawl.sink_name} and"
                  f" the crawl's state in {data_dir}; the same command resumes it, fetching"
                  " nothing again that is written", highlight=False, markup=False,
                  soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    unreachable = progress.unreachable
    if not unreachable or progress.items or progress.robots or progress.skipped:
        # (a crawl whose only start URL is out of reach has nothing else to say)
        err.print(summary(progress, crawl.sink_name, data_dir), highlight=False,
                  markup=False, soft_wrap=True)
    if progress.limited:
        err.print(f"stopped at --max-pages {max_pages:,}; the same command with the same"
                  " --data-dir fetches as many more", highlight=False)
    if sitemaps_only and progress.sitemaps is not None and not progress.sitemaps.urls:
        raise typer.Exit(1)
    if progress.exited:
        err.print("stopped on request (exit) after the pages in flight were written; the"
                  " same command with the same --data-dir resumes", highlight=False)
    for url, why in unreachable.items():
        err.print(f"[bold red]error[/] cannot reach {escape(urlsplit(url).netloc)}"
                  f" (start URL {escape(url)}): {escape(why)}", highlight=False,
                  soft_wrap=True)
    if unreachable:
        raise typer.Exit(1)


def summary(progress: Any, sink_name: str, data_dir: Path) -> str:
    """The crawl's last line: what was fetched, written, refused and why."""
    seconds = max(progress.rate and progress.pages / progress.rate, 0.0)
    text = (f"crawled {progress.pages:,} pages in {seconds:.1f} s ({progress.rate:,.0f}/s):"
            f" {progress.items:,} items to {sink_name}, {progress.errors:,} errors,"
            f" {progress.robots:,} disallowed by robots.txt")
    if progress.unchanged:
        text += (f", {progress.unchanged:,} unchanged since the last crawl"
                 f" ({progress.not_modified:,} answered 304)")
    if progress.robots_unavailable:
        why = "; ".join(_unavailable(r) for r in list(progress.robots_failures.values())[:3])
        more = len(progress.robots_failures) - 3
        text += (f", {progress.robots_unavailable:,} not fetched because robots.txt could"
                 f" not be had ({why}{f'; {more} more sites' if more > 0 else ''}: RFC 9309"
                 " disallows everything then)")
    if getattr(progress, "noindex", 0):
        text += f", {progress.noindex:,} noindex (no item)"
    text += f", {progress.skipped:,} already written (data: {data_dir})"
    maps = getattr(progress, "sitemaps", None)
    if maps is not None:
        text += (f"; sitemaps: {maps.urls:,} URLs from {maps.sitemaps:,} sitemaps"
                 f" ({maps.left_out:,} left out: another site's or excluded)")
        if maps.failures:
            first = "; ".join(f"{u}: {why}" for u, why in list(maps.failures.items())[:3])
            more = len(maps.failures) - 3
            text += f", {len(maps.failures):,} unreadable ({first}{f'; {more} more' if more > 0 else ''})"
    return text


def _unavailable(refusal: Any) -> str:
    if refusal.status == 0:
        return f"{refusal.origin}/robots.txt unreachable: {refusal.error or 'no answer'}"
    return f"{refusal.origin}/robots.txt answered {refusal.status}"


class TermControl:
    """The crawl's control: the job runner's (``crawlhub.sdk.control()``) when one started
    the process, turned to ``exit`` by a first SIGTERM (a second one kills at once)."""

    def __init__(self, base: Any | None = None) -> None:
        from crawlhub import sdk

        self.base = base if base is not None else sdk.control()
        self.terminated = False

    @property
    def state(self) -> str:
        return EXIT if self.terminated else str(self.base.state)

    def acknowledge(self) -> None:
        """The crawl holds still for a pause (the runner need not stop the process)."""
        ack = getattr(self.base, "acknowledge", None)
        if ack is not None and not self.terminated:
            ack()

    def terminate(self, signum: int, frame: object) -> None:
        self.terminated = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    #: Ctrl-C was pressed: the crawl is cancelled (and told to exit, should a cancel be
    #: absorbed on its way), and the command ends 130 saying what was saved
    interrupted = False

    def interrupt(self) -> None:
        self.interrupted = self.terminated = True


async def _interruptible(run: Any, control: TermControl) -> Any:
    """``run`` with SIGINT handled here rather than by ``asyncio.run``: the first Ctrl-C
    marks ``control`` interrupted (so the exit code is 130 whatever the run does with its
    cancel, and the agent stops leasing) and cancels the run; it is also handled when the
    process started with SIGINT ignored."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def interrupt() -> None:
        if control.interrupted:  # a second Ctrl-C: no more waiting for the clean-up
            raise KeyboardInterrupt
        control.interrupt()
        main.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        return await run
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def read_sink(text: str | None) -> dict[str, Any] | None:
    """The sink mapping of a --sink option (YAML), or None (also ``crawlhub agent``'s)."""
    if text is None:
        return None
    import yaml  # here: crawl --help need not load it

    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--sink: not a YAML mapping ({exc})", key="sink") from None
    if not isinstance(spec, dict):
        raise ConfigError("--sink: expected a mapping such as '{type: jsonl, path: items.jsonl,"
                          " key: [url]}'", key="sink")
    return spec


def read_extract(path: Path) -> dict:  # type: ignore[type-arg]
    """The extraction rules mapping of an --extract YAML file (also ``crawlhub agent``'s,
    where a ``rules`` key may name more sets besides the top-level ``fields`` / ``links``)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--extract {str(path)!r}: cannot read it as YAML ({exc})",
                          file=str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--extract {str(path)!r}: expected a mapping with 'fields' and/or"
                          " 'links'", file=str(path))
    # a file may hold the rules under 'extract:' or at its top
    inner = data.get("extract", data)
    if not isinstance(inner, dict):
        raise ConfigError(f"--extract {str(path)!r}: 'extract' must be a mapping",
                          file=str(path), key="extract")
    return inner


def _run_with_bar(crawl: Any, control: TermControl) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]crawl"), BarColumn(),
               TextColumn("{task.fields[text]}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:  # the summary follows
        task = bar.add_task("crawl", total=None, text="starting")

        def show(p: object) -> None:
            pages, items, errors = p.pages, p.items, p.errors  # type: ignore[attr-defined]
            queued, rate = p.queued, p.rate  # type: ignore[attr-defined]
            robots = p.robots + p.robots_unavailable  # type: ignore[attr-defined]
            bar.update(task, completed=pages, total=pages + queued,
                       text=f"pages {pages:,}  items {items:,}  errors {errors:,}"
                            f"  robots {robots:,}"
                            f"  queue {queued:,}  {rate:,.0f}/s")

        return asyncio.run(_interruptible(crawl.run(show), control))  # type: ignore[attr-defined]
