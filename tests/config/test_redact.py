"""Secrets never leave through dumps, the API or error messages."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pydantic import SecretStr

from crawlhub.config import dump_config, load_config, redact
from crawlhub.core.logsetup import setup_logging
from crawlhub.core.redact import redact_url

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
        main, env={"HUB_TOKEN": "tok-123-4f9e-8a7b", "REDIS_PASSWORD": "rpw-456", "PG_PASSWORD": "pgpw-789"}
    )
    assert cfg.server.token is not None
    assert cfg.server.token.get_secret_value() == "tok-123-4f9e-8a7b"
    assert cfg.storage.queues == "redis://:rpw-456@127.0.0.1:6379/0"  # the hub gets the real URL

    shown = json.dumps(dump_config(cfg))
    for secret in ("tok-123-4f9e-8a7b", "rpw-456", "pgpw-789", '"pw"'):
        assert secret not in shown
    assert dump_config(cfg)["server"]["token"] == "***"
    assert dump_config(cfg)["storage"]["metadata"] == "postgresql://crawl:***@127.0.0.1/test"

    # Even unredacted, a SecretStr field dumps as ***.
    assert "tok-123-4f9e-8a7b" not in json.dumps(dump_config(cfg, redacted=False))
    assert dump_config(cfg, redacted=False)["server"]["token"] == "***"


def test_dump_puts_static_params_back_into_the_outbound_with_class_keys(write: WriteFiles) -> None:
    main = write({"main.yaml": "outbound:\n  - {name: o, class: redis_list, task_src: 3}\n"})
    out = dump_config(load_config(main, env={}))["outbound"][0]
    assert out["class"] == "redis_list" and out["task_src"] == 3
    assert "static_params" not in out and "class_" not in out


def test_secret_query_parameters_are_masked_and_the_rest_kept() -> None:
    url = (
        "https://api.example.test/list?page=2&password=p1&pwd=p2&pass=p3&access_token=t"
        "&sign=s1&Signature=s2&api_key=k1&key=k2&session_id=sid&keyword=shoes#top"
    )
    assert redact(url) == (
        "https://api.example.test/list?page=2&password=***&pwd=***&pass=***&access_token=***"
        "&sign=***&Signature=***&api_key=***&key=***&session_id=***&keyword=shoes#top"
    )
    assert redact_url("redis://u:pw@h:6379/0?password=pw2") == "redis://u:***@h:6379/0?password=***"
    # An empty value hides nothing; a percent-encoded name is still recognised.
    assert redact_url("http://h/?token=&a%5Fkey=v") == "http://h/?token=&a%5Fkey=***"


def test_credential_like_headers_and_params_are_masked() -> None:
    headers = {
        "Authorization": "Bearer abc",
        "Proxy-Authorization": "Basic xyz",
        "Cookie": "sid=1",
        "X-Sign": "f00",
        "X-Api-Key": "k",
        "Accept": "application/json",
    }
    assert redact({"headers": headers, "params": {"timestamp": 1, "sign": "f00"}}) == {
        "headers": {
            "Authorization": "***",
            "Proxy-Authorization": "***",
            "Cookie": "***",
            "X-Sign": "***",
            "X-Api-Key": "***",
            "Accept": "application/json",
        },
        "params": {"timestamp": 1, "sign": "***"},
    }


def test_a_config_key_option_is_a_queue_name_not_a_secret() -> None:
    assert redact({"init": {"url": "redis://h/0?key=abc", "key": "my_spider"}}) == {
        "init": {"url": "redis://h/0?key=***", "key": "my_spider"}
    }


def test_log_lines_carry_no_secrets(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    log_file = tmp_path / "hub.log"
    try:
        setup_logging("INFO", "console", str(log_file))
        logging.getLogger("crawlhub.test").info(
            "GET %s headers=%s", "https://u:pw1@h/x?sign=s3cr&page=1", {"Cookie": "c00kie"}
        )
        logging.getLogger("crawlhub.test").warning("Authorization: Bearer t0ken")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    text = log_file.read_text(encoding="utf-8")
    for secret in ("pw1", "s3cr", "c00kie", "t0ken"):
        assert secret not in text
    assert "https://u:***@h/x?sign=***&page=1" in text
    assert "{'Cookie': '***'}" in text


def test_json_log_lines_mask_extras_and_tracebacks(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    log_file = tmp_path / "hub.jsonl"
    try:
        setup_logging("INFO", "json", str(log_file))
        log = logging.getLogger("crawlhub.test")
        log.info("fetched", extra={"url": "https://h/?access_token=tk1", "headers": {
            "Authorization": "Bearer tk2"}})
        try:
            raise ConnectionError("cannot reach redis://:tk3@127.0.0.1:6390/0")
        except ConnectionError:
            log.exception("outage")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    lines = [json.loads(line) for line in log_file.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["url"] == "https://h/?access_token=***"
    assert lines[0]["headers"] == {"Authorization": "***"}
    assert "redis://:***@127.0.0.1:6390/0" in lines[1]["exc"]
    for secret in ("tk1", "tk2", "tk3"):
        assert secret not in log_file.read_text(encoding="utf-8")


def test_exception_lines_named_like_a_key_are_not_masked() -> None:
    from crawlhub.core.redact import redact_text

    assert redact_text("KeyError: 'services'") == "KeyError: 'services'"
    assert redact_text("Traceback:\nKeyError: 'path'\nX-Api-Key: k1") == (
        "Traceback:\nKeyError: 'path'\nX-Api-Key: ***"
    )
    assert redact_text("Authorization: Bearer t") == "Authorization: ***"


def test_secret_names_are_configurable(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                logging:
                  secret_names: ['*ticket*']
                  public_names: [sign_in_url]
                outbound:
                  - name: o
                    class: queue
                    init: {key: o, ticket_no: T-1, sign_in_url: 'https://h/login'}
                """
        }
    )
    init = dump_config(load_config(main, env={}))["outbound"][0]["init"]
    assert init == {"key": "o", "ticket_no": "***", "sign_in_url": "https://h/login"}


def test_one_redaction_function_serves_every_module() -> None:
    import ast

    import crawlhub
    from crawlhub.backends.backend import redact_url as storage_redact_url

    assert storage_redact_url is redact_url
    src = Path(crawlhub.__file__).parent
    others = [
        f"{path.relative_to(src)}:{node.name}"
        for path in src.rglob("*.py")
        if path != src / "core" / "redact.py"
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("redact")
    ]
    assert others == []


def test_job_log_lines_carry_no_secrets() -> None:
    from crawlhub.fetch.joblog import JobLog

    log = JobLog("news", logger=logging.getLogger("crawlhub.test.joblog"))
    line = log.info("request", endpoint="https://api.test/list?sign=ab12&page=3", status=200,
                    headers={"Cookie": "sid=99"})
    assert line["endpoint"] == "https://api.test/list?sign=***&page=3"
    assert line["headers"] == {"Cookie": "***"} and line["status"] == 200
    assert "ab12" not in log.text() and "sid=99" not in log.text()
