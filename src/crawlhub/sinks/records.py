"""Record preparation shared by every sink: key, content hash, source metadata, stable JSON.

A sink calls :func:`prepare_batch` (or a :class:`Preparer`, step by step) before it touches
its store, so what can be wrong with a record (not an object, a missing key, a value JSON
cannot hold) fails there, or inside the sink's transaction for the PostgreSQL COPY path,
which prepares new rows while they stream.
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

from crawlhub.core.errors import SinkError

#: Source metadata the pipeline puts on each record (top-level keys). Sinks store them
#: beside the data (own columns in PostgreSQL) and leave them out of the content hash, so
#: a refetch of unchanged data is skipped although ``fetched_at`` moved.
METADATA_FIELDS: tuple[str, ...] = ("source_endpoint", "fetched_at", "source_file")

#: The kind of a record, when a source delivers more than one shape per key: a
#: collection job's detail stage sets ``"record_kind": "detail"`` (list records carry
#: none). Kept out of the data and its hash like the metadata; sinks that index keys
#: (JSON lines) key by (kind, key), so a list row and a detail row of one id never
#: replace each other.
KIND_FIELD = "record_kind"


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


class Preparer:
    """How one sink prepares records: its key fields, the fields kept out of the data
    (source metadata, ``drop``) and those kept out of the content hash (``hash_exclude``).

    The steps are separate so a sink can take only what it needs, record by record (the
    PostgreSQL COPY path encodes new rows as they stream, without a PreparedRecord);
    each raises ``SinkError`` naming the sink, the record and the fix.
    """

    __slots__ = ("sink", "key_fields", "left_out", "excluded")

    def __init__(
        self,
        key_fields: Sequence[str],
        *,
        sink: str,
        hash_exclude: Iterable[str] = (),
        drop: Iterable[str] = (),
    ) -> None:
        self.sink = sink
        self.key_fields = tuple(key_fields)
        self.left_out = frozenset(METADATA_FIELDS).union(drop, (KIND_FIELD,))
        self.excluded = frozenset(hash_exclude)

    def key(self, record: Any, index: int) -> tuple[tuple[Any, ...], str]:
        """The record's key values and key text (see :func:`key_text`)."""
        if type(record) is not dict and not isinstance(record, Mapping):  # ABC check is slow
            raise SinkError(
                f"{self._where(index, record)} is a {type(record).__name__}, not an object; "
                "records are dicts"
            )
        fields = self.key_fields
        if len(fields) == 1:
            value = record.get(fields[0])
            if value is None or value == "":
                raise self._no_key(record, fields[0], index)
            if type(value) is str:  # the common case: the text is the value
                return (value,), value
            key: tuple[Any, ...] = (value,)
        else:
            key = tuple(map(record.get, fields))
            for field, value in zip(fields, key, strict=True):
                if value is None or value == "":
                    raise self._no_key(record, field, index)
        try:
            return key, key_text(key)
        except (TypeError, ValueError) as exc:
            raise self._unstorable(record, index, exc) from exc

    def data(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The record without its source metadata and dropped fields."""
        data = dict(record)  # a C-speed copy, then drop the few left-out keys
        for name in self.left_out:
            if name in data:
                del data[name]
        return data

    def metadata(
        self, record: Mapping[str, Any], index: int
    ) -> tuple[str | None, str | None, str | None]:
        """``source_endpoint``, ``fetched_at`` (ISO text) and ``source_file``, or None each."""
        try:
            endpoint = record.get("source_endpoint")
            fetched = record.get("fetched_at")
            source_file = record.get("source_file")
            return (
                endpoint if endpoint is None or type(endpoint) is str else str(endpoint),
                _iso_text(fetched) if type(fetched) is str and fetched
                else iso_timestamp(fetched),
                source_file if source_file is None or type(source_file) is str
                else str(source_file),
            )
        except (TypeError, ValueError) as exc:
            raise self._unstorable(record, index, exc) from exc

    def encode(self, data: dict[str, Any], index: int) -> tuple[str, str]:
        """The data's stable JSON and its content hash."""
        try:
            raw = stable_json_bytes(data)
            excluded = self.excluded
            digest = (
                xxhash.xxh3_128_hexdigest(raw)
                if not excluded
                else content_hash({k: v for k, v in data.items() if k not in excluded})
            )
            return raw.decode(), digest
        except (TypeError, ValueError) as exc:
            raise self._unstorable(data, index, exc) from exc

    def record(
        self,
        record: Any,
        index: int,
        key: tuple[tuple[Any, ...], str] | None = None,
        *,
        lazy: bool = False,
    ) -> PreparedRecord:
        """A PreparedRecord (``key`` as :meth:`key` gave it, when already known)."""
        values, text = key if key is not None else self.key(record, index)
        prepared = PreparedRecord._from(values, text, record, self, index)
        if not lazy:
            prepared.encode()  # reads the data and the metadata too
        return prepared

    def unique(self, records: Sequence[Any]) -> dict[str, tuple[int, tuple[Any, ...]]]:
        """Key text -> (index, key values) of the last record with that key, in the order
        keys first appear; checks every record's key."""
        last: dict[str, tuple[int, tuple[Any, ...]]] = {}
        key = self.key
        for i, record in enumerate(records):
            values, text = key(record, i)
            last[text] = (i, values)
        return last

    def batch(
        self, records: Sequence[Any], *, lazy: bool = False, by_kind: bool = False
    ) -> PreparedBatch:
        """Prepare every record; a repeated key keeps its last record (earlier ones are
        skips). With ``by_kind`` a key repeats only within one record kind (sinks that
        index (kind, key)). With ``lazy`` only the keys are read now, the rest when first
        used."""
        by_key: dict[tuple[str, str], PreparedRecord] = {}
        key = self.key
        make = PreparedRecord._from
        for i, record in enumerate(records):
            values, text = key(record, i)
            prepared = make(values, text, record, self, i)
            by_key[prepared.kind if by_kind else "", text] = prepared
            if not lazy:
                prepared.encode()
        return PreparedBatch(list(by_key.values()), len(records) - len(by_key))

    def _where(self, index: int, record: Any) -> str:
        return f"sink '{self.sink}': record {index} {_preview(record)}"

    def _no_key(self, record: Any, field: str, index: int) -> SinkError:
        return SinkError(
            f"{self._where(index, record)} has no key field '{field}'; give every record its "
            f"key fields or change 'key' in the sink config (now {list(self.key_fields)})"
        )

    def _unstorable(self, record: Any, index: int, exc: Exception) -> SinkError:
        return SinkError(
            f"{self._where(index, record)} cannot be stored: {exc}; convert the value to "
            "JSON types"
        )


class PreparedRecord:
    """One record ready for a store: key, data and metadata, and (on first use) its stable
    JSON and content hash.

    Made by a :class:`Preparer`, which reads the key at once; data, metadata, JSON and
    hash are made when first read (at once, unless the batch is ``lazy``). A value that
    cannot be stored raises ``SinkError`` where it is read.
    """

    __slots__ = ("key", "key_text", "kind", "_raw", "_data", "_metadata", "_json", "_hash",
                 "_preparer", "_index")

    def __init__(
        self,
        key: tuple[Any, ...],
        key_text: str,
        data: dict[str, Any],
        metadata: dict[str, Any],
        excluded: frozenset[str] = frozenset(),
        sink: str = "",
        index: int = 0,
    ) -> None:
        self.key = key
        self.key_text = key_text
        self.kind = ""
        self._raw: Mapping[str, Any] | None = None
        self._data: dict[str, Any] | None = data
        self._metadata: dict[str, Any] | None = metadata
        self._json: str | None = None
        self._hash: str | None = None
        self._preparer = Preparer((), sink=sink, hash_exclude=excluded)
        self._index = index

    @classmethod
    def _from(
        cls,
        key: tuple[Any, ...],
        text: str,
        raw: Mapping[str, Any],
        preparer: Preparer,
        index: int,
    ) -> PreparedRecord:
        self = cls.__new__(cls)
        self.key = key
        self.key_text = text
        kind = raw.get(KIND_FIELD)
        self.kind = kind if type(kind) is str else "" if kind is None else str(kind)
        self._raw = raw
        self._data = self._metadata = None
        self._json = self._hash = None
        self._preparer = preparer
        self._index = index
        return self

    @property
    def data(self) -> dict[str, Any]:
        """The record without its source metadata (and dropped fields)."""
        if self._data is None:
            assert self._raw is not None
            self._data = self._preparer.data(self._raw)
        return self._data

    @property
    def metadata(self) -> dict[str, Any]:
        """``source_endpoint``, ``fetched_at`` (ISO text) and ``source_file``, or None."""
        if self._metadata is None:
            assert self._raw is not None
            values = self._preparer.metadata(self._raw, self._index)
            self._metadata = dict(zip(METADATA_FIELDS, values, strict=True))
        return self._metadata

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
        """Compute the stable JSON and the content hash (once); check the metadata."""
        if self._metadata is None:
            self.metadata  # noqa: B018 - read now, so a bad fetched_at fails here too
        self._json, self._hash = self._preparer.encode(self.data, self._index)

    def full(self) -> dict[str, Any]:
        """Data plus the metadata and the kind that are set: what JSON-shaped sinks store."""
        merged = dict(self.data)
        merged.update({k: v for k, v in self.metadata.items() if v is not None})
        if self.kind:
            merged[KIND_FIELD] = self.kind
        return merged

    def full_json(self) -> str:
        return stable_json(self.full())


@dataclass(slots=True)
class PreparedBatch:
    """A batch after preparation: one record per key (the last), plus how many repeats."""

    records: list[PreparedRecord]
    duplicates: int


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
    preparer = Preparer(key_fields, sink=sink, hash_exclude=hash_exclude, drop=drop)
    return preparer.record(record, index)


def prepare_batch(
    records: Sequence[Any],
    key_fields: Sequence[str],
    *,
    sink: str,
    hash_exclude: Iterable[str] = (),
    drop: Iterable[str] = (),
    lazy: bool = False,
    by_kind: bool = False,
) -> PreparedBatch:
    """Prepare every record; a repeated key keeps its last record (earlier ones are skips;
    with ``by_kind``, repeats within one record kind only).

    With ``lazy`` only the keys are read now; the rest when first used (PreparedRecord).
    """
    preparer = Preparer(key_fields, sink=sink, hash_exclude=hash_exclude, drop=drop)
    return preparer.batch(records, lazy=lazy, by_kind=by_kind)

