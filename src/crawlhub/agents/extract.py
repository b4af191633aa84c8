"""Extraction rules run at the agent: named fields (CSS, XPath, regex, JSON path) and the
page's links (same-domain, allow / deny, max depth), so only those travel back.

Everything is compiled once, when the rules are built from config (a bad selector or regex
is a ``ConfigError`` naming its key). Regexes - fields, link allow / deny and the XPath
``re:test`` / ``re:match`` / ``re:replace`` functions - run on RE2
(:mod:`crawlhub.core.userregex`): linear time, so a task's rules cannot stall the agent. The link path is a compiled regex over ``<a>`` start
tags, not an HTML parser. Measured on the benchmark's 2 KB page with 10 links (CPU per
page): title + links here ~15 us in all; parsel ``a::attr(href)`` + urljoin ~105 us;
selectolax 1.0 (lexbor) ~100 us, so it was not added: the parse, not the selector, is the
cost, and ``urljoin`` (~4 us a link) is only used for paths that are neither absolute nor
root-relative. HTML comments are skipped and ``<base href>`` is honoured; links written
inside ``<script>`` text may be picked up (harmless: they are filtered like any link). A
page is parsed with lxml (via parsel) only when a CSS or XPath field asks for it (~45 us
for that page), and its body is decoded once.

:class:`RuleSets` picks each task's rules: the agent's default, a named set of its
``--extract`` file, or inline rules the task carries (compiled once per distinct set).
"""

from __future__ import annotations

import html
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import orjson
from lxml import etree
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from w3lib.encoding import html_body_declared_encoding, http_content_type_encoding

from crawlhub.agents.browser import RenderWait
from crawlhub.agents.codes import config_error
from crawlhub.core.errors import ConfigError, CrawlhubError
from crawlhub.core.userregex import FieldRegex, Pattern, compile_user_regex, compile_user_test


class ParseError(CrawlhubError):
    """A page could not be parsed for its extraction rules (e.g. a JSON field on a body
    that is not JSON). The agent reports it as the outcome ``parse_error``."""


# --- config ---------------------------------------------------------------------------

_EXSLT_RE = "http://exslt.org/regular-expressions"
_XPATH_NS = {"re": _EXSLT_RE}


def _string_value(arg: Any) -> str:
    """An XPath function argument as a string: a node-set's first node, or the value."""
    if isinstance(arg, list):
        if not arg:
            return ""
        arg = arg[0]
    if isinstance(arg, etree._Element):
        return "".join(arg.itertext())
    if isinstance(arg, bool):
        return "true" if arg else "false"
    return str(arg)


def _xpath_regex(pattern: Any, flags: Any) -> Pattern:
    text = _string_value(pattern)
    try:
        return compile_user_regex(text, ignore_case="i" in _string_value(flags))
    except ValueError as exc:
        raise ParseError(f"XPath regular expression: {exc}") from None


def _re_test(_: Any, value: Any, pattern: Any, flags: Any = "") -> bool:
    return _xpath_regex(pattern, flags).search(_string_value(value)) is not None


def _re_match(_: Any, value: Any, pattern: Any, flags: Any = "") -> list[str]:
    regex = _xpath_regex(pattern, flags)
    text = _string_value(value)
    if "g" in _string_value(flags):
        return [m.group(0) for m in regex.finditer(text)]
    m = regex.search(text)
    if m is None:
        return []
    return [m.group(0), *(g or "" for g in m.groups())]


def _re_replace(_: Any, value: Any, pattern: Any, flags: Any, replacement: Any) -> str:
    regex = _xpath_regex(pattern, flags)
    count = 0 if "g" in _string_value(flags) else 1
    # EXSLT's replacement is literal text: no group references
    literal = _string_value(replacement).replace("\\", "\\\\")
    return str(regex.sub(literal, _string_value(value), count=count))


#: EXSLT's regular-expression functions on RE2 (lxml's own run on Python's ``re``).
_XPATH_FUNCTIONS = {(_EXSLT_RE, "test"): _re_test, (_EXSLT_RE, "match"): _re_match,
                    (_EXSLT_RE, "replace"): _re_replace}


_RE_CALL = re.compile(r"\bre:(?:test|match|replace)\s*\(")


