"""``latest`` is the highest version: PEP 440 first, then semver, then build order."""

from __future__ import annotations

import pytest

from crawlhub.control.versions import highest, semver_key, version_key


@pytest.mark.parametrize("low, high", [
    ("1.9", "1.10"),              # numbers, not text
    ("2.0rc1", "2.0"),            # a pre-release below its release
    ("1.0", "1.0.post1"),
    ("1.0.dev3", "1.0a1"),
    ("v1.2.3", "1.2.4"),          # a leading v is read
    ("2024.5.1", "2024.12.1"),
    ("1.0.0-alpha.beta", "1.0.0-beta.2"),    # semver only (PEP 440 cannot read them)
    ("1.0.0-beta.2", "1.0.0-beta.11"),
    ("1.0.0-rc.1.x", "1.0.0-x.1"),
    ("nightly", "1.0.0-alpha.beta"),          # semver above anything unreadable
    ("1.0.0-alpha.beta", "0.0.1"),            # PEP 440 above semver-only
])
def test_versions_order(low: str, high: str) -> None:
    assert version_key(low) < version_key(high)
    assert highest([(1, high), (2, low)]) == 1  # the older build, by version


def test_semver_reads_precedence_and_ignores_build_metadata() -> None:
    assert semver_key("1.0.0+build.5") == semver_key("1.0.0+other")
    assert semver_key("1.0.0-alpha") < semver_key("1.0.0-alpha.1") < semver_key("1.0.0")
    assert semver_key("1.0") is None and semver_key("01.0.0") is None


def test_equal_or_unreadable_versions_go_by_build() -> None:
    assert highest([(3, "1.0"), (7, "1.0.0"), (5, "1.0")]) == 7
    assert highest([(3, "nightly"), (9, "dev"), (5, "x")]) == 9
    assert highest([(3, "2.0"), (9, "dev")]) == 3
    assert highest([]) is None
