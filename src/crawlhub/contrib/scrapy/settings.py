"""The Scrapy settings the scheduler reads, once, checked with errors naming them.

Where the crawl is kept, first found wins: ``CRAWLHUB_URL`` (setting or environment),
``CRAWLHUB_CONFIG``'s storage, scrapy-redis's ``REDIS_URL`` / ``REDIS_HOST`` +
``REDIS_PORT`` (+ ``REDIS_PARAMS``' ``db``, ``username``, ``password``), then ``JOBDIR``
(an embedded crawl in that directory, kept across runs as Scrapy keeps a job).

==============================  ======================================================
``CRAWLHUB_URL``                ``redis://host:port/db`` (distributed; any Redis scheme
                                crawlhub takes), ``sqlite:///path/dir`` or a data
                                directory (embedded SQLite, shared by processes on
                                one machine)
``CRAWLHUB_PREFIX``             the Redis key prefix (default ``crawlhub:``, or the
                                config's ``storage.redis_prefix``)
``CRAWLHUB_CONFIG``             a crawlhub config file: its storage and its
                                ``frontier.<crawl>`` section (``CRAWLHUB_URL`` wins)
``CRAWLHUB_CRAWL``              the shared crawl's name (default: the spider's name)
``CRAWLHUB_FRONTIER``           frontier settings over the defaults below, e.g.
                                ``{"segment": "1d", "expected_items": 5000000}``
``CRAWLHUB_KEY``                ``fingerprint`` (default: Scrapy's request
                                fingerprinter, exactly as Scrapy dedups) or
                                ``canonical`` (the frontier's key rules); a custom
                                ``REQUEST_FINGERPRINTER_CLASS`` always wins
``CRAWLHUB_ORDER``              ``lifo`` (Scrapy's default: newest first among
                                requests of one priority) or ``fifo``; default from
                                ``SCHEDULER_QUEUE_CLASS`` (scrapy-redis) or
                                ``SCHEDULER_MEMORY_QUEUE`` / ``SCHEDULER_DISK_QUEUE``
``SCHEDULER_PRIORITY_QUEUE``    ``scrapy.pqueues.ScrapyPriorityQueue`` (by priority) or
                                ``scrapy.pqueues.DownloaderAwarePriorityQueue`` (Scrapy's
                                default: the least busy download slot first, among the
                                requests the spider holds); any other is refused
``CRAWLHUB_LEASE``              seconds a spider's requests stay leased past its last
                                beat (default 5; it beats every fifth of it): a killed
                                spider's requests go to the others after it
``CRAWLHUB_PREFETCH``           requests leased ahead of the engine (default
                                ``CONCURRENT_REQUESTS``)
``CRAWLHUB_LOOP``               where the scheduler's storage I/O runs: ``engine``
                                (default: on the engine's own asyncio loop when it has
                                one, the asyncio reactor being Scrapy's default; on a
                                thread of its own under another reactor) or ``thread``
                                (always on a thread of its own)
``CRAWLHUB_MAX_ATTEMPTS``       leases of one request before it is given up (a request
                                whose processing kills spiders must not loop forever)
``CRAWLHUB_START_QUEUE``        the reliable queue start tasks come from (the hub's
                                outbound; default: the crawl's name; ``""``: none)
``REDIS_START_URLS_KEY``        set: start URLs are also popped from this Redis list
                                (a set with ``REDIS_START_URLS_AS_SET``), scrapy-redis's
                                way, for spiders that are not a ``RedisSpider``
``CRAWLHUB_MAX_IDLE``           seconds an idle spider waits for new requests before it
                                closes (0: close when the crawl is done; < 0: never
                                close). Aliases: ``MAX_IDLE_TIME_BEFORE_CLOSE``,
                                ``SCHEDULER_IDLE_BEFORE_CLOSE``
``SCHEDULER_PERSIST``           keep the crawl (its dedup memory and pending requests)
                                when the spider closes; False drops it after a finished
                                crawl. Default True with ``JOBDIR``, else False
``SCHEDULER_FLUSH_ON_START``    drop the crawl before the spider starts
==============================  ======================================================

Defaults for a Scrapy crawl differ from a hub frontier's in three places: the method and
the body are part of the canonical key (a POST search is not a duplicate of its GET),
finished requests are not archived (``archive: false``: about 2 bytes of Redis per URL),
and the filter is sized for 1,000,000 URLs per segment and grows beyond.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pydantic import ValidationError

from crawlhub.backends.backend import Backend, BackendURLError
from crawlhub.core.errors import ConfigError
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.frontier.config import FrontierConfig

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

log = logging.getLogger("crawlhub.contrib.scrapy")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
#: A ``CRAWLHUB_URL`` path with one of these suffixes names a database file, not a directory.
_SQLITE_FILES = (".db", ".sqlite", ".sqlite3")
#: The priority queues the scheduler implements (Scrapy's two).
PRIORITY_QUEUES = {"scrapy.pqueues.ScrapyPriorityQueue": False,
                   "scrapy.pqueues.DownloaderAwarePriorityQueue": True}
SCRAPY_FRONTIER_DEFAULTS: dict[str, Any] = {
    "key": {"include_method": True, "include_body": True},
    "archive": False,
    "lease_timeout": 5.0,
    "cache_size": 0,
}


class ScrapySettingError(ConfigError, ValueError):
    """A Scrapy setting the scheduler cannot take; a ValueError too, as Scrapy's own
    components raise for a bad setting (callers catching that keep working)."""


def _error(setting: str, message: str) -> ConfigError:
    return ScrapySettingError(f"Scrapy setting {setting}: {message}", key=setting)


@dataclass(slots=True)
class CrawlSettings:
    """Where and how a spider's requests are kept."""

    crawl: str
    frontier_url: str
    queues_url: str
    prefix: str
    frontier: FrontierConfig
    key: str
    lease: float
    prefetch: int
    max_attempts: int
    start_queue: str | None
    max_idle: float
    persist: bool
    flush_on_start: bool
    #: ``lifo`` or ``fifo``: the order of requests of one priority
    order: str = "lifo"
    #: DownloaderAwarePriorityQueue: the least busy download slot first
    fair: bool = False
    #: scrapy-redis start URLs: a Redis key to pop them from, and whether it is a set
    start_urls_key: str | None = None
    start_urls_as_set: bool = False
    #: ``engine`` (the engine's asyncio loop when it has one) or ``thread``
    loop: str = "engine"

    @property
    def backend(self) -> str:
        return self.frontier_url.split("://", 1)[0]


