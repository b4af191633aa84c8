"""Fetch tests use the real paged JSON API from tests/httpapi.py."""

from tests.httpapi import api_server  # noqa: F401 - a fixture
