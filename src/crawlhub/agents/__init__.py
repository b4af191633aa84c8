"""The downloader agent: intake (lease / command) -> downloader (session, proxy, ban rules)
-> extraction -> report; registry and heartbeats.
"""

from typing import TYPE_CHECKING

from crawlhub.core.lazy import lazy_face

if TYPE_CHECKING:  # the names below, imported on first use (start-up: crawlhub.core.lazy)
    from crawlhub.agents.codes import OUTCOMES, ResultCodes
    from crawlhub.agents.downloader import BanRules, Downloader, DownloaderConfig, Fetched
    from crawlhub.agents.extract import (
        Extracted,
        ExtractionConfig,
        ExtractionRules,
        ParseError,
        decode_body,
    )
    from crawlhub.agents.proxies import ProxyConfig, ProxyPool

__all__ = [
    "OUTCOMES",
    "BanRules",
    "Downloader",
    "DownloaderConfig",
    "Extracted",
    "ExtractionConfig",
    "ExtractionRules",
    "Fetched",
    "ParseError",
    "ProxyConfig",
    "ProxyPool",
    "ResultCodes",
    "decode_body",
]

__getattr__, __dir__ = lazy_face(__name__, {
    "OUTCOMES": "crawlhub.agents.codes",
    "ResultCodes": "crawlhub.agents.codes",
    "BanRules": "crawlhub.agents.downloader",
    "Downloader": "crawlhub.agents.downloader",
    "DownloaderConfig": "crawlhub.agents.downloader",
    "Fetched": "crawlhub.agents.downloader",
    "Extracted": "crawlhub.agents.extract",
    "ExtractionConfig": "crawlhub.agents.extract",
    "ExtractionRules": "crawlhub.agents.extract",
    "ParseError": "crawlhub.agents.extract",
    "decode_body": "crawlhub.agents.extract",
    "ProxyConfig": "crawlhub.agents.proxies",
    "ProxyPool": "crawlhub.agents.proxies",
})
