"""The result-code table: defaults, HTTP statuses, overrides and config errors."""

from __future__ import annotations

import pytest

from crawlhub.agents import codes
from crawlhub.agents.codes import ResultCodes
from crawlhub.core.errors import ConfigError


def test_defaults_map_each_outcome_to_its_documented_code() -> None:
    table = ResultCodes()
    assert table.code(codes.SUCCESS, 200) == 1000
    assert table.code(codes.TIMEOUT) == 2001
    assert table.code(codes.CONNECTION_ERROR) == 2002
    assert table.code(codes.BANNED, 403) == 2003
    assert table.code(codes.TOO_LARGE, 200) == 2004
    assert table.code(codes.PARSE_ERROR, 200) == 2005
    assert table.code(codes.TOO_MANY_REDIRECTS, 302) == 2006
    assert table.code(codes.ROBOTS_DISALLOWED) == 2007
    assert table.code(codes.INVALID_URL) == 2008


def test_an_http_error_reports_its_status_unless_one_code_is_configured() -> None:
    assert ResultCodes().code(codes.HTTP_ERROR, 404) == 404
    assert ResultCodes().code(codes.HTTP_ERROR, 503) == 503
    assert ResultCodes(http_error=3000).code(codes.HTTP_ERROR, 503) == 3000


def test_config_overrides_codes_by_outcome_name_and_by_status() -> None:
    table = ResultCodes.from_config({"timeout": 7, "statuses": {404: 1000}})
    assert table.code(codes.TIMEOUT) == 7
    assert table.code(codes.HTTP_ERROR, 404) == 1000
    assert table.code(codes.HTTP_ERROR, 410) == 410
    assert table.code(codes.SUCCESS, 200) == 1000


def test_an_unknown_outcome_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="success"):
        ResultCodes().code("exploded")


def test_bad_config_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        ResultCodes.from_config({"timout": 5}, file="agent.yaml")
    assert err.value.key == "result_codes.timout"
    assert err.value.file == "agent.yaml"
    with pytest.raises(ConfigError) as err:
        ResultCodes.from_config({"banned": "lots"})
    assert err.value.key == "result_codes.banned"
    with pytest.raises(ConfigError, match="not an HTTP status") as err:
        ResultCodes.from_config({"statuses": {999: 1}})
    assert err.value.key == "result_codes.statuses"
