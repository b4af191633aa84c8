"""Regular expressions written by users (extraction fields, link allow / deny, ban body
patterns, XPath ``re:`` functions), compiled with RE2: linear time in the text.

A task's inline ``extract`` comes from any client that can submit tasks, so its patterns
are hostile input: Python's ``re`` backtracks, and ``(a+)+$`` on 29 bytes froze an agent
for 23 s (no heartbeats: it was marked dead). RE2 never backtracks; what it cannot do in
linear time it refuses when the pattern is compiled: backreferences (``\\1``,
``(?P=name)``), lookarounds (``(?=``, ``(?!``, ``(?<=``, ``(?<!``), possessive and
atomic groups, ``\\Z`` (write ``\\z``) and the ``(?x)`` verbose flag. ``\\d``, ``\\w``,
``\\s`` and ``\\b`` are ASCII-only in RE2 (Python's ``re`` matches Unicode digits and
letters); write ``\\pL`` / ``\\pN`` for Unicode letters / digits. Counted repetitions stop
at 1000 and a pattern's compiled program at ``MAX_MEM`` bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, AnyStr

import re2

#: Memory RE2 may use for one compiled pattern (its default is 8 MiB); a pattern needing
#: more is refused at compile time instead of growing an agent.
MAX_MEM = 8 << 20

#: An RE2 compiled pattern (``re2._Regexp``: ``search``, ``match``, ``fullmatch``,
#: ``finditer``, ``sub`` like ``re.Pattern``).
Pattern = Any

_HINTS = (
    ("invalid escape sequence: \\1", "backreferences are not supported"),
    ("invalid escape sequence: \\2", "backreferences are not supported"),
    ("invalid perl operator: (?=", "lookaheads are not supported"),
    ("invalid perl operator: (?!", "lookaheads are not supported"),
    ("invalid perl operator: (?<", "lookbehinds are not supported"),
    ("invalid perl operator: (?P=", "backreferences are not supported"),
    ("invalid perl operator: (?>", "atomic groups are not supported"),
    ("invalid escape sequence: \\Z", "write \\z for the end of the text"),
    ("bad repetition operator: ++", "possessive repetitions are not supported"),
    ("bad repetition operator: *+", "possessive repetitions are not supported"),
    ("invalid perl operator: (?x", "the verbose flag (?x) is not supported"),
)


def _options(ignore_case: bool, raw_bytes: bool) -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print each refused pattern on stderr
    options.max_mem = MAX_MEM
    if ignore_case:
        options.case_sensitive = False
    if raw_bytes:  # byte by byte, like a bytes pattern of ``re``: bodies need not be UTF-8
        options.encoding = re2.Options.Encoding.LATIN1
    return options


@functools.lru_cache(maxsize=1024)
def compile_user_regex(pattern: AnyStr, *, ignore_case: bool = False) -> Pattern:
    """``pattern`` (str, or bytes to search bytes byte by byte) compiled with RE2.

    Raises ``ValueError`` saying why RE2 refuses it (and what to write instead) - callers
    turn that into a ``ConfigError`` naming the key, or a 4xx at intake.
    """
    try:
        return re2.compile(pattern, _options(ignore_case, isinstance(pattern, bytes)))
    except re2.error as exc:
        raise ValueError(f"{_text(pattern)!r} is not a regular expression RE2 can run: "
                         f"{_reason(exc)}") from None


def _text(pattern: str | bytes) -> str:
    return pattern.decode("utf-8", "replace") if isinstance(pattern, bytes) else pattern


def _reason(exc: re2.error) -> str:
    raw = exc.args[0] if exc.args else exc
    reason = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    hint = next((h for needle, h in _HINTS if needle in reason), None)
    if hint is None and reason.startswith("invalid escape sequence: \\") and \
            reason[-1:].isdigit():
        hint = "backreferences are not supported"
    if hint is not None:
        reason += (f" ({hint}: user regexes run on RE2, which matches in linear time;"
                   " see docs/security.md)")
    return reason


# RE2's matcher without the wrapper's match objects: ~1 us per URL against ~6 us for
# ``search`` (a page's links each meet every allow / deny pattern). Private names of
# google-re2, so ``search`` stands in if a release renames them.
_UNANCHORED = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)


def compile_user_test(pattern: AnyStr, *, ignore_case: bool = False) -> Callable[[AnyStr], bool]:
    """Whether ``pattern`` (see :func:`compile_user_regex`) is found in a text of its type."""
    compiled = compile_user_regex(pattern, ignore_case=ignore_case)
    match = getattr(getattr(compiled, "_regexp", None), "Match", None)
    if match is None or _UNANCHORED is None:  # pragma: no cover - another google-re2
        return lambda text: compiled.search(text) is not None
    anchor = _UNANCHORED

    def found_in_bytes(text: Any) -> bool:
        return bool(match(anchor, text, 0, len(text))[0][0] >= 0)

    def found_in_text(text: Any) -> bool:
        raw = text.encode("utf-8", "surrogatepass")
        return bool(match(anchor, raw, 0, len(raw))[0][0] >= 0)

    return found_in_bytes if isinstance(pattern, bytes) else found_in_text


class FieldRegex:
    """A ``regex`` extraction field: the value of the first match, or of every match -
    group 1 if the pattern has groups, else the whole match. The text is encoded once
    and RE2's matcher called directly (the wrapper's ``finditer`` costs ~6 us a match)."""

    __slots__ = ("pattern", "_match", "_group")

    def __init__(self, pattern: str) -> None:
        compiled = compile_user_regex(pattern)
        self.pattern = compiled
        self._group = 1 if compiled.groups else 0
        match = getattr(getattr(compiled, "_regexp", None), "Match", None)
        self._match = match if _UNANCHORED is not None else None

    def first(self, text: str) -> str | None:
        if self._match is None:  # pragma: no cover - another google-re2
            m = self.pattern.search(text)
            return None if m is None else m.group(self._group)
        raw = text.encode("utf-8", "surrogatepass")
        spans = self._match(_UNANCHORED, raw, 0, len(raw))
        return None if spans[0][0] < 0 else _piece(raw, spans[self._group])

    def every(self, text: str) -> list[str | None]:
        if self._match is None:  # pragma: no cover - another google-re2
            return [m.group(self._group) for m in self.pattern.finditer(text)]
        raw = text.encode("utf-8", "surrogatepass")
        end, pos, found = len(raw), 0, []
        match, group = self._match, self._group
        while pos <= end:
            spans = match(_UNANCHORED, raw, pos, end)
            start, stop = spans[0]
            if start < 0:
                break
            found.append(_piece(raw, spans[group]))
            if stop > start:
                pos = stop
            else:  # an empty match: go on one character later
                pos = stop + 1
                while pos < end and 0x80 <= raw[pos] < 0xC0:
                    pos += 1
        return found


def _piece(raw: bytes, span: tuple[int, int]) -> str | None:
    start, stop = span
    return None if start < 0 else raw[start:stop].decode("utf-8", "surrogatepass")
