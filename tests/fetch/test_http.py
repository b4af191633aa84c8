"""The HTTP client layer's request building: one rule for query parameters, every client."""

from __future__ import annotations

import pytest

from crawlhub.fetch.http import CurlCffiClient, HttpClient, Request, query_params
from tests.httpapi import ApiServer


def test_query_params_send_values_as_text_and_leave_out_none() -> None:
    assert query_params({"a": 1, "b": None, "c": "x"}) == {"a": "1", "c": "x"}


@pytest.mark.parametrize("params", [None, {}])
def test_no_query_params_at_all_is_none(params: dict[str, object] | None) -> None:
    assert query_params(params) is None


@pytest.mark.parametrize("client_type", [HttpClient, CurlCffiClient])
@pytest.mark.parametrize("params", [None, {}])
async def test_empty_params_leave_the_urls_own_query_alone(
    api_server: ApiServer, client_type: type[HttpClient | CurlCffiClient],
    params: dict[str, object] | None,
) -> None:
    async with client_type(timeout=10) as client:
        await client.request(Request(f"{api_server.url}/echo?a=1", params=params))
    assert api_server.log[-1].query == {"a": "1"}
