"""pytest plugin of ``bench/scrapy_upstream.py``: runs Scrapy's own scheduler and
dupefilter tests with crawlhub's classes in place of Scrapy's.

``CRAWLHUB_SUBSTITUTE``: ``scheduler`` (crawlhub's Scheduler wherever the tests build
Scrapy's, and the default ``SCHEDULER`` / ``DUPEFILTER_CLASS`` of their crawlers) or
``dupefilter`` (crawlhub's DupeFilter as the default ``DUPEFILTER_CLASS``, under Scrapy's
own scheduler). ``CRAWLHUB_UPSTREAM_STORE``: ``sqlite`` (a fresh data directory per
test) or a ``redis://`` URL (a fresh key prefix per test). Loaded with ``-p``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

MODE = os.environ.get("CRAWLHUB_SUBSTITUTE", "scheduler")
STORE = os.environ.get("CRAWLHUB_UPSTREAM_STORE", "sqlite")


def pytest_configure(config: pytest.Config) -> None:
    from scrapy.settings import default_settings

    default_settings.DUPEFILTER_CLASS = "crawlhub.contrib.scrapy.DupeFilter"  # type: ignore[attr-defined]
    if MODE == "scheduler":
        default_settings.SCHEDULER = "crawlhub.contrib.scrapy.Scheduler"  # type: ignore[attr-defined]


def pytest_itemcollected(item: pytest.Item) -> None:
    """Scrapy's test modules import ``Scheduler`` by name: the scheduler run swaps it."""
    module: Any = getattr(item, "module", None)
    if MODE == "scheduler" and module is not None and hasattr(module, "Scheduler"):
        from crawlhub.contrib.scrapy import Scheduler

        module.Scheduler = Scheduler


@pytest.fixture(autouse=True)
def _crawlhub_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's crawls on a store of their own (as Scrapy's start empty)."""
    if STORE == "sqlite":
        monkeypatch.setenv("CRAWLHUB_URL", str(tmp_path / "crawlhub"))
    else:
        from scrapy.settings import default_settings

        monkeypatch.setenv("CRAWLHUB_URL", STORE)
        monkeypatch.setattr(default_settings, "CRAWLHUB_PREFIX",
                            f"upstream-{uuid.uuid4().hex[:8]}:", raising=False)
