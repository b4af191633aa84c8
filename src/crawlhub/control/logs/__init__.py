"""The control plane's searchable logs: every run's stdout/stderr lines and the logs of
the hub, agents, collectors and the center, each line carrying its job, run and task
codes where known (seed 002), in SQLite FTS5 (embedded) or PostgreSQL full text
(distributed), moved there directly or through a Redis stream. See ``docs/logs.md``.

- :mod:`.line`      the line
- :mod:`.text`      cleaning, words, search text, times (shared by every store)
- :mod:`.store`     the store protocol; :mod:`.sqlite`, :mod:`.postgres` the backends,
                    :mod:`.sql` what they share, :mod:`.open` the factory
- :mod:`.transport` buffer, direct writes, Redis stream and its collector
- :mod:`.handler`   the ``logging`` handler of ``crawlhub.*`` loggers
- :mod:`.service`   :class:`LogService`, all of it for one process
"""

from crawlhub.control.logs.line import LEVELS, SOURCES, LogLine, level_rank
from crawlhub.control.logs.open import open_log_store
from crawlhub.control.logs.service import LogService
from crawlhub.control.logs.store import LogPage, LogStore
from crawlhub.control.logs.text import (
    MAX_MESSAGE,
    LogQuery,
    LogQueryError,
    parse_search,
    parse_when,
)

__all__ = [
    "LEVELS",
    "MAX_MESSAGE",
    "SOURCES",
    "LogLine",
    "LogPage",
    "LogQuery",
    "LogQueryError",
    "LogService",
    "LogStore",
    "level_rank",
    "open_log_store",
    "parse_search",
    "parse_when",
]
