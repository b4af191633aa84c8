"""What every log store shares above its SQL: a line made safe to store, the words a
line is indexed by, a user's search text turned into terms, and times given by users.

Both stores index the *same* words, made here (not by SQLite's or PostgreSQL's own
parsers), so a search finds the same lines on either backend:

- a word is a run of letters and digits (``_``, ``.``, ``/``, ``-`` and every other
  punctuation separate words), NFKC-normalised and case-folded, cut to
  :data:`MAX_WORD` characters;
- Chinese, Japanese kana and other CJK ideographs have no spaces between words, so each
  such character is a word of its own and a search for ``数据库`` is the phrase
  ``数 据 库`` (the three characters next to each other).

Search text (``q``), forgiving by design: no input is a syntax error or reaches SQL as
syntax.

- ``timeout proxy``: lines with both words (any order);
- ``"read timeout"``: the words next to each other, in this order;
- ``time*``: a word starting with ``time``; ``"read time*"`` (or ``"read time"*``): a
  phrase whose last word starts so;
- ``-debug`` / ``-"cache hit"``: lines without that word or phrase;
- a term that holds several words (``example.com``, ``GET/items``) is a phrase of them;
- text with no letter or digit at all (``->``, ``***``) is a plain substring search
  (a scan: slower on big stores).
"""

from __future__ import annotations

import math
import re
import time
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime

from crawlhub.control.logs.line import LEVELS, LogLine
from crawlhub.core.durations import parse_duration
from crawlhub.core.errors import CrawlhubError

#: The longest message kept, in characters; a longer one is cut and marked with
#: :data:`TRUNCATED` and the number of characters cut.
MAX_MESSAGE = 16384
TRUNCATED = " …[truncated {n} characters]"
#: The longest job, run, task, host, source or stream code kept, in characters.
MAX_CODE = 200
#: Words are cut to this many characters (base64 blobs do not bloat the index).
MAX_WORD = 64
#: A search text may hold this many terms and this many characters at most.
MAX_TERMS = 16
MAX_QUERY = 1000

_LEVEL_ALIASES = {"warn": "warning", "fatal": "critical", "err": "error", "crit": "critical",
                  "trace": "debug", "notice": "info"}
_WORD = re.compile(r"[^\W_]+")
# Han (with extensions and compatibility ideographs), hiragana, katakana, CJK symbols:
# written without spaces, so each character is a word.
_CJK_CHAR = re.compile("([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
                       "\U00020000-\U0003134f])")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class LogQueryError(CrawlhubError):
    """A search the store cannot run: too many terms, too long, a bad time or level.
    The API answers 422 with the message."""


# -- lines ------------------------------------------------------------------------------
def clean_text(value: object, limit: int, *, mark: bool = True) -> str:
    """``value`` as text a store can hold, cut to ``limit`` characters: bytes decoded
    as UTF-8 (bad bytes become U+FFFD), lone surrogates U+FFFD, terminal colour codes
    removed, NUL and the other control characters but tab, newline and carriage return
    U+FFFD (PostgreSQL text cannot hold NUL). ``mark``: a cut text ends with
    :data:`TRUNCATED` (codes are cut silently)."""
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "replace")
    else:
        text = value if isinstance(value, str) else str(value)
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    if _CONTROL.search(text):
        text = _CONTROL.sub("\ufffd", _ANSI.sub("", text))
    if len(text) > limit:
        cut = len(text) - limit
        text = text[:limit] + (TRUNCATED.format(n=cut) if mark else "")
    return text


def _code(value: object) -> str | None:
    if value is None:
        return None
    text = clean_text(value, MAX_CODE, mark=False).strip()
    return text or None


def _level_name(level: object) -> str:
    """``level`` lower-cased, an alias (``WARN``, ``fatal``) as its level's name."""
    name = str(level).strip().lower()
    return _LEVEL_ALIASES.get(name, name)


def normal_level(level: object) -> str:
    """One of :data:`LEVELS`: ``WARN`` is ``warning``, ``fatal`` ``critical``; anything
    unknown is ``info``."""
    name = _level_name(level or "info")
    return name if name in LEVELS else "info"


def clean_line(line: LogLine) -> LogLine:
    """A copy of ``line`` any store accepts: text cleaned (:func:`clean_text`), the
    message cut to :data:`MAX_MESSAGE`, codes to :data:`MAX_CODE`, the level one of
    :data:`LEVELS`, a missing or non-finite time replaced by now. Costs about a
    microsecond for a short ASCII line."""
    ts = line.ts
    if not isinstance(ts, int | float) or not math.isfinite(ts):
        ts = time.time()
    return LogLine(ts=float(ts), message=clean_text(line.message, MAX_MESSAGE),
                   level=normal_level(line.level),
                   source=_code(line.source) or "job",
                   job=_code(line.job), run=_code(line.run), task=_code(line.task),
                   host=_code(line.host) or "", stream=_code(line.stream), id=line.id)


