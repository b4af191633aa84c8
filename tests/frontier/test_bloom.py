"""Scalable bloom filters: the layer plan, the stable hash, the in-process filter and its
snapshot files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crawlhub.frontier.bloom import (
    ScalableBloom,
    layer_plan,
    load_snapshot,
    save_snapshot,
    split_hash,
    stable_hash,
)


@pytest.mark.parametrize("fp_rate", [1e-1, 1e-3, 1e-6])
def test_the_compound_false_positive_rate_stays_under_the_bound(fp_rate: float) -> None:
    layers = layer_plan(1000, fp_rate, 30)
    assert sum(layer.fp_rate for layer in layers) < fp_rate
    assert [layer.capacity for layer in layers[:4]] == [1000, 2000, 4000, 8000]
    assert all(b.fp_rate < a.fp_rate for a, b in zip(layers[1:], layers[2:], strict=False))


def test_the_first_layer_costs_under_two_bytes_per_key_at_fp_1e_3() -> None:
    (first,) = layer_plan(1_000_000, 1e-3, 1)
    assert first.bits / 8 / first.capacity < 2.0


def test_the_hash_is_the_same_in_every_process() -> None:
    code = "from crawlhub.frontier.bloom import stable_hash; print(stable_hash('http://a.com/é'))"
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {str(stable_hash("http://a.com/é"))}


def test_split_hash_gives_two_32_bit_halves_the_second_odd() -> None:
    h1, h2 = split_hash(stable_hash("x"))
    assert 0 <= h1 < 2**32 and 0 < h2 < 2**32 and h2 % 2 == 1


def test_a_filter_never_forgets_and_grows_when_full() -> None:
    bloom = ScalableBloom(1000, 0.01)
    hashes = [stable_hash(f"k{i}") for i in range(5000)]
    new = sum(bloom.add(h) for h in hashes)
    assert bloom.layers >= 3
    assert all(h in bloom for h in hashes)
    assert new >= 5000 * 0.99
    probes = [stable_hash(f"other{i}") for i in range(20000)]
    assert sum(h in bloom for h in probes) / len(probes) < 0.01


def test_a_filter_survives_a_snapshot(tmp_path: Path) -> None:
    bloom = ScalableBloom(100, 0.01)
    hashes = [stable_hash(f"k{i}") for i in range(300)]
    bloom.add_many(hashes)
    save_snapshot(tmp_path, {7: bloom}, watermark=42)
    blooms, watermark = load_snapshot(tmp_path)
    assert watermark == 42 and set(blooms) == {7}
    restored = blooms[7]
    assert all(h in restored for h in hashes)
    assert (restored.counts, restored.layers) == (bloom.counts, bloom.layers)
    assert restored.add(stable_hash("new")) is True


def test_a_damaged_snapshot_is_ignored_not_fatal(tmp_path: Path) -> None:
    save_snapshot(tmp_path, {1: ScalableBloom(10, 0.1)}, watermark=5)
    (tmp_path / "segment-1.bloom").write_bytes(b"garbage")
    assert load_snapshot(tmp_path) == ({}, 0)


def test_no_snapshot_means_empty(tmp_path: Path) -> None:
    assert load_snapshot(tmp_path / "none") == ({}, 0)


def test_a_snapshot_drops_files_of_segments_no_longer_held(tmp_path: Path) -> None:
    save_snapshot(tmp_path, {1: ScalableBloom(10, 0.1), 2: ScalableBloom(10, 0.1)}, 1)
    save_snapshot(tmp_path, {2: ScalableBloom(10, 0.1)}, 2)
    assert sorted(p.name for p in tmp_path.glob("*.bloom")) == ["segment-2.bloom"]


def test_a_filter_read_on_one_thread_while_another_adds_answers_every_read() -> None:
    """The SQLite store adds to its filters on its database thread and reads them on the
    event loop: rbloom runs the (Python) hash function inside its add, so the other
    thread could read a layer mid-add ("RuntimeError: Already mutably borrowed", a 500 on
    POST /task/ under load) unless every use of the filter takes its lock."""
    import threading

    bloom = ScalableBloom(1000, 0.01)  # small: it grows (new layers) while read
    hashes = [stable_hash(f"k{i}") for i in range(20_000)]
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for h in hashes:
                bloom.add(h)
            bloom.to_bytes()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        thread = threading.Thread(target=writer)
        thread.start()
        reads = 0
        while not done.is_set():
            for h in hashes[:50]:
                try:
                    _ = h in bloom
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
            reads += 50
            _ = bloom.nbytes
        thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} failed uses, the first: {errors[0]!r} ({reads} reads)"
    assert all(h in bloom for h in hashes)