def _mapping(settings: BaseSettings, name: str, what: str) -> dict[str, Any]:
    """A setting holding a mapping, given as one or as JSON text (``-s NAME='{...}'``);
    {} when unset. Anything else is a ``ConfigError`` naming the setting."""
    value = settings.get(name) or {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _error(name, f"{value!r} is not a JSON object") from None
    if not isinstance(value, dict):
        raise _error(name, f"{value!r} is not a mapping of {what}")
    return value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _storage(url: str, setting: str = "CRAWLHUB_URL") -> tuple[str, str]:
    """(frontier URL, queues URL) of a ``CRAWLHUB_URL``: a Redis URL, or a data directory
    given as a path or a ``sqlite:///`` URL (the crawl's two files go in it)."""
    if url.startswith("sqlite://"):
        try:
            backend = Backend.parse(url, kinds=("sqlite",), what="crawl storage")
        except BackendURLError as exc:
            raise _error(setting, f"{exc}; or give a data directory") from None
        url = str(backend.path or "")
        if not url or url == ":memory:":
            raise _error(setting, "an in-memory SQLite cannot be shared with the crawl's"
                         " other files: give sqlite:///<directory> or a directory")
    elif "://" in url:
        try:
            Backend.parse(url, kinds=("redis",), what="crawl storage")
        except BackendURLError as exc:
            raise _error(setting, f"{exc}; or give the data directory of an"
                         " embedded crawl (a path or sqlite:///<directory>)") from None
        return url, url
    data_dir = Path(url).expanduser().resolve()
    if data_dir.suffix in _SQLITE_FILES and not data_dir.is_dir():
        # a database file named: the frontier in it, the start queues beside it
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        queues = data_dir.with_name(f"{data_dir.stem}.queues{data_dir.suffix}")
        return f"sqlite:///{data_dir}", f"sqlite:///{queues}"
    if data_dir.exists() and not data_dir.is_dir():
        raise _error(setting, f"{url!r} is a file: give a directory (created if"
                     " missing) or a redis:// URL")
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir}/frontier.db", f"sqlite:///{data_dir}/queues.db"


def _float(settings: BaseSettings, name: str, default: float) -> float:
    try:
        return settings.getfloat(name, default)
    except (TypeError, ValueError):
        raise _error(name, f"{settings.get(name)!r} is not a number of seconds") from None


def _int(settings: BaseSettings, name: str, default: int, low: int) -> int:
    try:
        value = settings.getint(name, default)
    except (TypeError, ValueError):
        raise _error(name, f"{settings.get(name)!r} is not a whole number") from None
    if value < low:
        raise _error(name, f"{value} is below {low}")
    return value


