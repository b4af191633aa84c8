"""Record preparation shared by every sink: key, content hash, source metadata, stable JSON.

A sink calls :func:`prepare_batch` before it touches its store, so what can be wrong with a
record (not an object, a missing key, a value JSON cannot hold) fails there, or inside the
sink's transaction for the lazily encoded PostgreSQL COPY path.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath
from typing import Any

import orjson
import xxhash

from crawlhub.errors import SinkError

#: Source metadata the pipeline puts on each record (top-level keys). Sinks store them
#: beside the data (own columns in PostgreSQL) and leave them out of the content hash, so
#: a refetch of unchanged data is skipped although ``fetched_at`` moved.
METADATA_FIELDS: tuple[str, ...] = ("source_endpoint", "fetched_at", "source_file")


def _json_default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Decimal | uuid.UUID | PurePath):
        return str(value)
    if isinstance(value, tuple | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} value {value!r:.80} is not JSON-serialisable")


_ENCODER = json.JSONEncoder(
    sort_keys=True,
    separators=(",", ":"),
    ensure_ascii=False,
    allow_nan=False,
    default=_json_default,
)


_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def stable_json_bytes(value: Any) -> bytes:
    """JSON (UTF-8) with sorted keys and no spaces: equal data gives equal bytes (and hash).

    orjson does the work (every record of every sink passes here); NaN and infinities
    become ``null``, as JSON has neither. Integers beyond 64 bits, which orjson refuses,
    go through the standard library encoder (same layout).
    """
    try:
        return orjson.dumps(value, default=_json_default, option=_ORJSON_OPTIONS)
    except orjson.JSONEncodeError as exc:
        if "64-bit" in str(exc):
            return _ENCODER.encode(value).encode()
        cause = exc.__cause__
        raise TypeError(str(cause) if cause is not None else str(exc)) from None


def stable_json(value: Any) -> str:
    """:func:`stable_json_bytes` as text."""
    return stable_json_bytes(value).decode()


def content_hash(data: Mapping[str, Any]) -> str:
    """The content hash of a record's data: xxh3-128 of its stable JSON, 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(stable_json_bytes(data))


def iso_timestamp(value: Any) -> str | None:
    """``fetched_at`` as ISO-8601 text: datetimes, epoch seconds and ISO strings accepted."""
    if type(value) is str and value:  # the common case first
        return _iso_text(value)
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        return value.isoformat()
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"fetched_at {value!r} is not a finite epoch")
        return dt.datetime.fromtimestamp(value, dt.UTC).isoformat()
    if isinstance(value, str):
        return _iso_text(value)
    raise ValueError(f"fetched_at {value!r:.60} is not a datetime, an epoch or ISO text")


@functools.lru_cache(maxsize=4096)
def parse_iso(value: str) -> dt.datetime:
    """ISO-8601 text as an aware datetime (naive means local time); cached, since a
    page's records share one ``fetched_at``."""
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.astimezone()


@functools.lru_cache(maxsize=4096)
def _iso_text(value: str) -> str:
    return parse_iso(value).isoformat()


class PreparedRecord:
    """One record ready for a store: key, data and metadata, and (on first use) its stable
    JSON and content hash.

    ``prepare_batch`` encodes eagerly unless asked for ``lazy`` records: the PostgreSQL
    COPY path encodes while it streams, so Python and the server work at the same time.
    A value JSON cannot hold raises ``SinkError`` where the encoding happens.
    """

    __slots__ = ("key", "key_text", "data", "metadata", "_json", "_hash", "_excluded", "_sink", "_index")

    def __init__(
        self,
        key: tuple[Any, ...],
        key_text: str,
        data: dict[str, Any],
        metadata: dict[str, Any],
        *,
        excluded: frozenset[str] = frozenset(),
        sink: str = "",
        index: int = 0,
    ) -> None:
        self.key = key
        self.key_text = key_text
        self.data = data
        self.metadata = metadata
        self._json: str | None = None
        self._hash: str | None = None
        self._excluded = excluded
        self._sink = sink
        self._index = index

    @property
    def data_json(self) -> str:
        if self._json is None:
            self.encode()
        assert self._json is not None
        return self._json

    @property
    def content_hash(self) -> str:
        if self._hash is None:
            self.encode()
        assert self._hash is not None
        return self._hash

    def encode(self) -> None:
        """Compute the stable JSON and the content hash (once)."""
        try:
            raw = stable_json_bytes(self.data)
            excluded = self._excluded
            self._hash = (
                xxhash.xxh3_128_hexdigest(raw)
                if not excluded
                else content_hash({k: v for k, v in self.data.items() if k not in excluded})
            )
            self._json = raw.decode()
        except (TypeError, ValueError) as exc:
            raise SinkError(
                f"{_where(self._sink, self._index, self.data)} cannot be stored: {exc}; "
                "convert the value to JSON types"
            ) from exc

    def full(self) -> dict[str, Any]:
        """Data plus the metadata that is set: what JSON-shaped sinks store."""
        merged = dict(self.data)
        merged.update({k: v for k, v in self.metadata.items() if v is not None})
        return merged

    def full_json(self) -> str:
        return stable_json(self.full())


