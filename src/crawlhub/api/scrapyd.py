"""Scrapyd's JSON API, as ``scrapyd/webservice.py`` answers it, over crawlhub's control
plane (:class:`crawlhub.control.scrapyd.ScrapydService`): ``scrapyd-deploy``,
python-scrapyd-api, ScrapydWeb and Gerapy work unchanged against ``scrapyd.port``.

Every answer is Scrapyd's: ``{"node_name": ..., "status": "ok", ...}``, or
``{"node_name": ..., "status": "error", "message": ...}`` (HTTP 200, as Scrapyd's). Its
parameters come from the query string and the form body alike (Scrapyd's ``txrequest.args``).

Who may talk to it, the rest of the server's rules (docs/security.md):

- the ``Host`` and ``Origin`` rules of :class:`crawlhub.api.guard.RequestGuard` (DNS
  rebinding, cross-site requests), but for form bodies, which Scrapyd's clients send;
- with ``server.token`` set, the token as HTTP basic auth's password (scrapyd-deploy's
  ``username``/``password`` in scrapy.cfg, python-scrapyd-api's ``auth=``; any user
  name) or as a bearer token; wrong ones counted by the server's
  :class:`crawlhub.api.throttle.Throttle`. The challenge is not ``Basic``: a browser
  never asks for the token nor keeps it for other sites' forms to ride on.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from crawlhub.api.body import BodyGuard
from crawlhub.api.guard import Hosts, RequestGuard
from crawlhub.api.throttle import Throttle, client_of
from crawlhub.control.scrapyd import ScrapydError, ScrapydJob, ScrapydService, scrapyd_time
from crawlhub.core.errors import CrawlhubError, NotFoundError

log = logging.getLogger("crawlhub.api.scrapyd")

#: Where the service comes from: the serving app's, once it started (None before).
ServiceSource = Callable[[], ScrapydService | None]


class Params:
    """A request's parameters, query string and form body together, taken one by one as
    Scrapyd's ``@param`` takes them: what is left are a schedule's spider arguments."""

    def __init__(self, items: list[tuple[str, Any]]) -> None:
        self.items = items

    def take(self, name: str, *, required: bool = True, multiple: bool = False
             ) -> Any:
        values = [value for key, value in self.items if key == name]
        self.items = [(key, value) for key, value in self.items if key != name]
        if not values:
            if required:
                raise ScrapydError(f"'{name}' parameter is required")
            return [] if multiple else None
        if multiple:
            return [_text(v) for v in values]
        return values[0] if isinstance(values[0], UploadFile) else _text(values[0])

    def rest(self) -> dict[str, str]:
        """The parameters not taken, the first value of each."""
        out: dict[str, str] = {}
        for key, value in self.items:
            out.setdefault(key, _text(value))
        return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(getattr(value, "filename", "") or "")


Handler = Callable[[ScrapydService, Params, Request], Awaitable[dict[str, Any]]]


async def daemon_status(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    return dict(await svc.counts())


async def schedule(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    project, spider = p.take("project"), p.take("spider")
    version = p.take("_version", required=False)
    jobid = p.take("jobid", required=False)
    raw_priority = p.take("priority", required=False)
    try:
        priority = float(raw_priority) if raw_priority is not None else 0.0
    except ValueError as exc:
        raise ScrapydError(f"priority is invalid: {exc}") from None
    settings: dict[str, str] = {}
    for item in p.take("setting", required=False, multiple=True):
        key, sep, value = item.partition("=")
        if not sep:
            raise ScrapydError(f"setting {item[:80]!r} is not NAME=VALUE")
        settings[key] = value
    jobid = await svc.schedule(project, spider, version=version or None, jobid=jobid,
                               priority=priority, settings=settings, args=p.rest())
    return {"jobid": jobid}


async def cancel(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    project, job = p.take("project"), p.take("job")
    p.take("signal", required=False)  # crawlhub stops a run its own way (docs/scrapyd.md)
    return {"prevstate": await svc.cancel(project, job)}


async def add_version(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    project, version, egg = p.take("project"), p.take("version"), p.take("egg")
    data = await egg.read() if isinstance(egg, UploadFile) else str(egg).encode()
    spiders = await svc.add_version(project, version, data)
    return {"project": project, "version": version, "spiders": spiders}


async def list_projects(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    return {"projects": await svc.list_projects()}


async def list_versions(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    return {"versions": await svc.list_versions(p.take("project"))}


async def list_spiders(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    project = p.take("project")
    version = p.take("_version", required=False)
    return {"spiders": await svc.list_spiders(project, version or None)}


async def status(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    job = p.take("job")
    project = p.take("project", required=False)
    return {"currstate": await svc.status(job, project)}


async def list_jobs(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    jobs = await svc.list_jobs(p.take("project", required=False))

    def urls(job: ScrapydJob) -> dict[str, Any]:
        path = f"{job.project}/{job.spider}/{job.jobid}"
        items = f"/items/{path}.jl" if svc.items_dir is not None else None
        return {"log_url": f"/logs/{path}.log", "items_url": items}

    return {
        "pending": [{"id": j.jobid, "project": j.project, "spider": j.spider,
                     "version": j.version, "settings": j.settings, "args": j.args}
                    for j in jobs["pending"]],
        "running": [{"id": j.jobid, "project": j.project, "spider": j.spider,
                     "pid": j.pid, "start_time": scrapyd_time(j.started), **urls(j)}
                    for j in jobs["running"]],
        "finished": [{"id": j.jobid, "project": j.project, "spider": j.spider,
                      "start_time": scrapyd_time(j.started),
                      "end_time": scrapyd_time(j.finished), **urls(j)}
                     for j in jobs["finished"]],
    }


async def delete_project(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    await svc.delete_project(p.take("project"))
    return {}


async def delete_version(svc: ScrapydService, p: Params, request: Request) -> dict[str, Any]:
    project, version = p.take("project"), p.take("version")
    await svc.delete_version(project, version)
    return {}


#: Scrapyd's endpoints: name -> (method, handler).
ENDPOINTS: dict[str, tuple[str, Handler]] = {
    "daemonstatus.json": ("GET", daemon_status),
    "schedule.json": ("POST", schedule),
    "cancel.json": ("POST", cancel),
    "addversion.json": ("POST", add_version),
    "listprojects.json": ("GET", list_projects),
    "listversions.json": ("GET", list_versions),
    "listspiders.json": ("GET", list_spiders),
    "status.json": ("GET", status),
    "listjobs.json": ("GET", list_jobs),
    "delproject.json": ("POST", delete_project),
    "delversion.json": ("POST", delete_version),
}


def create_app(source: ServiceSource, *, node_name: str, token: str | None, hosts: Hosts,
               throttle: Throttle, max_body: int, body_timeout: float) -> ASGIApp:
    """Scrapyd's API over the service ``source`` gives (None while the server starts:
    503), with the server's guards (see the module docstring)."""

    def answer(data: dict[str, Any], status_code: int = 200) -> JSONResponse:
        return JSONResponse({"node_name": node_name, **data}, status_code=status_code)

    def error(message: str, status_code: int = 200) -> JSONResponse:
        return answer({"status": "error", "message": message}, status_code)

    def service() -> ScrapydService:
        svc = source()
        if svc is None:
            raise HTTPException(503, "crawlhub is starting or stopping; try again")
        return svc

    async def endpoint(request: Request) -> Response:
        name = request.path_params["name"]
        found = ENDPOINTS.get(name)
        if found is None:
            return error(f"no endpoint {name[:80]!r}: Scrapyd's are "
                         + ", ".join(ENDPOINTS), 404)
        method, handler = found
        if request.method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": f"OPTIONS, HEAD, {method}"})
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return error(f"{name} takes {method}, not {request.method}", 405)
        form: FormData | None = None
        try:
            items: list[tuple[str, Any]] = list(request.query_params.multi_items())
            if request.method == "POST":
                form = await request.form(max_files=10, max_fields=1000)
                items += list(form.multi_items())
            data = await handler(service(), Params(items), request)
        except HTTPException as exc:
            detail = str(exc.detail)
            if exc.status_code == 413:
                detail = (f"request body is over the limit of {max_body} bytes"
                          " (scrapyd.max_egg_bytes)")
            return error(detail, exc.status_code)
        except CrawlhubError as exc:  # Scrapyd's errors: HTTP 200, the message says why
            return error(str(exc))
        except Exception as exc:  # a bug or an OS error: said in the log, not to the client
            log.exception("scrapyd: %s failed", name)
            return error(f"internal error ({type(exc).__name__}): see the server's log")
        finally:
            if form is not None:  # an uploaded egg's spooled file
                await form.close()
        return answer({"status": "ok", **data})

    async def files(request: Request) -> Response:
        kind, project, spider, leaf = (request.path_params[k]
                                       for k in ("kind", "project", "spider", "leaf"))
        if kind not in ("logs", "items"):
            return PlainTextResponse("no such page: Scrapyd's API is /<endpoint>.json,"
                                     " /logs/<project>/<spider>/<jobid>.log and"
                                     " /items/<project>/<spider>/<jobid>.jl", 404)
        suffix = ".log" if kind == "logs" else ".jl"
        if not leaf.endswith(suffix):
            return PlainTextResponse(f"no such file: {kind} are <jobid>{suffix}", 404)
        try:
            svc = service()
            job = await svc.job_of(project, spider, leaf[:-len(suffix)])
        except HTTPException as exc:
            return PlainTextResponse(str(exc.detail), exc.status_code)
        except NotFoundError as exc:
            return PlainTextResponse(str(exc), 404)
        # a log line or an item is the crawled site's text: never sniffed into a page of
        # this origin (which could then post to this API as itself)
        headers = {"X-Content-Type-Options": "nosniff"}
        if kind == "logs":
            if job.run_id is None and not job.error:
                return PlainTextResponse(f"job {job.jobid} has not started: no log yet", 404)
            return StreamingResponse(svc.log_text(job), media_type="text/plain; charset=utf-8",
                                     headers=headers)
        path = svc.items_path(job)
        if path is None or not path.is_file():
            return PlainTextResponse(f"job {job.jobid} has no items file"
                                     + ("" if path else " (scrapyd.items_dir is empty)"), 404)
        return FileResponse(path, media_type="application/x-ndjson", headers=headers)

    app = Starlette(routes=[
        Route("/{name:str}", endpoint, methods=["GET", "HEAD", "POST", "OPTIONS", "PUT",
                                                "PATCH", "DELETE"]),
        Route("/{kind:str}/{project:str}/{spider:str}/{leaf:str}", files,
              methods=["GET", "HEAD"]),
    ])
    # Added last = runs first, as in crawlhub.app.asgi: Host and Origin, then the token,
    # then the body's size and time
    guarded: ASGIApp = BodyGuard(app, timeout=body_timeout, max_bytes=max_body)
    if token:
        guarded = ScrapydAuth(guarded, token=token, throttle=throttle, node_name=node_name)
    return ScrapydGuard(guarded, hosts=hosts, node_name=node_name)


