"""/docs and /redoc load their assets from the package, never from a CDN: every URL in
their HTML is local and serves 200 with the right content type (public with a token)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crawlhub.api.docs import STATIC_DIR
from tests.api.conftest import MakeApi

#: src= / href= / spec-url= attributes and ``url: '...'`` in the page's script.
URL_RE = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|\burl\s*:\s*["']([^"']+)["']""")

EXPECTED_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png",
                  ".json": "application/json"}


def referenced_urls(html: str) -> list[str]:
    return [a or b for a, b in URL_RE.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_docs_pages_reference_only_local_assets_that_are_served(
        make_api: MakeApi, page: str) -> None:
    api = await make_api(server={"token": "t0ken-docs-3b1f9a"})  # docs and their assets stay public
    r = await api.client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    # Whatever a vendored script might try (ReDoc's footer logo is on its CDN), the
    # browser is told to load nothing from elsewhere.
    assert "default-src 'self'" in r.headers["content-security-policy"]
    html = r.text
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    urls = referenced_urls(html)
    assert any(u.endswith(".js") for u in urls) and "/openapi.json" in urls, urls
    for url in urls:
        assert url.startswith("/"), url
        asset = await api.client.get(url)
        assert asset.status_code == 200, url
        suffix = Path(url).suffix
        expected = EXPECTED_TYPES.get(suffix, "")
        assert expected in asset.headers["content-type"], (url, asset.headers["content-type"])
        assert len(asset.content) > 0


async def test_the_vendored_scripts_load_nothing_from_the_internet_at_start(
        make_api: MakeApi) -> None:
    api = await make_api()
    html = (await api.client.get("/docs")).text
    assert '"validatorUrl": null' in html  # no spec sent to validator.swagger.io
    redoc = (await api.client.get("/redoc")).text
    assert "fonts.googleapis.com" not in redoc


def test_vendored_assets_carry_their_licenses() -> None:
    assert "Apache License" in (STATIC_DIR / "swagger-ui" / "LICENSE").read_text()
    assert "MIT License" in (STATIC_DIR / "redoc" / "LICENSE").read_text()
