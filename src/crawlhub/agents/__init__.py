"""The downloader agent: intake (lease / command) -> downloader (session, proxy, ban rules)
-> extraction -> report; registry and heartbeats.
"""

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
