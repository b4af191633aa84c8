"""The paged JSON source of a job: the requests it takes and how its answers are read.

Pure functions over a ``SourceConfig``: build a list/detail request for an offset, page
or time window; read items, total and API error from a body; read an item's id and date.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from crawlhub.collect.config import DetailConfig, SourceConfig
from crawlhub.core.errors import FetchError
from crawlhub.fetch.http import Request

_MISSING = object()


def get_path(data: Any, path: str | None, default: Any = None) -> Any:
    """``get_path(body, "data.items")``: a dotted path into dicts (and list indexes)."""
    if not path:
        return data
    cur = data
    for part in path.split("."):
        if isinstance(cur, Mapping):
            cur = cur.get(part, _MISSING)
        elif isinstance(cur, list) and part.lstrip("-").isdigit():
            idx = int(part)
            cur = cur[idx] if -len(cur) <= idx < len(cur) else _MISSING
        else:
            cur = _MISSING
        if cur is _MISSING:
            return default
    return cur


@dataclass(slots=True)
class ListPage:
    """One answer of the list endpoint: its items and, when the source reports it, total."""

    items: list[dict[str, Any]]
    total: int | None


class SourceError(FetchError):
    """An answer that is not what the source config describes (no items list, bad total)."""


def list_request(
    source: SourceConfig,
    *,
    offset: int | None = None,
    limit: int | None = None,
    page: int | None = None,
    window: tuple[datetime, datetime] | None = None,
    meta: dict[str, Any] | None = None,
) -> Request:
    """The list request for one offset/limit, page/size and/or time window."""
    pg = source.pagination
    params: dict[str, Any] = dict(source.params)
    if pg.type == "offset" and offset is not None:
        params[pg.offset_param] = offset
        params[pg.limit_param] = limit
    elif pg.type == "page" and page is not None:
        params[pg.page_param] = page
        params[pg.size_param] = limit
    if window is not None:
        params[pg.window_param_from] = format_time(window[0], pg.window_format)
        params[pg.window_param_to] = format_time(window[1], pg.window_format)
    return _request(source.url, source.method, params, source, meta)


def detail_request(source: SourceConfig, detail: DetailConfig, item_id: Any) -> Request:
    """The detail request of one id (``{id}`` in ``detail.url`` filled in)."""
    url = str(detail.url).replace("{id}", str(item_id))
    return _request(url, detail.method, dict(detail.params), source, {"detail_id": item_id})


def _request(
    url: str,
    method: str,
    params: dict[str, Any],
    source: SourceConfig,
    meta: dict[str, Any] | None,
) -> Request:
    if source.params_location == "json" and method == "POST":
        return Request(
            url=url,
            method=method,
            json=params,
            headers=source.headers,
            timeout=source.timeout,
            meta=dict(meta or {}),
        )
    return Request(
        url=url,
        method=method,
        params=params,
        headers=source.headers,
        timeout=source.timeout,
        meta=dict(meta or {}),
    )


def api_error(source: SourceConfig, body: Any) -> str | None:
    """The API error a 200 body reports (``error_field`` not in ``ok_values``), else None."""
    if not source.error_field:
        return None
    value = get_path(body, source.error_field, _MISSING)
    if value is _MISSING or value in source.ok_values:
        return None
    msg = get_path(body, "msg") or get_path(body, "message") or ""
    return f"{source.error_field}={value!r} {msg}".strip()


def read_page(source: SourceConfig, body: Any, *, where: str = "") -> ListPage:
    """Items (at ``items_path``) and total (at ``total_path``) of one list answer."""
    items = get_path(body, source.items_path)
    if items is None:
        items = []
    if not isinstance(items, list):
        raise SourceError(
            f"{where}: items_path {source.items_path!r} holds a {type(items).__name__}, "
            "not a list; set source.items_path to the list of items in the answer"
        )
    total: int | None = None
    if source.total_path:
        raw = get_path(body, source.total_path)
        if raw is not None:
            try:
                total = int(raw)
            except (TypeError, ValueError):
                raise SourceError(
                    f"{where}: total_path {source.total_path!r} holds {raw!r}, not a number"
                ) from None
    return ListPage(items=[i for i in items if isinstance(i, dict)], total=total)


def item_id(source: SourceConfig, item: Mapping[str, Any]) -> Any:
    return get_path(item, source.id_field)


def item_date(source: SourceConfig, item: Mapping[str, Any]) -> datetime | None:
    """The item's date as an aware datetime (naive text is local time), None if absent."""
    if not source.date_field:
        return None
    return parse_time(get_path(item, source.date_field), source.date_format)


#: strptime patterns that ``datetime.fromisoformat`` reads the same, much faster.
_ISO_PATTERNS = frozenset({"%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"})


def parse_time(value: Any, fmt: str) -> datetime | None:
    """Read ``value`` by ``fmt``: ``iso``, ``epoch``, ``epoch_ms`` or a strptime pattern."""
    if value is None or value == "":
        return None
    try:
        if fmt == "epoch":
            return datetime.fromtimestamp(float(value), UTC)
        if fmt == "epoch_ms":
            return datetime.fromtimestamp(float(value) / 1000, UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    return _parse_text(str(value), fmt)


@lru_cache(maxsize=8192)
def _parse_text(text: str, fmt: str) -> datetime | None:
    # Feeds repeat timestamps (second resolution); the cache keeps big pages cheap.
    try:
        if fmt == "iso" or (fmt in _ISO_PATTERNS and len(text) in (10, 19)):
            dt = datetime.fromisoformat(text)
        else:
            dt = datetime.strptime(text, fmt)
    except ValueError:
        return None
    return dt if dt.tzinfo is not None else dt.astimezone()


def format_time(value: datetime, fmt: str) -> str | int:
    """Write a window bound in the source's format (the inverse of ``parse_time``)."""
    if fmt == "epoch":
        return int(value.timestamp())
    if fmt == "epoch_ms":
        return int(value.timestamp() * 1000)
    if fmt == "iso":
        return value.isoformat()
    return value.astimezone().strftime(fmt) if value.tzinfo else value.strftime(fmt)


def is_fresh(when: datetime | None, now: datetime, filter_days: float | None) -> bool:
    """Inside ``filter_days`` of ``now``; an item without a date is kept."""
    if filter_days is None or when is None:
        return True
    return when >= now - timedelta(days=filter_days)
