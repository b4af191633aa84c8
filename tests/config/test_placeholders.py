"""{name} placeholders: settings layers in order, built-ins, escapes, selectors untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlhub.config import load_config, load_settings
from crawlhub.core.errors import ConfigError

from .conftest import WriteFiles

REDIS_OUTBOUND = """
    outbound:
      - name: captcha
        class: redis_list
        init:
          url: '{redis_url}'
          key: captcha_spider
    """


def url_of(main: Path, **kwargs) -> str:
    return load_config(main, **kwargs).outbound[0].init["url"]


def test_each_settings_layer_beats_the_one_below(write: WriteFiles) -> None:
    main = write({"main.yaml": REDIS_OUTBOUND})
    conf = main.parent

    (conf / ".env").write_text("redis_url=redis://dotenv/0\n")
    assert url_of(main, env={}) == "redis://dotenv/0"

    (conf / ".env.local").write_text("REDIS_URL=redis://dotenv-local/0\n")
    assert url_of(main, env={}) == "redis://dotenv-local/0"

    env = {"REDIS_URL": "redis://plain-env/0"}
    assert url_of(main, env=env) == "redis://plain-env/0"

    env["CRAWLHUB_REDIS_URL"] = "redis://prefixed-env/0"
    assert url_of(main, env=env) == "redis://prefixed-env/0"

    assert url_of(main, env=env, overrides={"redis_url": "redis://cli/0"}) == "redis://cli/0"


def test_prefixed_name_beats_plain_name_inside_one_env_file(write: WriteFiles) -> None:
    main = write({"main.yaml": REDIS_OUTBOUND})
    (main.parent / ".env").write_text(
        "CRAWLHUB_REDIS_URL=redis://prefixed/0\nredis_url=redis://plain/0\n"
    )
    assert url_of(main, env={}) == "redis://prefixed/0"


def test_env_file_in_current_directory_beats_the_one_beside_the_config(
    write: WriteFiles, _empty_cwd: Path
) -> None:
    main = write({"main.yaml": REDIS_OUTBOUND})
    (main.parent / ".env").write_text("redis_url=redis://beside-config/0\n")
    (_empty_cwd / ".env").write_text("redis_url=redis://cwd/0\n")
    assert url_of(main, env={}) == "redis://cwd/0"
    # ...but any .env.local beats any .env
    (main.parent / ".env.local").write_text("redis_url=redis://config-local/0\n")
    assert url_of(main, env={}) == "redis://config-local/0"


def test_names_are_case_insensitive(write: WriteFiles) -> None:
    main = write({"main.yaml": REDIS_OUTBOUND.replace("{redis_url}", "{Redis_URL}")})
    assert url_of(main, env={"crawlhub_redis_url": "redis://lower/0"}) == "redis://lower/0"
    assert url_of(main, env={}, overrides={"REDIS_URL": "redis://cli/0"}) == "redis://cli/0"


def test_unknown_placeholder_names_file_entry_key_and_where_to_set_it(write: WriteFiles) -> None:
    main = write({"main.yaml": "include: [config.d]\n", "config.d/20_captcha.yaml": REDIS_OUTBOUND})
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    err = info.value
    assert (err.file, err.entry, err.key) == (
        "config.d/20_captcha.yaml",
        "outbound[0] 'captcha'",
        "init.url",
    )
    text = str(err)
    assert "unknown placeholder '{redis_url}'" in text
    assert ".env" in text and ".env.local" in text
    assert "CRAWLHUB_REDIS_URL or REDIS_URL" in text
    assert "--set redis_url=VALUE" in text


def test_unknown_placeholder_in_a_top_level_section(write: WriteFiles) -> None:
    main = write({"main.yaml": "failure:\n  path: '{failure_path}'\n"})
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert (info.value.file, info.value.entry, info.value.key) == ("main.yaml", "failure", "path")
    assert "unknown placeholder '{failure_path}'" in str(info.value)


def test_selectors_are_never_substituted(write: WriteFiles) -> None:
    # A set literal in a selector looks like a placeholder; it must stay as written.
    main = write(
        {
            "main.yaml": """
                outbound:
                  - name: sets
                    selector:
                      - "province in {GD} or city in {'a', 'b'}"
                    init:
                      key: "{{literal}}"
                """
        }
    )
    out = load_config(main, env={}).outbound[0]
    assert out.selector == ["province in {GD} or city in {'a', 'b'}"]
    assert out.init["key"] == "{literal}"  # {{ }} are escaped braces elsewhere


def test_a_value_that_is_one_placeholder_is_coerced_by_the_schema(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                server:
                  port: '{hub_port}'
                outbound:
                  - name: o
                    retry_limits: '{retries}'
                    task_src: '{src}'
                """
        }
    )
    cfg = load_config(main, env={"HUB_PORT": "9100", "RETRIES": "7", "SRC": "3"})
    assert cfg.server.port == 9100
    assert cfg.outbound[0].retry_limits == 7
    assert cfg.outbound[0].static_params == {"task_src": "3"}  # static params stay strings


def test_builtin_placeholders_and_defaults_use_the_effective_data_dir(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                project: demo
                data_dir: /srv/{project}
                logging:
                  file: '{config_dir}/{project}.log'
                """
        }
    )
    cfg = load_config(main, env={})
    assert cfg.data_dir == "/srv/demo"
    assert cfg.storage.queues == "sqlite:////srv/demo/queues.db"
    assert cfg.failure.path == "/srv/demo/failures.jsonl"
    assert cfg.logging.file == f"{main.parent}/demo.log"

    overridden = load_config(main, env={}, overrides={"data_dir": "/tmp/elsewhere"})
    assert overridden.data_dir == "/tmp/elsewhere"
    assert overridden.storage.state == "sqlite:////tmp/elsewhere/hub.db"


def test_user_values_with_escaped_braces_are_substituted_once(write: WriteFiles) -> None:
    main = write({"main.yaml": "failure:\n  path: '{{data_dir}}/x.jsonl'\n"})
    assert load_config(main, env={}).failure.path == "{data_dir}/x.jsonl"


def test_log_level_setting_overrides_the_logging_section(write: WriteFiles) -> None:
    main = write({"main.yaml": "logging: {level: INFO}\n"})
    assert load_config(main, env={"CRAWLHUB_LOG_LEVEL": "debug"}).logging.level == "DEBUG"


def test_bad_log_level_setting_says_where_it_came_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path, env={"CRAWLHUB_LOG_LEVEL": "loud"})
    assert "log level 'loud' from environment CRAWLHUB_LOG_LEVEL" in str(info.value)
    assert "DEBUG, INFO, WARNING, ERROR" in str(info.value)


def test_settings_report_the_source_of_each_value(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("kafka_servers=127.0.0.1:9092\n")
    settings = load_settings(
        tmp_path, overrides={"token": "t"}, env={"CRAWLHUB_REDIS_URL": "redis://x/0"}
    )
    assert settings.get("KAFKA_SERVERS") == "127.0.0.1:9092"
    assert settings.source_of("kafka_servers") == f"{tmp_path / '.env'} (KAFKA_SERVERS)"
    assert settings.source_of("redis_url") == "environment CRAWLHUB_REDIS_URL"
    assert settings.source_of("token") == "--set token"
    assert settings.data_dir == "./crawlhub-data"
    assert settings.get("nothing") is None
