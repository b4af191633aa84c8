"""The ``CRAWLHUB_*`` Scrapy settings, read once and checked with errors naming them.

==========================  ==========================================================
``CRAWLHUB_URL``            ``redis://host:port/db`` (distributed; any Redis scheme
                            crawlhub takes) or a data directory (embedded SQLite,
                            shared by processes on one machine)
``CRAWLHUB_PREFIX``         the Redis key prefix (default ``crawlhub:``, or the
                            config's ``storage.redis_prefix``)
``CRAWLHUB_CONFIG``         a crawlhub config file: its storage and its
                            ``frontier.<crawl>`` section (``CRAWLHUB_URL`` wins)
``CRAWLHUB_CRAWL``          the shared crawl's name (default: the spider's name)
``CRAWLHUB_FRONTIER``       frontier settings over the defaults below, e.g.
                            ``{"segment": "1d", "expected_items": 5000000}``
``CRAWLHUB_KEY``            ``canonical`` (the frontier's key rules) or ``fingerprint``
                            (Scrapy's request fingerprinter, exactly as Scrapy dedups)
``CRAWLHUB_LEASE``          seconds a spider's requests stay leased past its last beat
                            (default 5; it beats every fifth of it): a killed
                            spider's requests go to the others after it
``CRAWLHUB_PREFETCH``       requests leased ahead of the engine (default
                            ``CONCURRENT_REQUESTS``)
``CRAWLHUB_MAX_ATTEMPTS``   leases of one request before it is given up (a request
                            whose processing kills spiders must not loop forever)
``CRAWLHUB_START_QUEUE``    the reliable queue start tasks come from (the hub's
                            outbound; default: the crawl's name; ``""``: none)
``CRAWLHUB_MAX_IDLE``       seconds an idle spider waits for new requests before it
                            closes (0: close when the crawl is done; < 0: never close,
                            scrapy-redis ``RedisSpider``'s way). Alias:
                            ``MAX_IDLE_TIME_BEFORE_CLOSE``
``SCHEDULER_PERSIST``       keep the crawl (its dedup memory and pending requests) when
                            the spider closes; False drops it after a finished crawl
``SCHEDULER_FLUSH_ON_START``  drop the crawl before the spider starts
==========================  ==========================================================

Defaults for a Scrapy crawl differ from a hub frontier's in three places: the method and
the body are part of the key (a POST search is not a duplicate of its GET), finished
requests are not archived (``archive: false``: about 2 bytes of Redis per URL), and the
filter is sized for 1,000,000 URLs per segment and grows beyond.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from crawlhub.backends.backend import Backend, BackendURLError
from crawlhub.core.errors import ConfigError
from crawlhub.core.keys import DEFAULT_PREFIX
from crawlhub.frontier.config import FrontierConfig

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,100}")
SCRAPY_FRONTIER_DEFAULTS: dict[str, Any] = {
    "key": {"include_method": True, "include_body": True},
    "archive": False,
    "lease_timeout": 5.0,
    "cache_size": 0,
}


def _error(setting: str, message: str) -> ConfigError:
    return ConfigError(f"Scrapy setting {setting}: {message}", key=setting)


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

    @property
    def backend(self) -> str:
        return self.frontier_url.split("://", 1)[0]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _storage(url: str) -> tuple[str, str]:
    """(frontier URL, queues URL) of a ``CRAWLHUB_URL``."""
    if "://" in url:
        try:
            Backend.parse(url, kinds=("redis",), what="crawl storage")
        except BackendURLError as exc:
            raise _error("CRAWLHUB_URL", f"{exc}; or give the data directory of an"
                         " embedded crawl") from None
        return url, url
    data_dir = Path(url).expanduser().resolve()
    if data_dir.exists() and not data_dir.is_dir():
        raise _error("CRAWLHUB_URL", f"{url!r} is a file: give a directory (created if"
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
    config_path = settings.get("CRAWLHUB_CONFIG")
    section: dict[str, Any] = {}
    prefix = settings.get("CRAWLHUB_PREFIX") or DEFAULT_PREFIX
    if config_path:
        from crawlhub.config import load_config

        cfg = load_config(config_path)
        frontier_url, queues_url = cfg.storage.frontier, cfg.storage.queues
        prefix = settings.get("CRAWLHUB_PREFIX") or cfg.storage.redis_prefix
        if crawl in cfg.frontier:
            section = cfg.frontier[crawl].model_dump(exclude_unset=True)
    elif not url:
        raise _error("CRAWLHUB_URL", "not set: give a redis:// URL or a data directory"
                     " (or CRAWLHUB_CONFIG, a crawlhub config file)")
    if url:
        frontier_url, queues_url = _storage(str(url))
    given = settings.get("CRAWLHUB_FRONTIER") or {}
    if isinstance(given, str):
        try:
            given = json.loads(given)
        except ValueError:
            raise _error("CRAWLHUB_FRONTIER", f"{given!r} is not a JSON object") from None
    if not isinstance(given, dict):
        raise _error("CRAWLHUB_FRONTIER", f"{given!r} is not a mapping of frontier settings")
    raw = _merge(_merge(SCRAPY_FRONTIER_DEFAULTS, section), dict(given))
    if Backend.parse(frontier_url, what="frontier storage").kind != "redis":
        raw["archive"] = True  # the embedded table keeps its rows (its filter's log)
    try:
        frontier = FrontierConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise _error("CRAWLHUB_FRONTIER", f"{where}: {first['msg']}") from None
    key = settings.get("CRAWLHUB_KEY") or "canonical"
    if key not in ("canonical", "fingerprint"):
        raise _error("CRAWLHUB_KEY", f"{key!r}: use 'canonical' (the frontier's key rules)"
                     " or 'fingerprint' (Scrapy's request fingerprinter)")
    lease = _float(settings, "CRAWLHUB_LEASE", frontier.lease_timeout)
    if lease < 1:
        raise _error("CRAWLHUB_LEASE", f"{lease} s is too short: give at least 1 second")
    concurrency = settings.getint("CONCURRENT_REQUESTS", 16)
    start_queue = settings.get("CRAWLHUB_START_QUEUE")
    if start_queue is None:
        start_queue = crawl
    max_idle = settings.get("CRAWLHUB_MAX_IDLE")
    if max_idle is None:
        max_idle = settings.get("MAX_IDLE_TIME_BEFORE_CLOSE")
    try:
        idle = -1.0 if max_idle in ("never", "forever") else float(max_idle or 0)
    except (TypeError, ValueError):
        raise _error("CRAWLHUB_MAX_IDLE", f"{max_idle!r} is not a number of seconds") from None
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
        persist=settings.getbool("SCHEDULER_PERSIST", False),
        flush_on_start=settings.getbool("SCHEDULER_FLUSH_ON_START", False),
    )
