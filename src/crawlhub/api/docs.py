"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) served from assets inside the package, so
the API docs render on a machine with no internet; the assets live under ``/static/``.

Vendored (see ``web/static/README.md``): swagger-ui-dist (Apache-2.0) and ReDoc (MIT).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: The package's static files (web page and API docs assets).
STATIC_DIR = Path(__file__).resolve().parent.parent / "web" / "static"
STATIC_URL = "/static"

SWAGGER_JS = f"{STATIC_URL}/swagger-ui/swagger-ui-bundle.js"
SWAGGER_CSS = f"{STATIC_URL}/swagger-ui/swagger-ui.css"
SWAGGER_FAVICON = f"{STATIC_URL}/swagger-ui/favicon-32x32.png"
REDOC_JS = f"{STATIC_URL}/redoc/redoc.standalone.js"

#: The docs pages may load nothing from elsewhere (ReDoc's footer logo would come from
#: its CDN): inline script and style are the pages' own, workers and images may be blobs.
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self'"
       " 'unsafe-inline'; img-src 'self' data: blob:; font-src 'self' data:;"
       " connect-src 'self'; worker-src 'self' blob:; frame-ancestors 'self'")

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"


def install(app: FastAPI) -> None:
    """Mount ``/static`` and add the two docs pages (create the app with ``docs_url=None,
    redoc_url=None`` so FastAPI's CDN pages are not there as well)."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static")
    title = f"{app.title} API"
    openapi_url = app.openapi_url or "/openapi.json"

    async def swagger_ui() -> HTMLResponse:
        # validatorUrl: None keeps Swagger UI from sending the document to a validator.
        return _local_only(get_swagger_ui_html(
            openapi_url=openapi_url, title=title, swagger_js_url=SWAGGER_JS,
            swagger_css_url=SWAGGER_CSS, swagger_favicon_url=SWAGGER_FAVICON,
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            swagger_ui_parameters={"validatorUrl": None}))

    async def oauth2_redirect() -> HTMLResponse:
        return _local_only(get_swagger_ui_oauth2_redirect_html())

    async def redoc() -> HTMLResponse:
        return _local_only(get_redoc_html(
            openapi_url=openapi_url, title=title, redoc_js_url=REDOC_JS,
            redoc_favicon_url=SWAGGER_FAVICON, with_google_fonts=False))

    app.add_api_route(DOCS_URL, swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route(OAUTH2_REDIRECT_URL, oauth2_redirect, methods=["GET"],
                      include_in_schema=False)
    app.add_api_route(REDOC_URL, redoc, methods=["GET"], include_in_schema=False)


def _local_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CSP
    return page
