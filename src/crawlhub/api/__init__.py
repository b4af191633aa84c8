"""The HTTP API: FastAPI routers, one per resource, over :class:`crawlhub.services.Services`.

The ASGI app that mounts them (with the web page) is :func:`crawlhub.app.asgi.create_app`.
"""