def read_settings(settings: BaseSettings, spider_name: str) -> CrawlSettings:
    """The crawl a spider named ``spider_name`` joins under ``settings``."""
    crawl = settings.get("CRAWLHUB_CRAWL") or spider_name
    if not isinstance(crawl, str) or not _NAME.fullmatch(crawl):
        raise _error("CRAWLHUB_CRAWL", f"{crawl!r} is not a crawl name: use 1-100 letters,"
                     " digits, '_', '.' or '-'")
    url = settings.get("CRAWLHUB_URL") or os.environ.get("CRAWLHUB_URL")
    url_setting = "CRAWLHUB_URL"
    config_path = settings.get("CRAWLHUB_CONFIG")
    section: dict[str, Any] = {}
    prefix = settings.get("CRAWLHUB_PREFIX") or DEFAULT_PREFIX
    jobdir = settings.get("JOBDIR")
    if config_path:
        from crawlhub.config import load_config

        cfg = load_config(config_path)
        frontier_url, queues_url = cfg.storage.frontier, cfg.storage.queues
        prefix = settings.get("CRAWLHUB_PREFIX") or cfg.storage.redis_prefix
        if crawl in cfg.frontier:
            section = cfg.frontier[crawl].model_dump(exclude_unset=True)
    elif not url:
        url, url_setting = _scrapy_redis_url(settings)
        if not url and jobdir:
            url, url_setting = str(jobdir), "JOBDIR"
        if not url:
            raise _error("CRAWLHUB_URL", "not set: give a redis:// URL, sqlite:///<directory>"
                         " or a data directory (or CRAWLHUB_CONFIG, a crawlhub config file;"
                         " REDIS_URL and JOBDIR are read when it is missing)")
    if url:
        frontier_url, queues_url = _storage(str(url), url_setting)
    given = _mapping(settings, "CRAWLHUB_FRONTIER", "frontier settings")
    raw = _merge(_merge(SCRAPY_FRONTIER_DEFAULTS, section), dict(given))
    if Backend.parse(frontier_url, what="frontier storage").kind != "redis":
        raw["archive"] = True  # the embedded table keeps its rows (its filter's log)
    try:
        frontier = FrontierConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise _error("CRAWLHUB_FRONTIER", f"{where}: {first['msg']}") from None
    key = settings.get("CRAWLHUB_KEY") or "fingerprint"
    if key not in ("canonical", "fingerprint"):
        raise _error("CRAWLHUB_KEY", f"{key!r}: use 'fingerprint' (Scrapy's request"
                     " fingerprinter) or 'canonical' (the frontier's key rules)")
    if key == "canonical" and _custom(settings, "REQUEST_FINGERPRINTER_CLASS"):
        # the project said how its requests are told apart: that wins
        log.warning("CRAWLHUB_KEY 'canonical' is overridden: REQUEST_FINGERPRINTER_CLASS %r is"
                    " set, and a custom fingerprinter decides duplicates",
                    settings.get("REQUEST_FINGERPRINTER_CLASS"))
        key = "fingerprint"
    lease = _float(settings, "CRAWLHUB_LEASE", frontier.lease_timeout)
    if lease < 1:
        raise _error("CRAWLHUB_LEASE", f"{lease} s is too short: give at least 1 second")
    concurrency = settings.getint("CONCURRENT_REQUESTS", 16)
    start_urls_key = None
    if _custom(settings, "REDIS_START_URLS_KEY"):
        start_urls_key = str(settings.get("REDIS_START_URLS_KEY")) % {"name": spider_name}
        if Backend.parse(frontier_url, what="frontier storage").kind != "redis":
            raise _error("REDIS_START_URLS_KEY", "start URLs are read from Redis: the crawl"
                         " must be on Redis (CRAWLHUB_URL or REDIS_URL); with an embedded"
                         " crawl push start tasks to its start queue (CRAWLHUB_START_QUEUE)")
    start_queue = settings.get("CRAWLHUB_START_QUEUE")
    if start_queue is None:
        start_queue = crawl
    max_idle = settings.get("CRAWLHUB_MAX_IDLE")
    if max_idle is None:
        max_idle = settings.get("MAX_IDLE_TIME_BEFORE_CLOSE")
    if max_idle is None:
        max_idle = settings.get("SCHEDULER_IDLE_BEFORE_CLOSE")
    try:
        idle = -1.0 if max_idle in ("never", "forever") else float(max_idle or 0)
    except (TypeError, ValueError):
        raise _error("CRAWLHUB_MAX_IDLE", f"{max_idle!r} is not a number of seconds") from None
    loop = str(settings.get("CRAWLHUB_LOOP") or "engine")
    if loop not in ("engine", "thread"):
        raise _error("CRAWLHUB_LOOP", f"{loop!r}: use 'engine' (the engine's asyncio loop"
                     " when it has one) or 'thread' (a thread of the scheduler's own)")
    return CrawlSettings(
        crawl=crawl,
        frontier_url=frontier_url,
        queues_url=queues_url,
        prefix=prefix,
        frontier=frontier,
        key=key,
        lease=lease,
        prefetch=_int(settings, "CRAWLHUB_PREFETCH", max(concurrency, 1), 1),
        max_attempts=_int(settings, "CRAWLHUB_MAX_ATTEMPTS", 5, 1),
        start_queue=start_queue or None,
        max_idle=idle,
        persist=settings.getbool("SCHEDULER_PERSIST", bool(jobdir)),
        flush_on_start=settings.getbool("SCHEDULER_FLUSH_ON_START", False),
        order=_order(settings),
        fair=_fair(settings),
        start_urls_key=start_urls_key,
        start_urls_as_set=settings.getbool("REDIS_START_URLS_AS_SET", False),
        loop=loop,
    )


