"""The ``agent`` section: downloader, result codes, politeness and sink of ``crawlhub
agent``; errors name file, entry and key; proxy and header secrets never leave a dump."""

from __future__ import annotations

import json

import pytest

from crawlhub.config import dump_config, load_config
from crawlhub.core.errors import ConfigError, ConfigErrors

from .conftest import WriteFiles


def test_the_agent_section_is_read_with_its_defaults(write: WriteFiles) -> None:
    main = write({"main.yaml": """
        agent:
          concurrency: 16
          downloader:
            max_size: 1000
            ban: {statuses: [403], body_regex: captcha}
            proxies: [http://127.0.0.1:3128]
          result_codes: {statuses: {404: 1000}}
          politeness: {per_domain: 2, delay: 0.5}
        """})
    agent = load_config(main, env={}).agent
    assert agent.concurrency == 16 and agent.lease == 120.0
    assert agent.downloader.max_size == 1000 and agent.downloader.ban.statuses == [403]
    assert agent.downloader.proxies.urls == ["http://127.0.0.1:3128"]
    assert agent.result_codes.code("http_error", 404) == 1000
    assert agent.result_codes.code("timeout") == 2001
    assert (agent.politeness.per_domain, agent.politeness.delay,
            agent.politeness.robots) == (2, 0.5, True)


def test_a_config_without_the_section_gets_every_default(write: WriteFiles) -> None:
    agent = load_config(write({"main.yaml": "outbound:\n  - name: o\n"}), env={}).agent
    assert agent.downloader.max_redirects == 10 and agent.sink is None
    assert agent.politeness.per_domain == 0


def test_bad_agent_keys_are_each_named_with_file_entry_and_key(write: WriteFiles) -> None:
    main = write({"main.yaml": """
        agent:
          downloader:
            ban: {body_regex: "(unclosed", statuses: [700]}
          politeness: {per_domian: 2}
          concurrency: 0
        """})
    with pytest.raises(ConfigErrors) as info:
        load_config(main, env={})
    found = {(e.file, e.entry, e.key) for e in info.value.errors}
    assert found == {("main.yaml", "agent", "downloader.ban.body_regex"),
                     ("main.yaml", "agent", "downloader.ban.statuses"),
                     ("main.yaml", "agent", "politeness.per_domian"),
                     ("main.yaml", "agent", "concurrency")}
    text = str(info.value)
    assert "did you mean 'per_domain'" in text and "700 is not an HTTP status" in text


def test_an_unknown_downloader_key_is_one_clear_error(write: WriteFiles) -> None:
    main = write({"main.yaml": "agent:\n  downloader: {timout: 5}\n"})
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert "downloader.timout" in str(info.value) and "timeout" in str(info.value)


def test_proxy_passwords_and_auth_headers_are_masked_in_the_dump(write: WriteFiles) -> None:
    main = write({"main.yaml": """
        agent:
          downloader:
            proxies: {urls: ["http://bob:s3cret@127.0.0.1:3128"]}
            headers: {Authorization: Bearer abc123, Accept: text/html}
        """})
    text = json.dumps(dump_config(load_config(main, env={})))
    assert "s3cret" not in text and "abc123" not in text
    assert "http://bob:***@127.0.0.1:3128" in text and "text/html" in text
