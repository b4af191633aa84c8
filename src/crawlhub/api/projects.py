"""``/projects/``, ``/hooks/{project}`` and ``/builds/``: projects (git remote, credentials
stored encrypted and never returned), the forge webhooks that build their release tags,
and the builds with their logs and artifacts.

``/hooks/{project}`` is open without the bearer token (``PUBLIC_PREFIXES`` in
:mod:`crawlhub.app.asgi`): a forge signs its requests instead, and the signature (or
GitLab's token) is the only gate. Every refusal there is the same 401, whether the
project does not exist, has no webhook secret or the signature is wrong, so an unsigned
caller learns nothing about which projects exist; the server log says which it was.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any
from urllib.parse import parse_qs

from fastapi import Depends, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field, model_validator

from crawlhub.api import routing
from crawlhub.api.deps import ApiError, ServicesDep, control_plane
from crawlhub.api.openapi import BACKEND, BODY, ErrorBody, errors
from crawlhub.control.builds import LATEST, STATUSES, Build, BuildService
from crawlhub.control.hooks import (
    DELIVERY_KEEP,
    HookError,
    HookRejected,
    Push,
    delivery_keys,
    parse,
    verify,
)
from crawlhub.control.projects import (
    InvalidProject,
    NewProject,
    Project,
    ProjectStore,
    ProjectUpdate,
)
from crawlhub.control.secrets import SecretError

log = logging.getLogger("crawlhub.api.hooks")

router = routing.router()

#: The largest webhook body read (GitHub caps payloads at 25 MB, but a tag push is a few
#: KB; a huge branch push is refused before it is verified, and would be ignored anyway).
HOOK_MAX_BYTES = 5 * 1024 * 1024


def project_store(svc: ServicesDep) -> ProjectStore:
    return control_plane(svc).projects


def build_service(svc: ServicesDep) -> BuildService:
    return control_plane(svc).builds


class ProjectPage(BaseModel):
    projects: list[Project]
    next: str | None = Field(description="pass as ?after= for the next page (null: the"
                             " last page)")


class BuildPage(BaseModel):
    builds: list[Build]
    next: int | None = Field(description="pass as ?before= for the next page (null: the"
                             " last page)")


class BuildRequest(BaseModel):
    """``POST /projects/{name}/builds``: a release tag (its version read from the
    project's tag pattern unless given), or a branch ``ref`` with a ``version``; neither:
    the default branch, with a ``version``."""

    model_config = {"extra": "forbid"}
    tag: str | None = Field(None, min_length=1, max_length=255,
                            examples=["release/shop/1.4.0"])
    ref: str | None = Field(None, min_length=1, max_length=255, examples=["main"])
    version: str | None = Field(None, min_length=1, max_length=64, examples=["dev"])

    @model_validator(mode="after")
    def _one(self) -> BuildRequest:
        if self.tag is not None and self.ref is not None:
            raise ValueError("give a tag or a ref, not both")
        return self


class ArtifactOut(BaseModel):
    """What a job of this project and version runs (``GET /projects/{name}/artifact``)."""

    project: str
    version: str
    build: int
    commit: str
    kind: str = Field(description="venv, wheel, image or dir")
    path: str = Field(description="the venv, wheel file, image tag or directory")
    workdir: str | None = Field(description="the clone, where a job's command runs")
    bin_dir: str | None
    env: dict[str, str]


class HookAnswer(BaseModel):
    """What a verified webhook did: started ``build`` for ``version``, or ``ignored``
    it (and why), or saw it before (``duplicate``)."""

    status: str = Field(default="ignored", description="building, ignored or duplicate (the same"
                        " delivery, or the same signed body, within a day: nothing runs)")
    forge: str
    event: str
    build: int | None = None
    version: str | None = None
    tag: str | None = None
    ignored: str | None = None


# ---------------------------------------------------------------------------- projects
@router.post("/projects/", tags=["projects"], status_code=201, response_model=Project,
             summary="Add a project", responses=errors(*BODY, 409, *BACKEND))
async def create_project(spec: NewProject,
                         store: ProjectStore = Depends(project_store)) -> Project:
    """Name, git URL, user name and password (or token), webhook secret, default branch,
    tag pattern and builder. The password and webhook secret are stored encrypted and
    never answered: a project says ``has_password`` / ``has_webhook_secret``. 409 when
    the name is taken."""
    return await store.create(spec)


@router.get("/projects/", tags=["projects"], response_model=ProjectPage,
            summary="Projects by name", responses=errors(422, *BACKEND))
async def list_projects(
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, max_length=64, description="the last name of the page"
                              " before"),
    store: ProjectStore = Depends(project_store),
) -> ProjectPage:
    """Projects sorted by name, a page at a time (``?after=<next>``)."""
    projects = await store.list(limit=limit, after=after)
    more = len(projects) == limit
    return ProjectPage(projects=projects, next=projects[-1].name if more else None)


@router.get("/projects/{name}", tags=["projects"], response_model=Project,
            summary="A project", responses=errors(404, 422, *BACKEND))
async def get_project(name: str = Path(max_length=64),
                      store: ProjectStore = Depends(project_store)) -> Project:
    return await store.get(name)


@router.patch("/projects/{name}", tags=["projects"], response_model=Project,
              summary="Change a project", responses=errors(*BODY, 404, *BACKEND))
async def update_project(patch: ProjectUpdate, name: str = Path(max_length=64),
                         store: ProjectStore = Depends(project_store)) -> Project:
    """Only the fields sent change. A new ``password`` or ``webhook_secret`` replaces the
    old one (which cannot be read); null removes it."""
    return await store.update(name, patch)


@router.delete("/projects/{name}", tags=["projects"], status_code=204,
               summary="Remove a project, its builds and their directories",
               responses=errors(404, 409, 422, *BACKEND))
async def delete_project(name: str = Path(max_length=64),
                         builds: BuildService = Depends(build_service)) -> None:
    """409 while one of its builds runs."""
    await builds.delete_project(name)


@router.post("/projects/{name}/builds", tags=["builds"], status_code=202,
             response_model=Build, summary="Build a tag or a branch now",
             responses=errors(*BODY, 404, 409, *BACKEND))
async def start_build(request: BuildRequest, name: str = Path(max_length=64),
                      builds: BuildService = Depends(build_service)) -> Build:
    """Starts the build in the background: poll ``GET /builds/{id}``. 409 while a build of
    the same version runs; 422 for a tag that does not match the project's pattern (give
    a ``version`` to build it anyway) or a bad ref or version."""
    try:
        return await builds.start(name, tag=request.tag, ref=request.ref,
                                  version=request.version, trigger="api")
    except InvalidProject as exc:
        raise ApiError(422, str(exc)) from None


@router.get("/projects/{name}/artifact", tags=["builds"], response_model=ArtifactOut,
            summary="The artifact a job of this project runs",
            responses=errors(404, 422, *BACKEND))
async def get_artifact(name: str = Path(max_length=64),
                       version: str = Query(LATEST, min_length=1, max_length=64,
                                            description="a version, or latest (the newest"
                                            " successful build)"),
                       builds: BuildService = Depends(build_service)) -> ArtifactOut:
    return ArtifactOut.model_validate(await builds.artifact(name, version),
                                      from_attributes=True)


# ---------------------------------------------------------------------------- builds
@router.get("/builds/", tags=["builds"], response_model=BuildPage,
            summary="Builds, newest first", responses=errors(422, *BACKEND))
async def list_builds(
    project: str | None = Query(None, max_length=64),
    status: str | None = Query(None, pattern="^(" + "|".join(STATUSES) + ")$"),
    limit: int = Query(50, ge=1, le=1000),
    before: int | None = Query(None, ge=1, le=2**62, description="the last id of the page"
                               " before"),
    builds: BuildService = Depends(build_service),
) -> BuildPage:
    """Without logs (``GET /builds/{id}`` has it)."""
    rows = await builds.list(project=project, status=status, limit=limit, before=before)
    return BuildPage(builds=rows, next=rows[-1].id if len(rows) == limit else None)


@router.get("/builds/{build_id}", tags=["builds"], response_model=Build,
            summary="A build with its log", responses=errors(404, 422, *BACKEND))
async def get_build(build_id: int = Path(ge=1, le=2**62),
                    builds: BuildService = Depends(build_service)) -> Build:
    return await builds.get(build_id)


@router.get("/builds/{build_id}/log", tags=["builds"],
            summary="A build's log as text", responses={
                200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                      "description": "the last lines of its output, secrets masked"},
                **errors(404, 422, *BACKEND)})
async def get_build_log(build_id: int = Path(ge=1, le=2**62),
                        builds: BuildService = Depends(build_service)) -> PlainTextResponse:
    return PlainTextResponse(await builds.log_text(build_id))


# ---------------------------------------------------------------------------- hooks
_HOOK_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"model": HookAnswer, "description": "A verified event that is not a push (ping,"
          " ...), or a delivery seen within a day (status duplicate): acknowledged,"
          " nothing runs"},
    401: {"model": ErrorBody, "description": "Not signed by the project's forge: no or a"
          " wrong signature or token, no webhook secret set, or no such project (the same"
          " answer for each); nothing runs"},
    400: {"model": ErrorBody, "description": "Signed, but the payload is not a JSON object"
          " (or nests too deep), or not a push event crawlhub can read"},
    409: {"model": ErrorBody, "description": "A build of that version is under way"},
    413: {"model": ErrorBody, "description": f"The body is over {HOOK_MAX_BYTES} bytes"},
    **errors(408, 422, *BACKEND),
}
_HOOK_BODY = {"requestBody": {"required": True, "description": "the forge's push or tag"
                              " event, as it sends it (JSON, or GitHub's form encoding)",
                              "content": {"application/json": {"schema": {
                                  "type": "object", "additionalProperties": True}}}}}


@router.post("/hooks/{project}", tags=["hooks"], status_code=202, response_model=HookAnswer,
             summary="A forge's push or tag webhook (GitHub, GitLab, Gitea)",
             responses=_HOOK_ANSWERS, openapi_extra=_HOOK_BODY)
async def hook(request: Request, project: str = Path(max_length=200),
               store: ProjectStore = Depends(project_store),
               builds: BuildService = Depends(build_service)) -> Any:
    """Verified first (GitHub ``X-Hub-Signature-256``, Gitea ``X-Gitea-Signature``:
    HMAC-SHA256 of the body with the project's webhook secret; GitLab ``X-Gitlab-Token``:
    the secret), compared in constant time; anything else is 401 and nothing runs. A tag
    push whose tag matches the project's pattern (``release/{name}/{version}`` by default,
    ``{name}`` the project's release name) starts a build: 202 with ``build`` and
    ``version``. Branch pushes, deleted tags and other tags: 202 with ``ignored``. The
    body must be a JSON object (400). A delivery seen within a day (its delivery id, or
    the same body) is 200 ``{"status": "duplicate"}`` and runs nothing; one that failed
    (409, 5xx) is forgotten, so the forge's retry runs."""
    body = await _read_body(request)
    try:
        secret = await store.webhook_secret(project)
    except SecretError as exc:  # stored under a key this server lacks: refuse, say why here
        log.error("webhook for %r: %s", project[:80], exc)
        secret = None
    # Unknown projects and projects without a secret are checked against a random secret:
    # the same 401 as a wrong signature, so the answer does not tell them apart.
    given = secret.reveal() if secret else secrets.token_hex(32)
    try:
        forge = verify(request.headers, body, given)
        if secret is None:
            raise HookRejected("bad signature")
    except HookRejected as exc:
        why = ("no such project" if not await _exists(store, project) else
               "the project has no webhook secret" if secret is None else str(exc))
        log.warning("webhook for %r refused: %s", project[:80], why)
        raise ApiError(401, f"webhook refused: {exc}; set the same secret on the forge's"
                       " hook and on the project (webhook_secret)") from None
    try:
        push = parse(forge, request.headers, _payload(request, body))
    except HookError as exc:
        raise ApiError(400, str(exc)) from None
    event = _event(request)
    keys = delivery_keys(forge, request.headers, body)
    claim = await store.deliveries.claim(project, keys)
    if claim is None:
        log.info("webhook for %s (%s): delivery %s seen before; nothing runs", project,
                 forge, keys[0][:120])
        return JSONResponse(HookAnswer(
            status="duplicate", forge=forge, event=event, tag=push.tag if push else None,
            ignored=f"delivery {keys[0][:120]} was handled within the last"
                    f" {DELIVERY_KEEP / 3600:g} h; nothing runs").model_dump(),
            status_code=200)
    try:
        return await _act(project, forge, event, push, store, builds)
    except BaseException:  # not handled: the forge's retry of it must be handled
        await asyncio.shield(store.deliveries.release(project, keys, claim))
        raise