def _custom(settings: BaseSettings, name: str) -> bool:
    """True when the project set ``name`` (above Scrapy's defaults)."""
    priority = settings.getpriority(name)
    return priority is not None and priority > 0


def _scrapy_redis_url(settings: BaseSettings) -> tuple[str | None, str]:
    """scrapy-redis's connection settings as a Redis URL: ``REDIS_URL``, else
    ``REDIS_HOST`` / ``REDIS_PORT`` (``REDIS_PARAMS`` adds ``db``, ``username`` and
    ``password``); (None, "") when none is set."""
    params = _mapping(settings, "REDIS_PARAMS", "connection settings")
    url = settings.get("REDIS_URL") or params.get("url")
    if url:
        return str(url), "REDIS_URL"
    host, port = settings.get("REDIS_HOST"), settings.get("REDIS_PORT")
    if not host and not port:
        return None, ""
    user, password = params.get("username"), params.get("password")
    auth = ""
    if password:
        auth = f"{quote(str(user or ''), safe='')}:{quote(str(password), safe='')}@"
    db = params.get("db", 0)
    return f"redis://{auth}{host or 'localhost'}:{int(port or 6379)}/{int(db)}", "REDIS_HOST"


def _order(settings: BaseSettings) -> str:
    """``lifo`` or ``fifo`` for requests of one priority: ``CRAWLHUB_ORDER``, else
    scrapy-redis's ``SCHEDULER_QUEUE_CLASS`` (its FIFO and LIFO queues; its priority queue
    orders one priority by nothing in particular: FIFO here), else Scrapy's queue of
    that kind (``SCHEDULER_DISK_QUEUE`` with ``JOBDIR``, else ``SCHEDULER_MEMORY_QUEUE``;
    Scrapy's default is LIFO)."""
    given = settings.get("CRAWLHUB_ORDER")
    if given:
        order = str(given).lower()
        if order not in ("lifo", "fifo"):
            raise _error("CRAWLHUB_ORDER", f"{given!r}: use 'lifo' (newest first, Scrapy's"
                         " default) or 'fifo' (oldest first)")
        return order
    queue_class = str(settings.get("SCHEDULER_QUEUE_CLASS") or "")
    if queue_class:
        name = queue_class.rsplit(".", 1)[-1].lower()
        if "lifo" in name or "stack" in name:
            return "lifo"
        if "fifo" in name or "priority" in name:
            return "fifo"
        raise _error("SCHEDULER_QUEUE_CLASS", f"{queue_class!r} is not one of scrapy-redis's"
                     " FifoQueue, LifoQueue or PriorityQueue: set CRAWLHUB_ORDER instead")
    name = "SCHEDULER_DISK_QUEUE" if settings.get("JOBDIR") else "SCHEDULER_MEMORY_QUEUE"
    queue = str(settings.get(name) or "").rsplit(".", 1)[-1].lower()
    return "fifo" if "fifo" in queue else "lifo"


def _fair(settings: BaseSettings) -> bool:
    """Whether ``SCHEDULER_PRIORITY_QUEUE`` asks for Scrapy's per-slot fairness; another
    priority queue class is refused (the scheduler has its own queue)."""
    given = settings.get("SCHEDULER_PRIORITY_QUEUE") or "scrapy.pqueues.ScrapyPriorityQueue"
    name = given if isinstance(given, str) else f"{given.__module__}.{given.__qualname__}"
    if name not in PRIORITY_QUEUES:
        raise _error("SCHEDULER_PRIORITY_QUEUE", f"{name!r} cannot run here: crawlhub's"
                     " scheduler keeps its requests in the crawl's frontier and implements"
                     f" {' and '.join(PRIORITY_QUEUES)}; set one of those")
    fair = PRIORITY_QUEUES[name]
    if fair and settings.getint("CONCURRENT_REQUESTS_PER_IP", 0):
        raise _error("SCHEDULER_PRIORITY_QUEUE", "DownloaderAwarePriorityQueue does not"
                     " support CONCURRENT_REQUESTS_PER_IP (as in Scrapy): use"
                     " scrapy.pqueues.ScrapyPriorityQueue")
    return fair
