"""The demo's shop to crawl: categories, paginated listings and item pages with prices.

A fixed graph (5 categories x 24 items, 10 per listing page) with what real sites have:
links that differ only by ``utm_*`` parameters or a fragment, a robots.txt that
disallows ``/private/``, and a few dead links that answer 404.

Under ``/js/``, a shop whose pages are empty shells until JavaScript runs (``--render``):
``/js/p/{n}`` (``js_pages`` of them, ``/js/`` is page 0) each load ``/js/app.js``, which
writes the title, the heading, an image and the links to pages ``10n+1..10n+10`` (every
page is reachable from ``/js/``), then, 20 ms later, the price, and marks the page
``#app[data-ready]``. A crawler that does not run scripts finds no link and no price.
"""

from __future__ import annotations

import email.utils
import hashlib
import time
from html import escape
from typing import Any

from aiohttp import web

CATEGORIES = ("books", "music", "garden", "tools", "toys")
PER_CATEGORY = 24
PAGE_SIZE = 10
ITEMS = len(CATEGORIES) * PER_CATEGORY
PAGES = -(-PER_CATEGORY // PAGE_SIZE)  # listing pages per category
_ADJECTIVES = ("Sturdy", "Tiny", "Classic", "Bright", "Quiet", "Handy", "Vintage", "Smart")
_NOUNS = {"books": "Novel", "music": "Album", "garden": "Planter", "tools": "Wrench",
          "toys": "Kite"}

ROBOTS = """User-agent: *
Disallow: /private/
Allow: /

Sitemap: {base}/urls.txt
"""


def category_of(item_id: int) -> str:
    return CATEGORIES[(item_id - 1) // PER_CATEGORY]


def title(item_id: int) -> str:
    return f"{_ADJECTIVES[item_id % len(_ADJECTIVES)]} {_NOUNS[category_of(item_id)]} {item_id}"


def price(item_id: int) -> str:
    return f"{1 + (item_id * 7919) % 9900 / 100:.2f}"


#: Pages of the JavaScript shop under ``/js/`` (``crawlhub demo --js-pages``).
JS_PAGES = 1000
JS_KEY = web.AppKey("js_pages", int)


def add_routes(app: web.Application, *, js_pages: int = JS_PAGES) -> None:
    app[JS_KEY] = js_pages
    app.router.add_get("/js/", js_page)
    app.router.add_get("/js/p/{n}", js_page)
    app.router.add_get("/js/app.js", js_script)
    app.router.add_get("/js/img/{name}", js_image)
    app.router.add_get("/", home)
    app.router.add_get("/robots.txt", robots)
    app.router.add_get("/urls.txt", urls)
    app.router.add_get("/category/{slug}", category)
    app.router.add_get("/item/{id}", item)
    app.router.add_get("/private/{tail:.*}", private)
    app.middlewares.append(conditional)


def _page(heading: str, body: str, status: int = 200) -> web.Response:
    html = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{escape(heading)}"
            f" - crawlhub demo shop</title></head>\n<body>\n<h1 class=\"title\">"
            f"{escape(heading)}</h1>\n{body}\n</body></html>\n")
    return web.Response(text=html, content_type="text/html", status=status)


def _link(href: str, text: str, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f'<a{attr} href="{escape(href)}">{escape(text)}</a>'


async def home(request: web.Request) -> web.Response:
    cats = "\n".join(f"<li>{_link(f'/category/{c}', c.title(), 'category')}</li>"
                     for c in CATEGORIES)
    featured = "\n".join([
        f"<li>{_link('/item/1', title(1), 'item')}</li>",
        # the same page again, as marketing links and anchors make it appear
        f"<li>{_link('/item/1?utm_source=home&utm_medium=banner', title(1), 'item')}</li>",
        f"<li>{_link('/item/1#reviews', 'Reviews of ' + title(1), 'item')}</li>",
        f"<li>{_link('/category/books?page=1', 'Books, page 1', 'category')}</li>",
        f"<li>{_link('/private/basket', 'Your basket')}</li>",
        f"<li>{_link('/old-sale', 'Last year' + chr(39) + 's sale')}</li>",  # 404
    ])
    return _page("crawlhub demo shop",
                 f"<ul class=\"categories\">\n{cats}\n</ul>\n"
                 f"<h2>Featured</h2>\n<ul class=\"featured\">\n{featured}\n</ul>")


async def robots(request: web.Request) -> web.Response:
    return web.Response(text=ROBOTS.format(base=_base(request)), content_type="text/plain")


async def urls(request: web.Request) -> web.Response:
    """Start URLs, one a line, for ``crawlhub frontier add``: every listing and item page,
    plus the duplicate forms a real crawl meets (``utm_*``, fragments, default port)."""
    base = _base(request)
    lines = [f"{base}/"]
    for c in CATEGORIES:
        lines += [f"{base}/category/{c}?page={p}" for p in range(1, PAGES + 1)]
    lines += [f"{base}/item/{n}" for n in range(1, ITEMS + 1)]
    lines += [f"{base}/item/{n}?utm_source=newsletter&utm_campaign=spring"
              for n in range(1, 11)]
    lines += [f"{base}/item/{n}#reviews" for n in range(1, 6)]
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


async def category(request: web.Request) -> web.Response:
    slug = request.match_info["slug"]
    raw = request.query.get("page", "1")
    number = int(raw) if raw.isdigit() and len(raw) < 6 else 0
    if slug not in CATEGORIES or not 1 <= number <= PAGES:
        return _not_found(request)
    first = CATEGORIES.index(slug) * PER_CATEGORY + (number - 1) * PAGE_SIZE + 1
    last = min(first + PAGE_SIZE, (CATEGORIES.index(slug) + 1) * PER_CATEGORY + 1)
    rows = []
    for n in range(first, last):
        href = f"/item/{n}" if n % 3 else f"/item/{n}?utm_source=listing&utm_medium=grid"
        rows.append(f"<li class=\"product\">{_link(href, title(n), 'item')} "
                    f"<span class=\"price\" data-currency=\"EUR\">{price(n)}</span></li>")
    nav = []
    if number > 1:
        nav.append(_link(f"/category/{slug}?page={number - 1}", "previous", "prev"))
    if number < PAGES:
        nav.append(_link(f"/category/{slug}?page={number + 1}", "next", "next"))
    nav.append(_link(f"/category/{slug}#top", "back to top"))
    return _page(f"{slug.title()} - page {number}",
                 "<ul class=\"products\">\n" + "\n".join(rows) + "\n</ul>\n"
                 f"<nav>{' | '.join(nav)}</nav>\n<p>{_link('/', 'home')}</p>")


async def item(request: web.Request) -> web.Response:
    raw = request.match_info["id"]
    n = int(raw) if raw.isdigit() and len(raw) < 6 else 0
    if not 1 <= n <= ITEMS:
        return _not_found(request)
    cat = category_of(n)
    related = [m for m in (n - 1, n + 1) if m >= 1 and m <= ITEMS and category_of(m) == cat]
    links = [_link(f"/item/{m}", title(m), "related") for m in related]
    links.append(_link(f"/item/{n}#reviews", "reviews"))
    links.append(_link(f"/item/{n}?utm_source=share&utm_medium=email", "share"))
    if n % 10 == 0:
        links.append(_link(f"/item/{n + 1000}", "discontinued model"))  # answers 404
    return _page(title(n),
                 f"<p class=\"price\" data-currency=\"EUR\">{price(n)}</p>\n"
                 f"<p class=\"category\">{_link(f'/category/{cat}', cat.title(), 'category')}"
                 f"</p>\n<p class=\"description\">{title(n)}: item {n} of the {cat} shelf.</p>\n"
                 f"<div id=\"reviews\"><ul>\n"
                 + "\n".join(f"<li>{link}</li>" for link in links) + "\n</ul></div>")


async def private(request: web.Request) -> web.Response:
    return _page("Private", "<p>robots.txt disallows this page; a polite crawler never "
                 "fetches it.</p>")


def _not_found(request: web.Request) -> web.Response:
    return _page("Not found", f"<p>No page at {escape(request.path_qs)}.</p>", status=404)


def _base(request: web.Request) -> str:
    return str(request.url.origin())


# --- the JavaScript shop ---------------------------------------------------------------

_JS_SHELL = """<!doctype html>
<html><head><meta charset="utf-8"><title>Loading...</title>
<script src="/js/app.js" defer></script></head>
<body><div id="app" data-page="{n}" data-pages="{total}"></div>
<noscript>This page is written by JavaScript: render it (crawlhub crawl --render).</noscript>
</body></html>
"""

#: Writes the page from its number: everything a crawler wants exists only after it ran.
JS_APP = """(function () {
  var app = document.getElementById("app");
  var n = parseInt(app.dataset.page, 10), total = parseInt(app.dataset.pages, 10);
  var adjectives = %(adjectives)s;
  var name = adjectives[n %% adjectives.length] + " Gadget " + n;
  document.title = name + " - crawlhub demo JS shop";
  var h1 = document.createElement("h1");
  h1.className = "title";
  h1.textContent = name;
  app.appendChild(h1);
  var img = document.createElement("img");
  img.src = "/js/img/" + n + ".png";
  img.alt = name;
  app.appendChild(img);
  var list = document.createElement("ul");
  list.className = "products";
  for (var k = 10 * n + 1; k <= 10 * n + 10 && k < total; k++) {
    var li = document.createElement("li"), a = document.createElement("a");
    a.href = "/js/p/" + k;
    a.className = "item";
    a.textContent = adjectives[k %% adjectives.length] + " Gadget " + k;
    li.appendChild(a);
    list.appendChild(li);
  }
  if (n > 0) {
    var li = document.createElement("li"), a = document.createElement("a");
    a.href = "/js/p/" + Math.floor((n - 1) / 10);
    a.textContent = "up";
    li.appendChild(a);
    list.appendChild(li);
  }
  app.appendChild(list);
  setTimeout(function () {  /* as if from an API call: after the load event */
    var p = document.createElement("p");
    p.className = "price";
    p.textContent = (1 + (n * 7919) %% 9900 / 100).toFixed(2);
    app.appendChild(p);
    app.setAttribute("data-ready", "1");
  }, 20);
})();
"""

#: A 1x1 transparent PNG: the JavaScript shop's images.
_PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
                     "0000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082")


def js_title(n: int) -> str:
    """The title the JavaScript shop's page ``n`` has once rendered."""
    return f"{_ADJECTIVES[n % len(_ADJECTIVES)]} Gadget {n} - crawlhub demo JS shop"


def js_price(n: int) -> str:
    return f"{1 + (n * 7919) % 9900 / 100:.2f}"


async def js_page(request: web.Request) -> web.Response:
    total = request.app[JS_KEY]
    raw = request.match_info.get("n", "0")
    n = int(raw) if raw.isdigit() and len(raw) < 9 else -1
    if not 0 <= n < total:
        return _not_found(request)
    return web.Response(text=_JS_SHELL.format(n=n, total=total), content_type="text/html")


async def js_script(request: web.Request) -> web.Response:
    adjectives = "[" + ", ".join(f'"{a}"' for a in _ADJECTIVES) + "]"
    return web.Response(text=JS_APP % {"adjectives": adjectives},
                        content_type="application/javascript")


async def js_image(request: web.Request) -> web.Response:
    return web.Response(body=_PNG, content_type="image/png")


#: When the demo's pages last changed (they never do while it runs): its Last-Modified.
_SINCE = email.utils.formatdate(time.time(), usegmt=True)


@web.middleware
async def conditional(request: web.Request, handler: Any) -> web.StreamResponse:
    """ETag (a hash of the page) and Last-Modified on every HTML page, and 304 Not
    Modified to a request whose If-None-Match names it: ``crawlhub crawl --recrawl``
    downloads nothing of an unchanged page."""
    response = await handler(request)
    if (request.method != "GET" or response.status != 200
            or not isinstance(response, web.Response) or response.content_type != "text/html"
            or response.body is None or not isinstance(response.body, bytes)):
        return response  # type: ignore[no-any-return]
    etag = '"' + hashlib.blake2b(response.body, digest_size=8).hexdigest() + '"'
    headers = {"ETag": etag, "Last-Modified": _SINCE, "Cache-Control": "no-cache"}
    if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        return web.Response(status=304, headers=headers)
    response.headers.update(headers)
    return response  # type: ignore[no-any-return]
