"""Scalable bloom filters with a stable hash: the layer plan both backends share, the
in-process filter (rbloom layers) and its snapshot files.

Every key is hashed once with xxh3-128 (stable across processes and machines, unlike
Python's ``hash``). A filter starts with one layer sized for ``expected_items`` at 90 %
of the ``fp_rate`` budget; when a layer holds its capacity a new layer twice as large
is added, taking half of the budget left (5 %, 2.5 %, ... of ``fp_rate``). A key is
present when any layer has it, so the compound false-positive rate stays under
``fp_rate`` however far the filter grows.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import rbloom
import xxhash

from crawlhub.core.errors import FrontierError

#: Share of the false-positive budget the first layer takes (the expected case).
FIRST_LAYER_SHARE = 0.9
#: Each growth layer holds this many times the keys of the one before...
GROWTH = 2
#: ...at this fraction of the false-positive rate of the growth layer before.
TIGHTENING = 0.5
#: A Redis string holds at most 2^32 bits.
MAX_LAYER_BITS = 2**32
_LN2_SQ = math.log(2) ** 2
_SIGN = 1 << 127
_MAGIC = b"CRAWLHUB-BLOOM-1\n"


def stable_hash(key: str) -> int:
    """The 128-bit xxh3 hash of ``key`` (UTF-8): the only hash the filters use."""
    return xxhash.xxh3_128_intdigest(key.encode("utf-8", "surrogatepass"))


def split_hash(h: int) -> tuple[int, int]:
    """Two 32-bit halves for double hashing (bit i = (h1 + i * h2) mod m) in Redis Lua,
    whose numbers are doubles: every intermediate stays an exact integer below 2^53."""
    return (h >> 96) & 0xFFFFFFFF, ((h >> 64) & 0xFFFFFFFF) | 1


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer of a scalable filter: how many keys it takes, at what FP rate, its size."""

    capacity: int
    fp_rate: float
    bits: int
    hashes: int


def layer_plan(expected_items: int, fp_rate: float, count: int) -> list[Layer]:
    """The first ``count`` layers of a filter for ``expected_items`` at ``fp_rate``."""
    if expected_items < 1 or not 0 < fp_rate < 1:
        raise FrontierError(
            f"bloom filter needs expected_items >= 1 and 0 < fp_rate < 1, got "
            f"{expected_items} and {fp_rate}: fix frontier.expected_items / fp_rate"
        )
    layers = []
    for i in range(count):
        capacity = expected_items * GROWTH**i
        if i == 0:
            rate = fp_rate * FIRST_LAYER_SHARE
        else:
            rate = fp_rate * (1 - FIRST_LAYER_SHARE) * (1 - TIGHTENING) * TIGHTENING ** (i - 1)
        bits = max(64, math.ceil(-capacity * math.log(rate) / _LN2_SQ))
        bits = (bits + 7) // 8 * 8
        hashes = max(1, round(bits / capacity * math.log(2)))
        layers.append(Layer(capacity, rate, bits, hashes))
    return layers


def _identity(h: int) -> int:
    return h