# -- words ------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    """The words ``text`` is indexed (or searched) by; see the module docstring."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    text = text.casefold()
    out: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group()
        if not word.isascii() and _CJK_CHAR.search(word):
            out.extend(part[:MAX_WORD] for part in _CJK_CHAR.split(word) if part)
        else:
            out.append(word[:MAX_WORD])
    return out


# -- search text ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Term:
    """Words that must stand next to each other; ``prefix``: the last one may go on."""

    words: tuple[str, ...]
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class SearchText:
    """A parsed ``q``: lines with every ``include`` term and no ``exclude`` term; or, when
    both are empty and ``substring`` is set, lines holding that text."""

    include: tuple[Term, ...] = ()
    exclude: tuple[Term, ...] = ()
    substring: str | None = None

    @property
    def empty(self) -> bool:
        return not self.include and not self.exclude and self.substring is None


_PIECE = re.compile(r'(-?)"([^"]*)"?(\*?)|(\S+)')


def parse_search(text: str | None) -> SearchText:
    """``q`` as terms (see the module docstring); never fails on syntax, only on size:
    over :data:`MAX_QUERY` characters or :data:`MAX_TERMS` terms is a
    :class:`LogQueryError`."""
    if text is None or not text.strip():
        return SearchText()
    if len(text) > MAX_QUERY:
        raise LogQueryError(f"the search text is {len(text)} characters long; at most"
                            f" {MAX_QUERY} are searched: shorten it")
    include: list[Term] = []
    exclude: list[Term] = []
    for match in _PIECE.finditer(text):
        negative, quoted, star, bare = match.groups()
        if bare is not None:
            negative = "-" if bare.startswith("-") and len(bare) > 1 else ""
            body = bare[1:] if negative else bare
            prefix = body.endswith("*")
            found = words(body)
        else:
            prefix = bool(star) or quoted.rstrip().endswith("*")
            found = words(quoted)
        if not found:
            continue
        term = Term(tuple(found), prefix)
        (exclude if negative else include).append(term)
    if len(include) + len(exclude) > MAX_TERMS:
        raise LogQueryError(f"the search text has {len(include) + len(exclude)} terms; at"
                            f" most {MAX_TERMS} are allowed: leave some out")
    if not include and not exclude:
        return SearchText(substring=clean_text(text.strip(), MAX_QUERY))
    return SearchText(tuple(include), tuple(exclude))


# -- times ------------------------------------------------------------------------------
def parse_when(value: str | float | None, *, now: float | None = None,
               name: str = "since") -> float | None:
    """A user's time as unix seconds: a number (unix seconds), ISO 8601
    (``2024-05-01T12:00:00Z``; without an offset it is UTC), or an age (``15m``,
    ``2h``, ``1h30m``: that long before ``now``). ``None`` or blank: no bound. Anything
    else is a :class:`LogQueryError` naming ``name``."""
    if value is None:
        return None
    if isinstance(value, int | float):
        number = float(value)
    else:
        text = value.strip()
        if not text:
            return None
        try:
            number = float(text)
        except ValueError:
            try:
                age = parse_duration(text)
            except ValueError:
                pass
            else:
                return (time.time() if now is None else now) - age
            try:
                when = datetime.fromisoformat(text)
            except ValueError:
                raise LogQueryError(
                    f"{name}={text!r} is not a time: give unix seconds (1714564800), ISO"
                    " 8601 (2024-05-01T12:00:00Z) or an age (15m, 2h, 7d)") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            return when.timestamp()
    if not math.isfinite(number):
        raise LogQueryError(f"{name}={value!r} is not a finite number of unix seconds")
    return number


@dataclass(slots=True)
class LogQuery:
    """Which lines a search or a tail wants. Every field is optional.

    ``level`` is a minimum (``warning`` finds warning, error and critical); ``since`` /
    ``until`` bound the lines' own time ``ts`` (unix seconds, ``until`` exclusive);
    ``before`` / ``after`` bound the store's ids (keyset paging: ``before`` pages back
    from newest, ``after`` reads forward for tails); ``q`` is search text
    (:func:`parse_search`).
    """

    job: str | None = None
    run: str | None = None
    task: str | None = None
    level: str | None = None
    source: str | None = None
    q: str | None = None
    since: float | None = None
    until: float | None = None
    before: int | None = None
    after: int | None = None
    limit: int = 100
    #: ``q`` parsed (made from ``q``, not given)
    search: SearchText = field(default_factory=SearchText, repr=False, init=False)

    def __post_init__(self) -> None:
        if self.level is not None:
            name = _level_name(self.level)
            if name not in LEVELS:
                raise LogQueryError(f"level={self.level!r} is not a level: use one of"
                                    f" {', '.join(LEVELS)}")
            self.level = name
        if not 1 <= int(self.limit) <= 10000:
            raise LogQueryError(f"limit={self.limit} is out of range: use 1 to 10000")
        self.search = parse_search(self.q)

    def min_rank(self) -> int | None:
        """The lowest level rank searched (None: every level)."""
        return LEVELS.index(self.level) if self.level is not None else None
