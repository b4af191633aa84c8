"""The web page at ``/``: Jinja2 templates and htmx over the same services as the API.

One module per area (``overview``, ``agents``, ``queues``, ``frontier``, ``projects``,
``jobs``, ``runs``, ``logs``, ``alerts``), each with a ``router`` and an ``AREA`` (nav
label, path, overview card); ``routes`` mounts them. Pages live at ``/ui/<area>`` (the
overview at ``/``), their live fragments at ``/ui/<area>/live``; ``render`` has the
environment and the answers, ``paging`` the keyset pages and query parameters,
``session`` the login cookie. Importing this package imports nothing else (the API's
middleware reads ``session`` without loading Jinja2).
"""