class ScalableBloom:
    """An in-process scalable bloom filter over stable 128-bit hashes (rbloom layers).

    Safe to share between threads (the SQLite store adds on its database thread and
    reads on the event loop): every use takes the filter's lock. rbloom calls the
    (Python) hash function inside its ``add``, where the interpreter may switch threads,
    and a layer used by another thread meanwhile raises "Already mutably borrowed"."""

    def __init__(self, expected_items: int, fp_rate: float) -> None:
        self.expected_items = expected_items
        self.fp_rate = fp_rate
        self._layers: list[rbloom.Bloom] = []
        self._plan: list[Layer] = []
        self.counts: list[int] = []
        self._lock = threading.Lock()
        self._grow()

    def _grow(self) -> None:
        self._plan = layer_plan(self.expected_items, self.fp_rate, len(self._layers) + 1)
        layer = self._plan[-1]
        self._layers.append(rbloom.Bloom(layer.capacity, layer.fp_rate, _identity))
        self.counts.append(0)

    def __contains__(self, h: int) -> bool:
        s = h - _SIGN
        with self._lock:
            for layer in self._layers:
                if s in layer:
                    return True
        return False

    def add(self, h: int) -> bool:
        """Add the hash ``h``; True when it was not (probably) present before."""
        with self._lock:
            return self._add(h - _SIGN)

    def _add(self, s: int) -> bool:
        for layer in self._layers:
            if s in layer:
                return False
        if self.counts[-1] >= self._plan[-1].capacity:
            self._grow()
        self._layers[-1].add(s)
        self.counts[-1] += 1
        return True

    def add_many(self, hashes: Iterable[int]) -> int:
        # (the lock per key: a reader on another thread never waits out a whole batch)
        return sum(self.add(h) for h in hashes)

    @property
    def layers(self) -> int:
        return len(self._layers)

    @property
    def items(self) -> int:
        return sum(self.counts)

    @property
    def nbytes(self) -> int:
        """Bytes of the bit arrays (what the filter costs in memory and on disk)."""
        with self._lock:
            return sum(layer.size_in_bits // 8 for layer in self._layers)

    def to_bytes(self) -> bytes:
        with self._lock:  # the layers and their counts as of one moment
            blobs = [layer.save_bytes() for layer in self._layers]
            counts = list(self.counts)
        header = json.dumps(
            {
                "expected_items": self.expected_items,
                "fp_rate": self.fp_rate,
                "counts": counts,
                "sizes": [len(b) for b in blobs],
            }
        ).encode()
        return b"".join([_MAGIC, struct.pack(">I", len(header)), header, *blobs])

    @classmethod
    def from_bytes(cls, data: bytes) -> ScalableBloom:
        if not data.startswith(_MAGIC):
            raise FrontierError("not a crawlhub bloom snapshot (bad magic)")
        pos = len(_MAGIC)
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        header = json.loads(data[pos : pos + size])
        pos += size
        bloom = cls.__new__(cls)
        bloom.expected_items = int(header["expected_items"])
        bloom.fp_rate = float(header["fp_rate"])
        bloom.counts = [int(c) for c in header["counts"]]
        bloom._lock = threading.Lock()
        bloom._layers = []
        for n in header["sizes"]:
            bloom._layers.append(rbloom.Bloom.load_bytes(data[pos : pos + n], _identity))
            pos += n
        bloom._plan = layer_plan(bloom.expected_items, bloom.fp_rate, len(bloom._layers))
        return bloom


class FixedBloom:
    """A one-layer filter over stable hashes for a bounded cache: it never grows and stops
    taking keys at ``capacity``, so its false-positive rate stays under ``fp_rate``."""

    __slots__ = ("_bloom", "capacity", "items")

    def __init__(self, capacity: int, fp_rate: float) -> None:
        self.capacity = capacity
        self.items = 0
        self._bloom = rbloom.Bloom(max(capacity, 1), fp_rate, _identity)

    def __contains__(self, h: int) -> bool:
        return h - _SIGN in self._bloom

    def add(self, h: int) -> None:
        """Add the hash ``h``, unless the filter is full."""
        if self.items < self.capacity:
            self._bloom.add(h - _SIGN)
            self.items += 1


# ---------------------------------------------------------------------- snapshot files
def save_snapshot(directory: Path, blooms: dict[int, ScalableBloom], watermark: int) -> int:
    """Write one file per segment and a manifest naming them and the ``watermark`` (the
    last store row the filters cover). Each file is written to a temporary name, synced
    and renamed, so a crash leaves the previous snapshot or the new one, never a mix.
    Returns the bytes written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    files: dict[str, str] = {}
    for segment, bloom in blooms.items():
        name = f"segment-{segment}.bloom"
        written += _atomic_write(directory / name, bloom.to_bytes())
        files[str(segment)] = name
    manifest = json.dumps({"watermark": watermark, "segments": files}).encode()
    _atomic_write(directory / "manifest.json", manifest)
    for stale in directory.glob("segment-*.bloom"):
        if stale.name not in files.values():
            stale.unlink(missing_ok=True)
    return written


def load_snapshot(directory: Path) -> tuple[dict[int, ScalableBloom], int]:
    """The filters and watermark of the last complete snapshot ({} and 0 when none)."""
    manifest = directory / "manifest.json"
    if not manifest.exists():
        return {}, 0
    try:
        data = json.loads(manifest.read_bytes())
        blooms = {
            int(segment): ScalableBloom.from_bytes((directory / name).read_bytes())
            for segment, name in data["segments"].items()
        }
        return blooms, int(data["watermark"])
    except (OSError, ValueError, KeyError, FrontierError):
        # A damaged snapshot costs speed, not correctness: the store replays everything.
        return {}, 0


def _atomic_write(path: Path, data: bytes) -> int:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(data)
