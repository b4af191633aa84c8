"""A build's log: bounded, line by line, with the project's secrets masked
(:class:`Redactor`) before a line is kept."""

from __future__ import annotations

import base64
import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from urllib.parse import quote

from crawlhub.core.redact import MASK, redact_text

#: The longest line kept in a build log (characters); longer ones are cut.
MAX_LINE = 4000


class Redactor:
    """Masks a build's secrets in text: each one as given, URL-encoded, and as the
    base64 of ``user:password`` (an HTTP basic header), plus URL passwords and secret
    query parameters of any URL (:func:`crawlhub.core.redact.redact_text`)."""

    def __init__(self, secrets: Iterable[str] = (), *, username: str | None = None) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if not secret:
                continue
            forms.update({secret, quote(secret, safe=""), quote(secret)})
            if username is not None:
                forms.add(base64.b64encode(f"{username}:{secret}".encode()).decode())
        # longest first: a secret inside another is masked with it
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return redact_text(text)


class BuildLog:
    """A build's output: the last ``max_lines`` lines (and at most ``max_chars``
    characters), secrets masked as they arrive.

    ``watch`` (optional) sees every line kept, after masking (the CLI prints them)."""

    def __init__(self, max_lines: int = 5000, redactor: Redactor | None = None,
                 watch: Callable[[str], None] | None = None, *,
                 max_chars: int = 2_000_000) -> None:
        self.lines: deque[str] = deque()
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.chars = 0
        self.dropped = 0
        self.changed = False
        self.redact = redactor or Redactor()
        self.watch = watch

    def write(self, line: str) -> None:
        line = self.redact(line.rstrip("\r\n"))
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE] + f" ... [{len(line) - MAX_LINE} characters cut]"
        self.lines.append(line)
        self.chars += len(line) + 1
        while len(self.lines) > self.max_lines or (self.chars > self.max_chars
                                                    and len(self.lines) > 1):
            self.chars -= len(self.lines.popleft()) + 1
            self.dropped += 1
        self.changed = True
        if self.watch is not None:
            with contextlib.suppress(Exception):
                self.watch(line)

    def text(self) -> str:
        head = [f"[{self.dropped} earlier lines dropped]"] if self.dropped else []
        return "\n".join([*head, *self.lines])
