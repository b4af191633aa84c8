"""Every config error names file, entry and key, and says what was expected."""

from __future__ import annotations

import pytest

from crawlhub.config import load_config
from crawlhub.core.errors import ConfigError, ConfigErrors, SelectorError

from .conftest import WriteFiles


def only_error(write: WriteFiles, files: dict[str, str]) -> ConfigError:
    main = write(files)
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert not isinstance(info.value, ConfigErrors), str(info.value)
    return info.value


def where(err: ConfigError) -> tuple[str | None, str | None, str | None]:
    return err.file, err.entry, err.key


def test_bad_type_in_an_included_outbound(write: WriteFiles) -> None:
    err = only_error(
        write,
        {
            "main.yaml": "include: [config.d]\n",
            "config.d/b.yaml": """
                outbound:
                  - name: o_b_0
                  - name: o_b_1
                    retry_limits: five
                """,
        },
    )
    assert str(err) == (
        "file config.d/b.yaml, entry outbound[1] 'o_b_1', key 'retry_limits': "
        "expected an integer, got 'five'"
    )


def test_unknown_inbound_key_suggests_the_close_option(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "inbound:\n  - {name: in1, class: http, thread: 4}\n"})
    assert where(err) == ("main.yaml", "inbound[0] 'in1'", "thread")
    assert "unknown key 'thread' — did you mean 'threads'?" in str(err)


def test_unknown_top_level_key_suggests_the_section(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbounds:\n  - name: x\n"})
    assert where(err) == ("main.yaml", None, "outbounds")
    assert "unknown key 'outbounds' — did you mean 'outbound'?" in str(err)


def test_unknown_key_in_a_section(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "server:\n  prot: 80\n"})
    assert where(err) == ("main.yaml", "server", "prot")
    assert "did you mean 'port'?" in str(err)


