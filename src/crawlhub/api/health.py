"""``GET /healthz`` and ``GET /metrics`` (Prometheus text format)."""

from __future__ import annotations

from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from crawlhub import __version__
from crawlhub.agents.politeness import domain_figures, metrics_text
from crawlhub.api import routing
from crawlhub.api.deps import ServicesDep
from crawlhub.api.models import Health
from crawlhub.core import rejects

router = routing.router(tags=["health"])


@router.get("/healthz", summary="Liveness and backend reachability", response_model=Health,
            responses={503: {"model": Health, "description": "A backend is out of reach:"
                             " status 'degraded', and which check failed"}})
async def healthz(svc: ServicesDep) -> JSONResponse:
    checks: dict[str, str] = {}
    ok = True
    try:
        await svc.state.pending()
        checks["state"] = "ok"
    except Exception as exc:  # report, don't raise: this is the health endpoint
        checks["state"] = f"error: {type(exc).__name__}"
        ok = False
    try:
        await svc.queues.names()
        checks["queues"] = "ok"
    except Exception as exc:
        checks["queues"] = f"error: {type(exc).__name__}"
        ok = False
    body = Health(status="ok" if ok else "degraded", version=__version__,
                  project=svc.config.project, checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
async def metrics(svc: ServicesDep) -> Response:
    hub = svc.hub
    for rule in hub.router.rules:
        if rule.name in hub.transports:
            try:
                hub.metrics.lag.labels(rule.name).set(await hub.lag(rule.name))
            except Exception:  # a backend down must not break the scrape
                continue
    text = generate_latest(hub.metrics.registry)
    logs = getattr(svc.control, "logs", None)
    if logs is not None:  # the control plane's log figures (lines dropped, if any)
        text += logs.metrics_text().encode()
    text += generate_latest(rejects.REGISTRY)  # this process's rejected stream entries
    try:  # each domain's politeness, as every agent on storage.agents sees it
        storage = svc.config.storage
        text += metrics_text(await domain_figures(storage.agents_url,
                                                  prefix=storage.redis_prefix)).encode()
    except Exception:  # a backend down must not break the scrape
        pass
    return Response(text, media_type=CONTENT_TYPE_LATEST)
