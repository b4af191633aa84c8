"""Secrets never leave through dumps, the API or error messages."""

from __future__ import annotations

import json

from pydantic import SecretStr

from crawlhub.config import dump_config, load_config, redact

from .conftest import WriteFiles


def test_secret_keys_are_masked_at_any_depth() -> None:
    data = {
        "password": "p1",
        "init": {"redis_passwd": "p2", "Api_Key": "k", "x-api-key": "k2", "client_secret": "s"},
        "headers": [{"Authorization": "Bearer abc", "Accept": "json"}],
        "access_token": "t",
        "credentials": {"user": "u", "pass": "p"},
        "private_key": "pem",
        "empty_password": None,
    }
    assert redact(data) == {
        "password": "***",
        "init": {
            "redis_passwd": "***",
            "Api_Key": "***",
            "x-api-key": "***",
            "client_secret": "***",
        },
        "headers": [{"Authorization": "***", "Accept": "json"}],
        "access_token": "***",
        "credentials": "***",
        "private_key": "***",
        "empty_password": None,
    }


def test_token_options_that_are_not_secrets_stay_visible() -> None:
    assert redact({"token_scope": "*", "token_per_second": 5}) == {
        "token_scope": "*",
        "token_per_second": 5,
    }


def test_url_passwords_are_masked_and_the_rest_kept() -> None:
    assert redact("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert redact({"url": "postgresql://u:pw@h/db"}) == {"url": "postgresql://u:***@h/db"}
    assert redact(["redis://host:6379/0"]) == ["redis://host:6379/0"]
    assert redact("a redis://u:x@h1 and amqp://v:y@h2") == "a redis://u:***@h1 and amqp://v:***@h2"


def test_redact_leaves_the_original_untouched() -> None:
    data = {"password": "p", "nested": {"url": "redis://:pw@h"}}
    redact(data)
    assert data == {"password": "p", "nested": {"url": "redis://:pw@h"}}


def test_secretstr_is_masked() -> None:
    assert redact({"anything": SecretStr("s3cret")}) == {"anything": "***"}


def test_dump_never_contains_the_server_token_or_url_passwords(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                server:
                  token: '{hub_token}'
                storage:
                  queues: 'redis://:{redis_password}@127.0.0.1:6379/0'
                  metadata: 'postgresql://crawl:{pg_password}@127.0.0.1/test'
                outbound:
                  - name: o
                    class: redis_list
                    init: {url: 'redis://:{redis_password}@127.0.0.1:6379/0', password: pw}
                """
        }
    )
    cfg = load_config(
        main, env={"HUB_TOKEN": "tok-123", "REDIS_PASSWORD": "rpw-456", "PG_PASSWORD": "pgpw-789"}
    )
    assert cfg.server.token is not None
    assert cfg.server.token.get_secret_value() == "tok-123"
    assert cfg.storage.queues == "redis://:rpw-456@127.0.0.1:6379/0"  # the hub gets the real URL

    shown = json.dumps(dump_config(cfg))
    for secret in ("tok-123", "rpw-456", "pgpw-789", '"pw"'):
        assert secret not in shown
    assert dump_config(cfg)["server"]["token"] == "***"
    assert dump_config(cfg)["storage"]["metadata"] == "postgresql://crawl:***@127.0.0.1/test"

    # Even unredacted, a SecretStr field dumps as ***.
    assert "tok-123" not in json.dumps(dump_config(cfg, redacted=False))
    assert dump_config(cfg, redacted=False)["server"]["token"] == "***"


def test_dump_puts_static_params_back_into_the_outbound_with_class_keys(write: WriteFiles) -> None:
    main = write({"main.yaml": "outbound:\n  - {name: o, class: redis_list, task_src: 3}\n"})
    out = dump_config(load_config(main, env={}))["outbound"][0]
    assert out["class"] == "redis_list" and out["task_src"] == 3
    assert "static_params" not in out and "class_" not in out
