"""Scrapyd on crawlhub: its config section (``config``), its model over the control
plane's builds and jobs (``service``: :class:`ScrapydService`) and its eggs (``eggs``);
the HTTP face is :mod:`crawlhub.api.scrapyd` (docs/scrapyd.md).

Names load on first use: the config schema imports the section without the service.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from crawlhub.control.scrapyd.config import ScrapydSection

if TYPE_CHECKING:
    from crawlhub.control.scrapyd.eggs import ScrapydError
    from crawlhub.control.scrapyd.service import ScrapydJob, ScrapydService, scrapyd_time

_LAZY = {"ScrapydError": "eggs", "ScrapydJob": "service", "ScrapydService": "service",
         "scrapyd_time": "service"}

__all__ = ["ScrapydError", "ScrapydJob", "ScrapydSection", "ScrapydService", "scrapyd_time"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