def _literal_patterns(expression: str) -> list[str]:
    """The patterns written as string literals in the ``re:`` calls of an XPath (the
    second argument), to refuse those RE2 cannot run when the rules are compiled."""
    found = []
    for call in _RE_CALL.finditer(expression):
        args: list[str] = [""]
        depth, quote = 0, ""
        for ch in expression[call.end():]:
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch in "([":
                depth += 1
            elif ch in ")]":
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                args.append("")
                continue
            args[-1] += ch
        pattern = args[1].strip() if len(args) > 1 else ""
        if len(pattern) >= 2 and pattern[0] == pattern[-1] and pattern[0] in "'\"":
            found.append(pattern[1:-1])
    return found


def _xpath(expression: str) -> etree.XPath:
    compiled = etree.XPath(expression, namespaces=_XPATH_NS, smart_strings=False,
                           regexp=False, extensions=_XPATH_FUNCTIONS)
    for pattern in _literal_patterns(expression):
        compile_user_regex(pattern)  # ValueError: RE2's reason
    return compiled


def _compile_css(css: str) -> etree.XPath:
    # parsel is imported when a rule needs it: a crawl of titles and links never does
    from parsel.csstranslator import HTMLTranslator

    try:
        return _xpath(HTMLTranslator().css_to_xpath(css))
    except Exception as exc:  # cssselect's SelectorError or lxml's XPathSyntaxError
        raise ValueError(f"{css!r} is not a valid CSS selector: {exc}") from None


def _compile_xpath(xpath: str) -> etree.XPath:
    try:
        return _xpath(xpath)
    except Exception as exc:
        raise ValueError(f"{xpath!r} is not a valid XPath expression: {exc}") from None


def _any_of(patterns: list[str]) -> Callable[[str], bool]:
    """Whether any of ``patterns`` (each valid on its own) is found in a text."""
    if len(patterns) == 1:
        return compile_user_test(patterns[0])
    return compile_user_test("|".join(f"(?:{p})" for p in patterns))


_JSON_STEP = re.compile(r"([^.\[\]]+)|\[(\*|-?\d+)\]|(\.)")


def compile_json_path(path: str) -> tuple[str | int, ...]:
    """``data.items[0].name`` -> ``("data", "items", 0, "name")``; ``[*]`` or ``*`` is
    every item. A leading ``$`` or ``$.`` is allowed. Keys holding dots or brackets cannot
    be named. Raises ``ValueError`` for anything else."""
    text = path.strip()
    if text.startswith("$"):
        text = text[1:].lstrip(".")
    if not text:
        raise ValueError(f"{path!r} is an empty JSON path; write e.g. data.items[0].name")
    steps: list[str | int] = []
    pos = 0
    expect_key = True
    while pos < len(text):
        m = _JSON_STEP.match(text, pos)
        if m is None:
            raise ValueError(f"{path!r} is not a JSON path like data.items[0].name "
                             f"(stuck at {text[pos:pos + 10]!r})")
        key, index, dot = m.groups()
        if dot:
            if expect_key:
                raise ValueError(f"{path!r}: empty key before position {pos}")
            expect_key = True
        elif key is not None:
            if not expect_key:
                raise ValueError(f"{path!r}: a key must follow a dot (position {pos})")
            steps.append("*" if key == "*" else (int(key) if key.isdigit() else key))
            expect_key = False
        else:
            steps.append("*" if index == "*" else int(index))
            expect_key = False
        pos = m.end()
    if expect_key:
        raise ValueError(f"{path!r} ends with a dot")
    return tuple(steps)


def _walk(value: Any, steps: tuple[str | int, ...]) -> list[Any]:
    found = [value]
    for step in steps:
        nxt: list[Any] = []
        for v in found:
            if step == "*":
                if isinstance(v, list):
                    nxt.extend(v)
                elif isinstance(v, dict):
                    nxt.extend(v.values())
            elif isinstance(step, int):
                if isinstance(v, list) and -len(v) <= step < len(v):
                    nxt.append(v[step])
                elif isinstance(v, dict) and str(step) in v:
                    nxt.append(v[str(step)])
            elif isinstance(v, dict) and step in v:
                nxt.append(v[step])
        found = nxt
        if not found:
            break
    return found