@pytest.mark.parametrize(
    ("key", "suggested"),
    [
        ("retry_limit", "retry_limits"),
        ("selectors", "selector"),
        ("failback_status", "direct_failback_status"),
    ],
)
def test_outbound_key_close_to_an_option_is_not_taken_as_static_param(
    write: WriteFiles, key: str, suggested: str
) -> None:
    err = only_error(write, {"main.yaml": f"outbound:\n  - name: o1\n    {key}: 5\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'o1'", key)
    assert f"unknown key '{key}' — did you mean '{suggested}'?" in str(err)
    assert "Static task params must not look like option names" in str(err)


def test_outbound_static_param_named_like_a_builtin_task_key(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - name: o1\n    submitter: me\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'o1'", "submitter")
    assert "'submitter' is a built-in task key" in str(err)


def test_outbound_static_param_holding_a_mapping(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - name: o1\n    extra: {a: 1}\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'o1'", "extra")
    assert "holds a mapping" in str(err)


def test_missing_name_points_at_the_entry_by_index(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - {name: a}\n  - {class: queue}\n"})
    assert where(err) == ("main.yaml", "outbound[1]", "name")
    assert "required key is missing" in str(err)


def test_missing_inbound_class(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "inbound:\n  - name: in1\n"})
    assert where(err) == ("main.yaml", "inbound[0] 'in1'", "class")


def test_duplicate_name_points_at_the_second_occurrence(write: WriteFiles) -> None:
    err = only_error(
        write,
        {
            "main.yaml": "include: [config.d]\noutbound:\n  - name: dup\n",
            "config.d/a.yaml": "outbound:\n  - name: other\n  - name: dup\n",
        },
    )
    assert where(err) == ("main.yaml", "outbound[0] 'dup'", "name")
    assert "duplicate outbound name 'dup'" in str(err)
    assert "outbound[1] 'dup' in file config.d/a.yaml already uses it" in str(err)


def test_same_name_for_an_inbound_and_an_outbound_is_fine(write: WriteFiles) -> None:
    main = write({"main.yaml": "inbound: [{name: x, class: http}]\noutbound: [{name: x}]\n"})
    load_config(main, env={})


def test_failback_to_an_unknown_outbound(write: WriteFiles) -> None:
    err = only_error(
        write,
        {"main.yaml": "outbound:\n  - {name: main, failback: defualt}\n  - {name: default}\n"},
    )
    assert where(err) == ("main.yaml", "outbound[0] 'main'", "failback")
    assert "failback 'defualt' is not a defined outbound — did you mean 'default'?" in str(err)


def test_failback_to_itself(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - {name: loop, failback: loop}\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'loop'", "failback")
    assert "names this outbound itself" in str(err)


def test_bad_selector_is_a_selector_error_with_file_entry_and_index(write: WriteFiles) -> None:
    err = only_error(
        write,
        {
            "main.yaml": "include: [c.yaml]\n",
            "c.yaml": """
                inbound:
                  - name: logs
                    class: redis
                    selector:
                      - "task_src == 1"
                      - "task.__class__"
                """,
        },
    )
    assert isinstance(err, SelectorError)
    assert where(err) == ("c.yaml", "inbound[0] 'logs'", "selector[1]")


def test_selector_syntax_error_in_outbound(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - name: o\n    selector: 'a =='\n"})
    assert isinstance(err, SelectorError)
    assert where(err) == ("main.yaml", "outbound[0] 'o'", "selector[0]")


def test_bad_duration(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - {name: o, result_timeout: soon}\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'o'", "result_timeout")
    assert "invalid duration 'soon'" in str(err) and "'30s'" in str(err)


def test_port_out_of_range(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "server:\n  port: 70000\n"})
    assert (
        str(err) == "file main.yaml, entry server, key 'port': expected a value <= 65535, got 70000"
    )


def test_bad_value_inside_a_converter_list(write: WriteFiles) -> None:
    err = only_error(
        write, {"main.yaml": "inbound:\n  - {name: i, class: http, convert: [{init: {}}]}\n"}
    )
    assert where(err) == ("main.yaml", "inbound[0] 'i'", "convert.0.class")


def test_max_lag_zero_is_refused(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - {name: o, max_lag: 0}\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'o'", "max_lag")
    assert "-1 (unlimited) or >= 1" in str(err)


def test_outbound_section_written_as_a_mapping(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  name: o\n"})
    assert where(err) == ("main.yaml", "outbound", None)
    assert "expected a list of outbound entries" in str(err)


def test_entry_that_is_not_a_mapping(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "outbound:\n  - just_a_name\n"})
    assert where(err) == ("main.yaml", "outbound[0]", None)
    assert "expected a mapping with at least 'name'" in str(err)


def test_secret_values_are_not_echoed_in_errors(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "server:\n  token: [hunter2]\n"})
    assert where(err) == ("main.yaml", "server", "token")
    assert "hunter2" not in str(err)


def test_storage_url_with_unknown_scheme(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "storage:\n  queues: memory://x\n"})
    assert where(err) == ("main.yaml", "storage", "queues")
    assert "must start with one of sqlite://, redis://" in str(err)


def test_all_errors_are_collected_across_entries_and_files(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                include: [config.d]
                server:
                  port: 0
                outbound:
                  - name: o_main
                    failback: nowhere
                """,
            "config.d/a.yaml": """
                inbound:
                  - name: in_a
                    class: http
                    threads: 0
                outbound:
                  - name: o_a
                    retry_limits: -1
                    priority: high
                    url: '{missing_setting}'
                """,
        }
    )
    with pytest.raises(ConfigErrors) as info:
        load_config(main, env={})
    errors = info.value.errors
    assert [where(e) for e in errors] == [
        ("main.yaml", "server", "port"),
        ("config.d/a.yaml", "inbound[0] 'in_a'", "threads"),
        ("config.d/a.yaml", "outbound[0] 'o_a'", "url"),
        ("config.d/a.yaml", "outbound[0] 'o_a'", "priority"),
        ("config.d/a.yaml", "outbound[0] 'o_a'", "retry_limits"),
        ("main.yaml", "outbound[0] 'o_main'", "failback"),
    ]
    lines = str(info.value).splitlines()
    assert lines[0] == "config has 6 errors:"
    assert lines[1:] == [f"  {e}" for e in errors]


@pytest.mark.parametrize("value", ["[42]", "[true]", "['ok == 1', 3.5]", "[{task_src: 3}]"])
def test_a_selector_that_is_not_a_string_is_an_error(write: WriteFiles, value: str) -> None:
    err = only_error(write, {"main.yaml": f"outbound:\n  - name: o\n    selector: {value}\n"})
    assert where(err) == ("main.yaml", "outbound[0] 'o'", "selector")
    assert "not a string: a selector is a Python expression in quotes" in str(err)


def test_a_selector_that_is_a_number_on_an_inbound_is_an_error(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "inbound:\n  - {name: i, class: http, selector: 42}\n"})
    assert where(err) == ("main.yaml", "inbound[0] 'i'", "selector")
    assert "expected a list of selector expressions (strings), got 42" in str(err)


def test_an_empty_token_is_an_error_not_auth_off(write: WriteFiles) -> None:
    err = only_error(write, {"main.yaml": "server:\n  token: ''\n"})
    assert where(err) == ("main.yaml", "server", "token")
    assert "the token is empty" in str(err) and "token: null" in str(err)


def test_a_token_placeholder_that_resolves_empty_is_an_error(write: WriteFiles) -> None:
    main = write({"main.yaml": "server:\n  token: '{hub_token}'\n"})
    for env in ({"HUB_TOKEN": ""}, {"HUB_TOKEN": "   "}):
        with pytest.raises(ConfigError) as info:
            load_config(main, env=env)
        assert where(info.value) == ("main.yaml", "server", "token")
        assert "the token is empty" in str(info.value)


def test_no_token_at_all_still_means_no_auth(write: WriteFiles) -> None:
    for text in ("server: {port: 8000}\n", "server:\n  token: null\n"):
        assert load_config(write({"main.yaml": text}), env={}).server.token is None


def test_a_failback_cycle_without_a_route_limit_names_both_outbounds(write: WriteFiles) -> None:
    err = only_error(
        write,
        {
            "main.yaml": "include: [more.yaml]\noutbound:\n  - {name: b, failback: a}\n",
            "more.yaml": "outbound:\n  - {name: a, failback: b}\n",
        },
    )
    assert where(err) == ("more.yaml", "outbound[0] 'a'", "failback")
    assert "failback cycle 'a' -> 'b' -> 'a'" in str(err)
    assert "outbound[0] 'b' in main.yaml" in str(err)
    assert "routing.limits" in str(err)


def test_a_longer_failback_cycle_is_found_from_any_entry(write: WriteFiles) -> None:
    err = only_error(
        write,
        {
            "main.yaml": """
                outbound:
                  - {name: start, failback: x}
                  - {name: x, failback: y}
                  - {name: y, failback: z}
                  - {name: z, failback: x}
                """
        },
    )
    assert where(err) == ("main.yaml", "outbound[1] 'x'", "failback")
    assert "failback cycle 'x' -> 'y' -> 'z' -> 'x'" in str(err)


@pytest.mark.parametrize("limits", [0, 1, 10])
def test_a_finite_route_limit_covers_a_failback_cycle(write: WriteFiles, limits: int) -> None:
    main = write(
        {
            "main.yaml": f"""
                routing: {{limits: {limits}}}
                outbound:
                  - {{name: a, failback: b}}
                  - {{name: b, failback: a}}
                """
        }
    )
    assert [o.failback for o in load_config(main, env={}).outbound] == ["b", "a"]


def test_a_failback_chain_that_ends_is_fine(write: WriteFiles) -> None:
    main = write(
        {"main.yaml": "outbound:\n  - {name: a, failback: b}\n  - {name: b, failback: c}\n"
                      "  - {name: c}\n"}
    )
    assert load_config(main, env={}).routing.limits == -1
