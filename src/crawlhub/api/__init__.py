"""The HTTP API: FastAPI routers, one per resource, over :class:`crawlhub.service.Services`."""

from crawlhub.api.app import create_app

__all__ = ["create_app"]