class FieldRule(BaseModel):
    """One field: exactly one of ``css`` (parsel CSS, ``::text`` / ``::attr(x)`` allowed),
    ``xpath``, ``regex`` (RE2 syntax; group 1 if it has groups, else the match; run on the
    decoded body) or ``json`` (a path like ``data.items[0].name``). ``all: true`` gives every
    match as a list; otherwise the first, or ``null``."""

    model_config = ConfigDict(extra="forbid")

    css: str | None = None
    xpath: str | None = None
    regex: str | None = None
    json_path: str | None = Field(default=None, alias="json")
    all: bool = False

    @field_validator("css")
    @classmethod
    def _css(cls, value: str | None) -> str | None:
        if value is not None:
            _compile_css(value)
        return value

    @field_validator("xpath")
    @classmethod
    def _xpath(cls, value: str | None) -> str | None:
        if value is not None:
            _compile_xpath(value)
        return value

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            compile_user_regex(value)  # ValueError: RE2's reason, named by the caller
        return value

    @field_validator("json_path")
    @classmethod
    def _json(cls, value: str | None) -> str | None:
        if value is not None:
            compile_json_path(value)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> FieldRule:
        given = [k for k in ("css", "xpath", "regex", "json_path") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of css, xpath, regex, json"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self


#: Link paths ending in these are not followed (Scrapy's ``IGNORED_EXTENSIONS``, less
#: the ones that are pages): images, audio, video, office files, archives, binaries.
SKIP_EXTENSIONS = (
    "7z", "7zip", "apk", "avi", "bin", "bmp", "bz2", "cdr", "css", "deb", "dmg", "doc",
    "docx", "drw", "dxf", "eps", "exe", "flv", "gif", "gz", "ico", "img", "iso", "jar",
    "jpeg", "jpg", "js", "m4a", "m4v", "mkv", "mov", "mp3", "mp4", "mpeg", "mpg", "msi",
    "odg", "odp", "ods", "odt", "ogg", "pdf", "png", "ppt", "pptx", "ps", "psd", "rar",
    "rm", "rpm", "svg", "swf", "tar", "tgz", "tif", "tiff", "wav", "webm", "webp", "wma",
    "wmv", "woff", "woff2", "xls", "xlsx", "xz", "zip",
)


class LinkRules(BaseModel):
    """Config key ``extract.links``: ``follow`` turns link extraction on; ``same_domain``
    keeps links to the page's own host (and port); ``allow`` / ``deny`` are regexes searched
    in the absolute URL (a link must match one ``allow`` if any are given, and no ``deny``);
    no links are taken from a page at ``max_depth`` (seeds are depth 0); at most
    ``max_links`` per page (``null``: no cap); links whose path ends in one of
    ``skip_extensions`` (lower case, no dot) are not followed: binaries are not fetched."""

    model_config = ConfigDict(extra="forbid")

    follow: bool = False
    same_domain: bool = True
    allow: list[str] = []
    deny: list[str] = []
    max_depth: int | None = Field(default=None, ge=0)
    max_links: int | None = Field(default=10_000, ge=1)
    skip_extensions: list[str] = list(SKIP_EXTENSIONS)

    @field_validator("allow", "deny")
    @classmethod
    def _regexes(cls, value: list[str]) -> list[str]:
        for i, pattern in enumerate(value):
            try:
                compile_user_regex(pattern)
            except ValueError as exc:
                raise ValueError(f"entry {i}: {exc}") from None
        return value


class PageSignals(BaseModel):
    """Config key ``extract.page``: which of the page's own signals are honoured.

    ``canonical``: a ``<link rel=canonical>`` on the page's own host is its key hint
    (``Extracted.canonical``: the crawl writes the item under that URL, so copies of one
    page make one item); ``meta_robots``: ``<meta name=robots>`` and ``X-Robots-Tag``
    ``noindex`` (no item) and ``nofollow`` (no links; ``none`` is both); ``refresh``:
    ``<meta http-equiv=refresh content="0; url=...">`` is followed as a link. The page's
    ``<base href>`` is always honoured. ``types``: the Content-Types parsed as HTML (so is
    a body without one); other text (JSON, XML, plain text) gets its regex and
    JSON fields only, and a binary body (image, PDF, archive...) is not parsed at all."""

    model_config = ConfigDict(extra="forbid")

    canonical: bool = True
    meta_robots: bool = True
    refresh: bool = True
    types: list[str] = ["text/html", "application/xhtml+xml"]


class ExtractionConfig(BaseModel):
    """Config key ``extract``: ``fields`` (name -> FieldRule), ``links`` (LinkRules) and
    ``page`` (PageSignals)."""

    model_config = ConfigDict(extra="forbid")

    fields: dict[str, FieldRule] = {}
    links: LinkRules = LinkRules()
    #: render the pages of these rules in the browser: true, or how to wait for them
    #: (``{wait_until, wait_for}``); null leaves it to the task and the agent
    render: bool | RenderWait | None = None
    page: PageSignals = PageSignals()


# --- running ----------------------------------------------------------------------------

_A_HREF = re.compile(r"""<a\s[^>]*?\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
_BASE_HREF = re.compile(r"""<base\s[^>]*?\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title", re.I | re.S)
#: ``<meta ...>`` and ``<link ...>`` tags of the head, then their attributes
_HEAD_TAG = re.compile(r"<(meta|link)\s([^>]*)>", re.I)
_ATTR = re.compile(r"""([a-zA-Z_:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""")
_REFRESH_URL = re.compile(r"""^\s*[\d.]*\s*[;,]?\s*(?:url\s*=\s*)?["']?([^"']*)""", re.I)
#: the head's end, or this many characters when it has no ``</head>``
_HEAD_MAX = 65_536


@dataclass(slots=True)
class Extracted:
    """What travels back from a page: ``fields`` (name -> value), absolute ``links`` (in
    page order, unique, fragments dropped) and the page ``title`` (``None`` if it has none).
    The page's own signals: ``canonical`` (its ``<link rel=canonical>`` on its own host,
    when it names another URL), ``noindex`` (``<meta name=robots>`` or ``X-Robots-Tag``
    asks for no index: the crawl writes no item) and ``parsed`` (False: not HTML - a
    binary or another text type, whose title and links were not looked for)."""

    fields: dict[str, Any] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    title: str | None = None
    canonical: str | None = None
    noindex: bool = False
    parsed: bool = True


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def decode_body(body: bytes, content_type: str = "") -> str:
    """The body as text, its encoding from, in turn: a byte-order mark, the charset the
    Content-Type names, the page's ``<meta charset>`` (or ``http-equiv``, in its first
    4 KB), UTF-8 if the bytes are valid UTF-8, else charset-normalizer's guess (e.g. an
    undeclared GB18030, Shift_JIS or Windows-1251 page). Undecodable bytes become U+FFFD,
    never an error. Cost on a declared UTF-8 page: a few ``startswith`` and one decode."""
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body[len(bom):].decode(name, errors="replace")
    if "charset" in content_type:
        encoding = http_content_type_encoding(content_type)
        if encoding:
            try:
                return body.decode(encoding, errors="replace")
            except LookupError:
                pass
    declared = html_body_declared_encoding(body)
    if declared:
        try:
            return body.decode(declared, errors="replace")
        except LookupError:
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    guess = from_bytes(body[:65_536]).best()
    if guess is not None:
        try:
            return body.decode(guess.encoding, errors="replace")
        except LookupError:
            pass
    return body.decode("utf-8", errors="replace")


_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript",
               "application/ld+json")


def _kind(content_type: str, html_types: frozenset[str]) -> str:
    """``html``, ``text`` (regex / JSON fields only) or ``binary`` (nothing parsed)."""
    mime = content_type.split(";", 1)[0].strip().lower()
    if not mime:  # no Content-Type: read as HTML (as browsers mostly do)
        return "html"
    if mime in html_types:
        return "html"
    if mime.startswith(_TEXT_TYPES) or mime.endswith(("+xml", "+json")):
        return "text"
    return "binary"


def _attrs(text: str) -> dict[str, str]:
    return {m.group(1).lower(): html.unescape(m.group(2) if m.group(2) is not None else
                                              m.group(3) if m.group(3) is not None else
                                              m.group(4))
            for m in _ATTR.finditer(text)}


def robots_directives(value: str) -> set[str]:
    """``noindex`` / ``nofollow`` of a ``<meta name=robots>`` content or an
    ``X-Robots-Tag`` value (``none`` is both). Directives scoped to a named bot
    (``googlebot: noindex``) are left out: they are not addressed to crawlhub."""
    out: set[str] = set()
    for part in value.lower().split(","):
        part = part.strip()
        if ":" in part:
            bot, _, part = part.partition(":")
            if bot.strip() not in ("crawlhub", "*"):
                continue
            part = part.strip()
        if part == "none":
            out.update(("noindex", "nofollow"))
        elif part in ("noindex", "nofollow"):
            out.add(part)
    return out


class ExtractionRules:
    """Compiled extraction rules; build once per job, then ``extract`` every page.

    ``ExtractionRules.from_config({"fields": {...}, "links": {...}})`` validates and
    compiles; ``extract(body, url, depth=..., content_type=...)`` returns ``Extracted``.
    """

    def __init__(self, config: ExtractionConfig | None = None) -> None:
        self.config = config = config or ExtractionConfig()
        self._tree_fields: list[tuple[str, etree.XPath, bool]] = []
        self._regex_fields: list[tuple[str, FieldRegex, bool]] = []
        self._json_fields: list[tuple[str, tuple[str | int, ...], bool]] = []
        for name, rule in config.fields.items():
            if rule.css is not None:
                self._tree_fields.append((name, _compile_css(rule.css), rule.all))
            elif rule.xpath is not None:
                self._tree_fields.append((name, _compile_xpath(rule.xpath), rule.all))
            elif rule.regex is not None:
                self._regex_fields.append((name, FieldRegex(rule.regex), rule.all))
            elif rule.json_path is not None:
                self._json_fields.append((name, compile_json_path(rule.json_path), rule.all))
        links = config.links
        self.follow = links.follow
        self._same_domain = links.same_domain
        # one RE2 pattern per list (an alternation): one call per link, not one per entry
        self._allow = [_any_of(links.allow)] if links.allow else []
        self._deny = [_any_of(links.deny)] if links.deny else []
        self._max_depth = links.max_depth
        self._max_links = links.max_links
        self.render = config.render
        self._skip_ext = frozenset(e.lower().lstrip(".") for e in links.skip_extensions)
        page = config.page
        self._canonical = page.canonical
        self._meta_robots = page.meta_robots
        self._refresh = page.refresh
        self._html_types = frozenset(t.lower() for t in page.types)

    @classmethod
    def from_config(
        cls, data: Mapping[str, Any] | None, *, file: str | None = None, key: str = "extract"
    ) -> ExtractionRules:
        """Validate and compile an ``extract`` mapping; a bad selector, regex or path is a
        ``ConfigError`` naming its key, e.g. ``extract.fields.price.css``."""
        try:
            return cls(ExtractionConfig.model_validate(dict(data or {})))
        except ValidationError as exc:
            raise config_error(exc, file=file, prefix=key) from None

    def extract(
        self, body: bytes, url: str, *, depth: int = 0, content_type: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> Extracted:
        """Fields, links, title and the page's own signals of one page. ``url`` is the
        final URL (after redirects) that relative links resolve against; ``depth`` is the
        task's depth (links are not taken at ``max_depth``); ``headers`` the response's
        (``X-Robots-Tag``). A body whose Content-Type is not text is not parsed
        (``parsed`` False); text that is not HTML gets its regex and JSON fields, no
        title or links. Raises ``ParseError`` when a JSON field meets a body that is not
        JSON or the HTML cannot be parsed at all."""
        out = Extracted()
        kind = _kind(content_type, self._html_types)
        if kind == "binary":
            out.parsed = False
            return out
        text = decode_body(body, content_type)
        nofollow = False
        refresh: str | None = None
        if kind == "html":
            title_match = _TITLE.search(text)
            if title_match is not None:
                title = title_match.group(1)
                if "&" in title:
                    title = html.unescape(title)
                if "\x00" in title:
                    title = title.replace("\x00", "")
                out.title = " ".join(title.split())
            if self._canonical or self._meta_robots or self._refresh:
                refresh, nofollow = self._head(text, url, out)
        else:
            out.parsed = False
        if self._meta_robots and headers:
            tag = headers.get("X-Robots-Tag")
            if tag:
                said = robots_directives(tag)
                out.noindex = out.noindex or "noindex" in said
                nofollow = nofollow or "nofollow" in said
        fields = out.fields
        if self._tree_fields:
            root = self._root(text, url)
            for name, xpath, every in self._tree_fields:
                result = xpath(root)
                if not isinstance(result, list):  # count(), string(), boolean()...
                    fields[name] = [result] if every else result
                    continue
                values = [_to_text(v) for v in result]
                fields[name] = values if every else (values[0] if values else None)
        for name, pattern, every in self._regex_fields:
            fields[name] = pattern.every(text) if every else pattern.first(text)
        if self._json_fields:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise ParseError(f"{url}: the body is not JSON ({exc}); the extraction rules "
                                 "have JSON fields") from None
            for name, steps, every in self._json_fields:
                found = _walk(doc, steps)
                fields[name] = found if every else (found[0] if found else None)
        if self.follow and kind == "html" and not nofollow:
            out.links = self.links(text, url, depth)
            if refresh is not None and (self._max_depth is None or depth < self._max_depth) \
                    and self.admits(refresh, url) and refresh not in out.links:
                out.links.insert(0, refresh)
        return out

    def _head(self, text: str, url: str, out: Extracted) -> tuple[str | None, bool]:
        """Read the head's ``<link rel=canonical>``, ``<meta name=robots>``, ``<meta
        http-equiv=refresh>`` and ``<base href>`` into ``out``; the refresh target (an
        absolute URL) and whether the page says ``nofollow``. One regex scan of the head."""
        end = text.find("</head>")
        if end < 0:
            end = text.find("</HEAD>")
        if end < 0:
            end = _HEAD_MAX
        head = text[:end]
        refresh_to: str | None = None
        canonical: str | None = None
        nofollow = False
        base = url
        for m in _HEAD_TAG.finditer(head):
            inner = m.group(2)
            low = inner.lower()
            if m.group(1).lower() == "link":
                if self._canonical and "canonical" in low:
                    attrs = _attrs(inner)
                    if "canonical" in attrs.get("rel", "").lower().split() and attrs.get("href"):
                        canonical = attrs["href"].strip()
            elif self._meta_robots and "robots" in low:
                attrs = _attrs(inner)
                if attrs.get("name", "").lower() in ("robots", "crawlhub"):
                    said = robots_directives(attrs.get("content", ""))
                    out.noindex = out.noindex or "noindex" in said
                    nofollow = nofollow or "nofollow" in said
            elif self._refresh and "refresh" in low:
                attrs = _attrs(inner)
                if attrs.get("http-equiv", "").lower() == "refresh":
                    found = _REFRESH_URL.match(attrs.get("content", ""))
                    if found is not None and found.group(1).strip():
                        refresh_to = found.group(1).strip()
        if (canonical or refresh_to) and ("<base" in head or "<BASE" in head):
            found_base = _BASE_HREF.search(head)
            if found_base is not None:
                href = found_base.group(1) or found_base.group(2) or found_base.group(3)
                base = urljoin(url, html.unescape(href.strip()))
        if canonical:
            target = urljoin(base, canonical).split("#", 1)[0]
            if target != url and _same_host(target, url):
                out.canonical = target
        refresh: str | None = None
        if refresh_to:
            target = urljoin(base, refresh_to).split("#", 1)[0]
            if target.startswith(("http://", "https://")) and target != url:
                refresh = target
        return refresh, nofollow

    def admits(self, link: str, page_url: str | None = None) -> bool:
        """Whether the link rules take the absolute URL ``link`` (found on ``page_url``,
        when given: the same-domain rule then applies): include / exclude patterns and
        skipped extensions. A sitemap's URLs go through it."""
        if page_url is not None and self._same_domain and not _same_host(link, page_url,
                                                                         port=True):
            return False
        if self._skip_ext and _extension(link) in self._skip_ext:
            return False
        if self._allow and not any(search(link) for search in self._allow):
            return False
        return not (self._deny and any(search(link) for search in self._deny))

    @staticmethod
    def _root(text: str, url: str) -> Any:
        from parsel import Selector

        try:
            return Selector(text=text or "<html></html>", base_url=url).root
        except Exception as exc:
            raise ParseError(f"{url}: the page cannot be parsed as HTML ({exc!r:.200})") from None

    def links(self, text: str, url: str, depth: int = 0) -> list[str]:
        """The page's ``<a href>`` links as absolute URLs, filtered by the link rules.

        Cost: one regex scan of the page, then per link a few string operations (urljoin
        only for paths that are not absolute or root-relative) and the allow/deny searches.
        """
        if self._max_depth is not None and depth >= self._max_depth:
            return []
        if "<!--" in text:
            text = _COMMENT.sub("", text)
        base = url
        if "<base" in text or "<BASE" in text:
            m = _BASE_HREF.search(text)
            if m is not None:
                base = urljoin(url, html.unescape((m.group(1) or m.group(2) or m.group(3)).strip()))
        scheme_end = base.find("://")
        if scheme_end < 0:
            return []
        scheme = base[:scheme_end]
        host_end = _host_end(base, scheme_end + 3)
        origin = base[:host_end]
        host = base[scheme_end + 3:host_end].lower()
        # the base's directory, for the relative paths resolved without urljoin
        path_end = len(base)
        for ch in "?#":
            i = base.find(ch, host_end)
            if 0 <= i < path_end:
                path_end = i
        base_dir = base[:base.rfind("/", host_end, path_end) + 1] or origin + "/"
        same = self._same_domain
        allow = self._allow
        deny = self._deny
        found: dict[str, None] = {}
        cap = self._max_links
        skip = self._skip_ext
        for m in _A_HREF.finditer(text):
            href = m.group(1) or m.group(2) or m.group(3)
            if not href:
                continue
            if "&" in href:
                href = html.unescape(href)
            href = href.strip()
            hash_at = href.find("#")
            if hash_at >= 0:
                href = href[:hash_at]
                if not href:
                    continue
            if href[0] == "/":
                if href.startswith("//"):
                    link = f"{scheme}:{href}"
                else:
                    link = origin + href
                    if skip and _extension(link) in skip:
                        continue
                    if not (allow or deny):
                        found[link] = None
                        if cap is not None and len(found) >= cap:
                            break
                        continue
            elif href.startswith(("http://", "https://")):
                link = href
            else:
                head = href.split("/", 1)[0]
                if ":" in head:
                    scheme_of = head.lower()
                    if scheme_of not in ("http:", "https:"):
                        continue  # mailto:, javascript:, tel:, data:, ftp:...
                    link = scheme_of + href[len(head):]
                else:
                    relative = _relative(base_dir, len(origin), href)
                    if relative is None:
                        link = urljoin(base, href)
                    else:  # on the base's own host, as a root-relative link
                        if skip and _extension(relative) in skip:
                            continue
                        if not (allow or deny):
                            found[relative] = None
                            if cap is not None and len(found) >= cap:
                                break
                            continue
                        link = relative
            if same:
                start = link.find("://") + 3
                if link[start:_host_end(link, start)].lower() != host:
                    continue
            if skip and _extension(link) in skip:
                continue
            if allow and not any(search(link) for search in allow):
                continue
            if deny and any(search(link) for search in deny):
                continue
            found[link] = None
            if cap is not None and len(found) >= cap:
                break
        return list(found)


#: Distinct inline rule sets an agent keeps compiled (the least recently used go first).
INLINE_RULE_SETS = 256


class RuleSets:
    """The extraction rules of one agent: which rules a task's page is run through.

    A task's ``extract`` key chooses: absent (or ``null``) - ``default``; a string - the
    set of that name in ``named`` (an ``--extract`` file's ``rules: {name: {fields,
    links}}``); a mapping - inline rules in the ``extract`` schema, compiled the first time
    that set is seen and kept, keyed by its canonical JSON, in an LRU of ``cache_size``
    sets (invalid ones too, so a stream of tasks with one bad set is validated once).

    Cost per task: none without ``extract``; a dict lookup for a name; one canonical JSON
    dump (~1 us for a few fields) and a dict lookup for an inline set already compiled.
    """

    def __init__(self, default: ExtractionRules | None = None,
                 named: Mapping[str, ExtractionRules] | None = None, *,
                 cache_size: int = INLINE_RULE_SETS) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, not {cache_size!r}")
        self.default = default or ExtractionRules()
        self.named = dict(named or {})
        self.cache_size = cache_size
        self._inline: OrderedDict[bytes, ExtractionRules | ConfigError] = OrderedDict()

    @classmethod
    def from_config(
        cls, data: Mapping[str, Any] | None, *, file: str | None = None, key: str = "extract"
    ) -> RuleSets:
        """From an ``--extract`` mapping: ``fields`` / ``links`` are the default rules,
        ``rules`` maps names to more sets of the same schema. A bad entry is a
        ``ConfigError`` naming its key, e.g. ``extract.rules.product.fields.price.css``."""
        data = dict(data or {})
        named = data.pop("rules", None) or {}
        if not isinstance(named, Mapping):
            raise ConfigError("expected a mapping of names to rule sets, e.g. {product:"
                              " {fields: {...}}}", file=file, key=f"{key}.rules")
        sets: dict[str, ExtractionRules] = {}
        for name, spec in named.items():
            where = f"{key}.rules.{name}"
            if not isinstance(spec, Mapping):
                raise ConfigError("expected a mapping with 'fields' and/or 'links'", file=file,
                                  key=where)
            sets[str(name)] = ExtractionRules.from_config(spec, file=file, key=where)
        return cls(ExtractionRules.from_config(data, file=file, key=key), sets)

    def for_task(self, spec: Any) -> ExtractionRules:
        """The rules for a task whose ``extract`` key holds ``spec``. Raises
        ``ConfigError`` naming the key (``extract``, ``extract.fields.price.css``...)
        for an unknown name or invalid inline rules."""
        if spec is None:
            return self.default
        if isinstance(spec, str):
            rules = self.named.get(spec)
            if rules is None:
                known = ", ".join(sorted(self.named)) or "none"
                raise ConfigError(f"no rule set named {spec!r} (this agent has: {known}; name"
                                  " them under 'rules:' in its --extract file)", key="extract")
            return rules
        if not isinstance(spec, Mapping):
            raise ConfigError(f"expected the name of a rule set or a mapping with 'fields'"
                              f" and/or 'links', not {type(spec).__name__}", key="extract")
        try:
            canonical = orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:
            raise ConfigError(f"the rules cannot be written as JSON ({exc})",
                              key="extract") from None
        cache = self._inline
        found = cache.get(canonical)
        if found is None:
            try:
                found = ExtractionRules.from_config(spec)
            except ConfigError as exc:
                found = exc
            cache[canonical] = found
            if len(cache) > self.cache_size:
                cache.popitem(last=False)
        else:
            cache.move_to_end(canonical)
        if isinstance(found, ConfigError):
            # a new exception each time: re-raising one object would grow its traceback
            raise ConfigError(found.reason, key=found.key)
        return found


def _host_end(url: str, start: int) -> int:
    end = len(url)
    for ch in "/?#":
        i = url.find(ch, start)
        if 0 <= i < end:
            end = i
    return end


def _relative(base_dir: str, root: int, href: str) -> str | None:
    """``href`` (a relative path: no scheme, not ``/``-rooted) resolved against the
    directory ``base_dir`` (absolute, ending in ``/``; its path starts at ``root``), or
    None for what only ``urljoin`` gets right (a query or ``.`` segment of its own).
    Sphinx-style ``page.html`` / ``../dir/page.html`` links are ~10x cheaper so."""
    if href[0] == "?" or href[0] == ".":
        up = 0
        while href.startswith("../"):
            href = href[3:]
            up += 1
        if href.startswith(("./", "?", ".")) or not up:
            return None
        for _ in range(up):
            cut = base_dir.rfind("/", root, len(base_dir) - 1)
            if cut < root:
                break
            base_dir = base_dir[:cut + 1]
    if "/." in href or not href:
        return None
    return base_dir + href


def _extension(url: str) -> str:
    """The lower-case extension of ``url``'s last path segment ("" when it has none;
    ``url`` has no fragment)."""
    q = url.find("?")
    path = url if q < 0 else url[:q]
    dot = path.rfind(".")
    if dot < 0 or path.find("/", dot) >= 0:
        return ""
    return path[dot + 1:].lower()


def _same_host(a: str, b: str, *, port: bool = False) -> bool:
    """Whether two absolute http(s) URLs are on one host (and port, with ``port``)."""
    if not a.startswith(("http://", "https://")):
        return False
    sa, sb = a.find("://") + 3, b.find("://") + 3
    ha, hb = a[sa:_host_end(a, sa)].lower(), b[sb:_host_end(b, sb)].lower()
    if port:
        return ha == hb
    return _no_port(ha) == _no_port(hb)


def _no_port(host: str) -> str:
    return host if host.endswith("]") else host.rsplit(":", 1)[0]


def _to_text(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, etree._Element):
        return etree.tostring(value, method="html", encoding="unicode", with_tail=False)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value  # numbers and booleans of XPath functions like count()


__all__ = [
    "Extracted",
    "ExtractionConfig",
    "ExtractionRules",
    "FieldRule",
    "LinkRules",
    "PageSignals",
    "ParseError",
    "RuleSets",
    "compile_json_path",
    "decode_body",
    "robots_directives",
]
