"""The demo's paged JSON API: a news feed whose total grows, and orders by time window.

Shaped like seed 000's source: offset 0 is the oldest item and new items are appended,
so a newest-first job starts at ``total - batch_size``. Every body carries ``code`` (0 =
ok) and ``msg``; content is a pure function of the start time and the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from crawlhub.demo import DemoConfig

DATE_FORMAT = "%Y-%m-%d %H:%M:%S"  # local time, as examples/jobs.yaml reads it
MAX_LIMIT = 500
ORDER_EVERY = 300  # one order every 5 minutes of wall time, forever
_CHANNELS = ("world", "tech", "sport", "culture", "markets")
_TOPICS = ("rates", "rain", "robots", "rivers", "rockets", "recipes", "races", "radio")
_STATUSES = ("paid", "shipped", "delivered", "refunded")


@dataclass(frozen=True)
class NewsFeed:
    """``items`` news items dated back over ``history_days`` before ``started``, then one
    more every ``grow_every`` seconds. Item ids run 1..total; id ``n`` is offset ``n-1``."""

    started: float
    items: int
    history_days: float
    grow_every: float

    @classmethod
    def start(cls, config: DemoConfig) -> NewsFeed:
        return cls(int(config.clock()), config.items, config.history_days, config.grow_every)

    def total(self, now: float) -> int:
        if self.grow_every <= 0 or now <= self.started:
            return self.items
        return self.items + int((now - self.started) // self.grow_every)

    def published(self, n: int) -> float:
        """When item ``n`` appeared (epoch seconds)."""
        if n <= self.items:
            step = self.history_days * 86400 / max(self.items, 1)
            return self.started - (self.items - n) * step
        return self.started + (n - self.items) * self.grow_every

    def item(self, n: int) -> dict[str, Any]:
        return {
            "id": n,
            "title": f"{_TOPICS[n % len(_TOPICS)].title()} report no. {n}",
            "channel": _CHANNELS[n % len(_CHANNELS)],
            "publish_time": _local(self.published(n)),
        }

    def detail(self, n: int) -> dict[str, Any]:
        item = self.item(n)
        item["body"] = (f"Report {n} on {_TOPICS[n % len(_TOPICS)]} from the "
                        f"{item['channel']} desk. " * 3).strip()
        item["author"] = f"reporter-{n % 17}"
        item["words"] = 120 + (n * 37) % 400
        return item


def order(k: int) -> dict[str, Any]:
    """Order ``k``, created at epoch second ``k * ORDER_EVERY``."""
    return {
        "orderId": k,
        "amount": f"{5 + (k * 7919) % 50000 / 100:.2f}",
        "currency": "EUR",
        "status": _STATUSES[k % len(_STATUSES)],
        "createdAt": _local(k * ORDER_EVERY),
    }


def _local(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime(DATE_FORMAT)


def add_routes(app: web.Application, feed: NewsFeed, *, clock: Callable[[], float]) -> None:
    """Mount the API under ``/api/``."""

    async def index(request: web.Request) -> web.Response:
        return _ok({
            "endpoints": {
                "GET /api/news?offset=&limit=": "news, oldest first; data.total grows",
                "GET /api/news/{id}": "one news item with its body",
                "GET|POST /api/orders": "orders in [startTime, endTime), pageIndex/pageSize",
                "GET /api/orders/{id}": "one order",
            },
            "total": feed.total(clock()),
            "grow_every": feed.grow_every,
        })

    async def news(request: web.Request) -> web.Response:
        total = feed.total(clock())
        offset = _int_param(request.query, "offset", 0, 0)
        limit = _int_param(request.query, "limit", 20, 1)
        if isinstance(offset, web.Response):
            return offset
        if isinstance(limit, web.Response):
            return limit
        stop = min(total, offset + min(limit, MAX_LIMIT))
        items = [feed.item(i + 1) for i in range(offset, stop)]
        return _ok({"total": total, "offset": offset, "items": items})

    async def news_detail(request: web.Request) -> web.Response:
        n = _path_id(request)
        total = feed.total(clock())
        if n is None or not 1 <= n <= total:
            return _error(404, f"no news item {request.match_info['id']!r} (ids run 1..{total})")
        return _ok(feed.detail(n))

    async def orders(request: web.Request) -> web.Response:
        params: dict[str, Any] = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return _error(400, "the body is not JSON")
            if not isinstance(body, dict):
                return _error(400, "the body must be a JSON object")
            params.update(body)
        now = clock()
        start = _time_param(params, "startTime", now - 86400)
        end = _time_param(params, "endTime", now)
        if start is None or end is None:
            return _error(400, f"startTime / endTime: give {DATE_FORMAT!r}, ISO or epoch")
        page = _int_param(params, "pageIndex", 1, 1)
        size = _int_param(params, "pageSize", 50, 1)
        if isinstance(page, web.Response):
            return page
        if isinstance(size, web.Response):
            return size
        size = min(size, MAX_LIMIT)
        first = math.ceil(start / ORDER_EVERY)
        last = min(math.ceil(end / ORDER_EVERY), math.floor(now / ORDER_EVERY) + 1)
        count = max(0, last - first)
        lo = first + (page - 1) * size
        rows = [order(k) for k in range(lo, min(lo + size, first + count))]
        return _ok({"total": count, "pageIndex": page, "list": rows})

    async def order_detail(request: web.Request) -> web.Response:
        k = _path_id(request)
        if k is None or k < 0 or k * ORDER_EVERY > clock():
            return _error(404, f"no order {request.match_info['id']!r}")
        return _ok(order(k))

    app.router.add_get("/api/", index)
    app.router.add_get("/api", index)
    app.router.add_get("/api/news", news)
    app.router.add_get("/api/news/{id}", news_detail)
    app.router.add_route("GET", "/api/orders", orders)
    app.router.add_route("POST", "/api/orders", orders)
    app.router.add_get("/api/orders/{id}", order_detail)


def _ok(data: Any) -> web.Response:
    return web.json_response({"code": 0, "msg": "ok", "data": data})


def _error(status: int, msg: str) -> web.Response:
    return web.json_response({"code": status, "msg": msg}, status=status)


def _path_id(request: web.Request) -> int | None:
    text = request.match_info["id"]
    return int(text) if text.isdigit() and len(text) < 19 else None


def _int_param(params: Any, name: str, default: int, least: int) -> int | web.Response:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        return _error(400, f"{name}={raw!r} is not an integer")
    if value < least:
        return _error(400, f"{name}={value} must be >= {least}")
    return value


def _time_param(params: dict[str, Any], name: str, default: float) -> float | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    if isinstance(raw, int | float) or (isinstance(raw, str) and raw.isdigit()):
        value = float(raw)
        return value / 1000 if value > 1e11 else value  # epoch ms or s
    try:
        when = datetime.fromisoformat(str(raw))
    except ValueError:
        return None
    return when.timestamp()  # naive text is local time, as the jobs send it