class ScrapydGuard(RequestGuard):
    """:class:`RequestGuard`'s ``Host`` and ``Origin`` rules, answered in Scrapyd's shape;
    form bodies are taken (Scrapyd's clients send them; a browser's form from another
    site carries its ``Origin``, refused here)."""

    def __init__(self, app: ASGIApp, hosts: Hosts, node_name: str) -> None:
        super().__init__(app, hosts)
        self.node_name = node_name

    def problem(self, scope: Scope) -> tuple[int, str] | None:
        found = super().problem(scope)
        return None if found is not None and found[0] == 415 else found

    refused = "scrapyd: refused"

    def refusal(self, status: int, message: str) -> JSONResponse:
        return JSONResponse({"node_name": self.node_name, "status": "error",
                             "message": message}, status_code=status)


class ScrapydAuth:
    """The server's token, as basic auth's password (any user name) or a bearer token;
    401 otherwise, 429 while a client that sent wrong ones must wait."""

    def __init__(self, app: ASGIApp, *, token: str, throttle: Throttle, node_name: str
                 ) -> None:
        self.app = app
        self.token = token.encode()
        self.throttle = throttle
        self.node_name = node_name

    def given(self, scope: Scope) -> bytes | None:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, value = header.partition(b" ")
        if scheme.lower() == b"bearer":
            return value.strip()
        if scheme.lower() == b"basic":
            try:
                decoded = base64.b64decode(value.strip(), validate=True)
            except (binascii.Error, ValueError):
                return b""
            return decoded.partition(b":")[2]
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = self.given(scope)
        client = client_of(scope)
        if given is not None:
            wait = self.throttle.wait(client)
            if wait > 0:  # not even compared: a guesser learns nothing while it waits
                await self._refuse(scope, receive, send, 429,
                                   f"too many wrong tokens from {client}: try again in"
                                   f" {wait:.0f} s", {"Retry-After": str(max(1, round(wait)))})
                return
            if secrets.compare_digest(given, self.token):
                await self.app(scope, receive, send)
                return
            self.throttle.failed(client, "scrapyd token")
        await self._refuse(scope, receive, send, 401,
                           "missing or wrong token: send server.token as the basic-auth"
                           " password (scrapy.cfg [deploy] username/password; any user"
                           " name) or as 'Authorization: Bearer <server.token>'",
                           {"WWW-Authenticate": 'Bearer realm="crawlhub scrapyd"'})

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, code: int,
                      message: str, headers: dict[str, str]) -> None:
        await JSONResponse({"node_name": self.node_name, "status": "error",
                            "message": message}, status_code=code,
                           headers=headers)(scope, receive, send)