async def _act(project: str, forge: str, event: str, push: Push | None,
               store: ProjectStore, builds: BuildService) -> Any:
    """What a verified, first-seen delivery does."""
    if push is None:
        return JSONResponse(HookAnswer(forge=forge, event=event, ignored=f"{event or 'this'}"
                                       " event is not a push; nothing to build").model_dump(),
                            status_code=200)
    answer = HookAnswer(forge=forge, event=event, tag=push.tag)
    if push.tag is None:
        answer.ignored = f"{push.ref} is not a tag: only release tags are built"
        return answer
    if push.deleted:
        answer.ignored = f"tag {push.tag} was deleted"
        return answer
    proj = await store.get(project)
    version, why = proj.release(push.tag)
    if version is None:
        answer.ignored = why
        return answer
    try:
        build = await builds.start(project, tag=push.tag, version=version, trigger="hook")
    except InvalidProject as exc:
        answer.ignored = str(exc)
        return answer
    log.info("webhook for %s (%s): tag %s, build %d", project, forge, push.tag, build.id)
    answer.status, answer.build, answer.version = "building", build.id, version
    return answer


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > HOOK_MAX_BYTES:
        raise ApiError(413, f"webhook body of {declared} bytes is over {HOOK_MAX_BYTES}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > HOOK_MAX_BYTES:
            raise ApiError(413, f"webhook body is over {HOOK_MAX_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _payload(request: Request, body: bytes) -> bytes:
    """The JSON of the event: the body, or GitHub's ``payload=`` form field."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        fields = parse_qs(body.decode("latin-1"), max_num_fields=20)
        values = fields.get("payload")
        if not values:
            raise ApiError(400, "a form-encoded webhook without a 'payload' field")
        return values[0].encode("utf-8", "replace")
    return body


def _event(request: Request) -> str:
    for name in ("X-Gitea-Event", "X-Gogs-Event", "X-Gitlab-Event", "X-GitHub-Event"):
        value = request.headers.get(name)
        if value:
            return value[:100]
    return ""


async def _exists(store: ProjectStore, name: str) -> bool:
    try:
        await store.get(name)  # a name no project can have is a NotFoundError too
    except Exception:  # noqa: BLE001 - only for the server log's reason
        return False
    return True
