"""The control plane's database: projects, builds, jobs, runs, alerts and logs in one
SQLite file embedded, PostgreSQL distributed (``control.url``; the logs on
``control.logs_url``). The SQL runner is :class:`crawlhub.backends.sql.SqlDB`; its errors
name the ``control.url`` key."""

from __future__ import annotations

from crawlhub.backends.sql import SqlDB, Tx


class ControlDB(SqlDB):
    """A :class:`SqlDB` whose errors speak of the control store and ``control.url``."""

    what = "control store"
    key = "control.url"


__all__ = ["ControlDB", "Tx"]