@dataclass(slots=True)
class PreparedBatch:
    """A batch after preparation: one record per key (the last), plus how many repeats."""

    records: list[PreparedRecord]
    duplicates: int


def key_text(values: Sequence[Any]) -> str:
    """The key as one string: the value itself for a one-field key, else a JSON array.

    Kafka message keys, Redis index fields and JSON-lines index rows all use this text.
    """
    if len(values) == 1:
        value = values[0]
        return value if isinstance(value, str) else stable_json(value)
    return stable_json(list(values))


def _preview(record: Any) -> str:
    text = repr(record)
    return text if len(text) <= 120 else text[:117] + "..."


def prepare_record(
    record: Any,
    key_fields: Sequence[str],
    *,
    sink: str,
    index: int = 0,
    hash_exclude: Iterable[str] = (),
    drop: Iterable[str] = (),
) -> PreparedRecord:
    """Check one record and derive its key, data, metadata and content hash.

    ``drop`` fields are removed from the data (e.g. a routing field); ``hash_exclude``
    fields are stored but do not count as a change.
    """
    left_out = frozenset(METADATA_FIELDS).union(drop)
    return _prepare(
        record, tuple(key_fields), sink, index, left_out, frozenset(hash_exclude), lazy=False
    )


def _prepare(
    record: Any,
    key_fields: tuple[str, ...],
    sink: str,
    index: int,
    left_out: frozenset[str],
    excluded: frozenset[str],
    *,
    lazy: bool,
) -> PreparedRecord:
    # The hot loop of every sink: sets are built by the caller, messages only on error.
    if type(record) is not dict and not isinstance(record, Mapping):  # ABC check is slow
        raise SinkError(
            f"{_where(sink, index, record)} is a {type(record).__name__}, not an object; "
            "records are dicts"
        )
    data = dict(record)  # a C-speed copy, then drop the few left-out keys
    for name in left_out:
        if name in data:
            del data[name]
    key = (record.get(key_fields[0]),) if len(key_fields) == 1 else tuple(map(record.get, key_fields))
    for field, value in zip(key_fields, key, strict=True):
        if value is None or value == "":
            raise SinkError(
                f"{_where(sink, index, record)} has no key field '{field}'; give every record "
                f"its key fields or change 'key' in the sink config (now {list(key_fields)})"
            )
    try:
        source_endpoint = record.get("source_endpoint")
        source_file = record.get("source_file")
        metadata = {
            "source_endpoint": None if source_endpoint is None else str(source_endpoint),
            "fetched_at": iso_timestamp(record.get("fetched_at")),
            "source_file": None if source_file is None else str(source_file),
        }
        text = key_text(key)
    except (TypeError, ValueError) as exc:
        raise SinkError(
            f"{_where(sink, index, record)} cannot be stored: {exc}; convert the value to "
            "JSON types"
        ) from exc
    prepared = PreparedRecord(key, text, data, metadata, excluded=excluded, sink=sink, index=index)
    if not lazy:
        prepared.encode()
    return prepared


def _where(sink: str, index: int, record: Any) -> str:
    return f"sink '{sink}': record {index} {_preview(record)}"


def prepare_batch(
    records: Sequence[Any],
    key_fields: Sequence[str],
    *,
    sink: str,
    hash_exclude: Iterable[str] = (),
    drop: Iterable[str] = (),
    lazy: bool = False,
) -> PreparedBatch:
    """Prepare every record; a repeated key keeps its last record (earlier ones are skips).

    With ``lazy`` the JSON and hash are computed when first read (see PreparedRecord).
    """
    fields = tuple(key_fields)
    left_out = frozenset(METADATA_FIELDS).union(drop)
    excluded = frozenset(hash_exclude)
    by_key: dict[str, PreparedRecord] = {}
    for i, record in enumerate(records):
        prepared = _prepare(record, fields, sink, i, left_out, excluded, lazy=lazy)
        by_key[prepared.key_text] = prepared
    return PreparedBatch(list(by_key.values()), len(records) - len(by_key))


def redact_url(url: str) -> str:
    """A connection URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            rest = f"{creds.split(':', 1)[0]}:***@{host}"
    return scheme + sep + rest
