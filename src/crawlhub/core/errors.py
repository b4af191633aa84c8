"""The one exception tree of crawlhub.

Every error crawlhub raises on purpose derives from :class:`CrawlhubError`; its message
names the input, the place and, where there is one, the fix::

    CrawlhubError
    ├── ConfigError          bad config file, entry, key or value (file/entry/key attributes)
    │   ├── ConfigErrors     several ConfigErrors found in one pass (``errors``)
    │   └── SelectorError    a selector that does not compile or uses a forbidden construct
    ├── QueueError           a queue backend refused or failed an operation
    ├── RoutingError         a task could not be routed (no outbound, limits reached)
    ├── ConvertError         an inbound's converter failed on a message
    ├── BackpressureError    an outbound is over its max_lag: try again later
    ├── BackendUnavailable   a storage backend (Redis, PostgreSQL, SQLite file) is out of reach
    ├── MissingExtraError    an optional extra (redis, postgres, kafka, curl) is not installed
    ├── FrontierError        seed store / dedup failures
    ├── FetchError           a request failed after its retries
    ├── SinkError            a sink could not write a batch
    ├── CancelledError       work stopped by a cancellation token
    ├── NotFoundError        a named thing (job, run, project, build) does not exist: 404
    └── ConflictError        the request clashes with the current state: 409

The API maps the last three kinds once (``crawlhub.api.errors``): ``NotFoundError`` 404,
``ConflictError`` 409, ``BackendUnavailable`` 503; routers raise, they do not translate.

Every message is masked when the error is made (:mod:`crawlhub.core.redact`): URL
passwords and secret query values of any error, and in a ``ConfigError`` also
``'password': '...'`` pairs, so no path that prints, logs or answers an error - ``crawlhub
check-config``, a 4xx body - shows a secret the input held.
"""

from __future__ import annotations


def _masked(message: str, *, config: bool = False) -> str:
    # imported here: crawlhub.backends, redact's package, imports this module
    from crawlhub.core.redact import redact_text, redact_url

    return redact_text(message) if config else redact_url(message)


class CrawlhubError(Exception):
    """Base of every error crawlhub raises on purpose; its message is masked."""

    def __init__(self, *args: object) -> None:
        if args and isinstance(args[0], str):
            args = (_masked(args[0], config=isinstance(self, ConfigError)), *args[1:])
        super().__init__(*args)


class ConfigError(CrawlhubError):
    """A config file, entry, key or value is wrong.

    ``file``, ``entry`` and ``key`` locate the problem, e.g. ``main.yaml``,
    ``outbound[2] 'zongju_captcha_ts3'`` and ``retry_limits``.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        entry: str | None = None,
        key: str | None = None,
    ) -> None:
        self.file = file
        self.entry = entry
        self.key = key
        self.reason = message = _masked(message, config=True)
        where = ", ".join(
            part
            for part in (
                f"file {file}" if file else "",
                f"entry {entry}" if entry else "",
                f"key '{key}'" if key else "",
            )
            if part
        )
        super().__init__(f"{where}: {message}" if where else message)


class ConfigErrors(ConfigError):
    """Several config errors found in one pass; ``str()`` lists them one per line.

    ``file``, ``entry`` and ``key`` are those of the first error.
    """

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = list(errors)
        lines = [f"config has {len(self.errors)} errors:"] + [f"  {e}" for e in self.errors]
        super().__init__("\n".join(lines))
        if self.errors:
            first = self.errors[0]
            self.file, self.entry, self.key = first.file, first.entry, first.key


class SelectorError(ConfigError):
    """A selector expression does not compile or uses a forbidden construct."""


class QueueError(CrawlhubError):
    """A queue backend refused or failed an operation."""


class RoutingError(CrawlhubError):
    """A task could not be routed."""


class ConvertError(CrawlhubError):
    """An inbound's converter failed on a message (the message is bad for that converter)."""


class BackpressureError(CrawlhubError):
    """An outbound holds ``max_lag`` tasks or more; the caller should retry later."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class BackendUnavailable(CrawlhubError):
    """A storage backend cannot be reached now (down, refusing logins, disk gone).

    The operation did not happen, or its outcome is unknown; the caller should retry
    after ``retry_after`` seconds. The API answers 503 with ``Retry-After``. ``backend``
    is the redacted URL or a short name of the backend.
    """

    def __init__(self, message: str, *, backend: str = "", retry_after: float = 1.0) -> None:
        self.backend = backend
        self.retry_after = retry_after
        super().__init__(message)


class MissingExtraError(CrawlhubError):
    """A client library of an optional extra is not installed; the message is one line
    with the fix, e.g. ``pip install 'crawlhub[redis]'``. Raised by
    :func:`crawlhub.core.extras.require`."""

    def __init__(self, module: str, extra: str, *, needed_by: str | None = None) -> None:
        self.module = module
        self.extra = extra
        package = module.split(".", 1)[0]
        fix = f"pip install 'crawlhub[{extra}]'"
        if needed_by:
            message = f"{needed_by} needs the Python package {package!r}, which is not installed: {fix}"
        else:
            message = f"the Python package {package!r} is not installed: {fix}"
        super().__init__(message)


class FrontierError(CrawlhubError):
    """The frontier (seed store or dedup filter) failed."""


class FetchError(CrawlhubError):
    """A request failed after its retries."""


class SinkError(CrawlhubError):
    """A sink could not write a batch."""


class CancelledError(CrawlhubError):
    """Work stopped because its cancellation token was cancelled."""


class NotFoundError(CrawlhubError):
    """A named thing does not exist (the API answers 404 with the message)."""


class ConflictError(CrawlhubError):
    """The request clashes with the current state, e.g. a job already running at its
    ``max_instances`` or a name taken (the API answers 409 with the message)."""
