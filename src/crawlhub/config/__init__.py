"""crawlhub configuration: YAML files with includes and placeholders, settings layers, schema.

Public face; the modules behind it are loader, schema, settings, placeholders, redact, dump.
"""

from crawlhub.config.dump import dump_config
from crawlhub.config.loader import default_config, load_config
from crawlhub.config.schema import CrawlhubConfig, LoggingConfig, ServerConfig, StorageConfig
from crawlhub.config.settings import Settings, load_settings
from crawlhub.core.durations import parse_duration
from crawlhub.core.errors import ConfigError, ConfigErrors
from crawlhub.core.redact import redact
from crawlhub.hub.config import (
    ConvertConfig,
    FailureConfig,
    InboundConfig,
    OutboundConfig,
    RoutingConfig,
)

__all__ = [
    "ConfigError",
    "ConfigErrors",
    "ConvertConfig",
    "CrawlhubConfig",
    "FailureConfig",
    "InboundConfig",
    "LoggingConfig",
    "OutboundConfig",
    "RoutingConfig",
    "ServerConfig",
    "Settings",
    "StorageConfig",
    "default_config",
    "dump_config",
    "load_config",
    "load_settings",
    "parse_duration",
    "redact",
]
