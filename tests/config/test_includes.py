"""include: folders in filename order, lists concatenated, including file last, cycles."""

from __future__ import annotations

import pytest

from crawlhub.config import load_config
from crawlhub.core.errors import ConfigError

from .conftest import WriteFiles


def names(entries: list) -> list[str]:
    return [e.name for e in entries]


def test_folder_include_orders_files_by_name_and_keeps_order_within_each_file(
    write: WriteFiles,
) -> None:
    # The seed's example: o_a_1, then o_b_2 and o_b_1 in file order.
    main = write(
        {
            "main.yaml": """
                include:
                  - config.d
                """,
            "config.d/sub_config_b.yaml": """
                outbound:
                  - name: o_b_2
                  - name: o_b_1
                """,
            "config.d/sub_config_a.yaml": """
                outbound:
                  - name: o_a_1
                """,
            "config.d/notes.txt": "not yaml, ignored",
            "config.d/.hidden.yaml": "outbound: [{name: hidden}]",
        }
    )
    cfg = load_config(main, env={})
    assert names(cfg.outbound) == ["o_a_1", "o_b_2", "o_b_1"]


def test_included_entries_come_before_the_including_files_own(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                include: [first.yaml, second.yml]
                inbound:
                  - {name: main_in, class: http}
                outbound:
                  - name: main_out
                """,
            "first.yaml": """
                inbound:
                  - {name: first_in, class: http}
                outbound:
                  - name: first_out
                """,
            "second.yml": """
                outbound:
                  - name: second_out
                """,
        }
    )
    cfg = load_config(main, env={})
    assert names(cfg.outbound) == ["first_out", "second_out", "main_out"]
    assert names(cfg.inbound) == ["first_in", "main_in"]


def test_nested_includes_resolve_relative_to_the_including_file(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": "include: [sub/level1.yaml]\n",
            "sub/level1.yaml": """
                include: [deeper]
                outbound:
                  - name: level1
                """,
            "sub/deeper/10_x.yaml": "outbound: [{name: level2_x}]\n",
            "sub/deeper/20_y.yaml": "outbound: [{name: level2_y}]\n",
        }
    )
    cfg = load_config(main, env={})
    assert names(cfg.outbound) == ["level2_x", "level2_y", "level1"]
    assert cfg.files == [
        "main.yaml",
        "sub/level1.yaml",
        "sub/deeper/10_x.yaml",
        "sub/deeper/20_y.yaml",
    ]


def test_entries_remember_their_file_and_index_within_it(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": "include: [config.d]\noutbound: [{name: own}]\n",
            "config.d/b.yaml": "outbound: [{name: o_b_0}, {name: o_b_1}]\n",
        }
    )
    cfg = load_config(main, env={})
    located = [(o.source_file, o.source_index, o.label) for o in cfg.outbound]
    assert located == [
        ("config.d/b.yaml", 0, "outbound[0] 'o_b_0'"),
        ("config.d/b.yaml", 1, "outbound[1] 'o_b_1'"),
        ("main.yaml", 0, "outbound[0] 'own'"),
    ]


def test_include_cycle_is_an_error_showing_the_chain(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": "include: [a.yaml]\n",
            "a.yaml": "include: [b.yaml]\n",
            "b.yaml": "include: [main.yaml]\n",
        }
    )
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    err = info.value
    assert err.file == "b.yaml"
    assert err.key == "include"
    assert "include cycle: main.yaml -> a.yaml -> b.yaml -> main.yaml" in str(err)


def test_a_file_including_itself_is_a_cycle(write: WriteFiles) -> None:
    main = write({"main.yaml": "include: [main.yaml]\n"})
    with pytest.raises(ConfigError, match="include cycle: main.yaml -> main.yaml"):
        load_config(main, env={})


def test_missing_include_names_the_including_file_and_the_path(write: WriteFiles) -> None:
    main = write({"main.yaml": "include: [config.d, nope.yaml]\n", "config.d/a.yaml": ""})
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert info.value.file == "main.yaml"
    assert info.value.key == "include[1]"
    assert "'nope.yaml' does not exist" in str(info.value)
    assert "relative to the including file" in str(info.value)


def test_including_file_overrides_included_mapping_keys_and_scalars(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                include: [base.yaml, site.yaml]
                project: main_project
                server:
                  port: 9000
                """,
            "base.yaml": """
                project: base_project
                submitter: base_submitter
                server:
                  bind: 0.0.0.0
                  port: 8000
                routing:
                  limits: 5
                """,
            "site.yaml": """
                routing:
                  terminal_codes: [1000, 1101]
                """,
        }
    )
    cfg = load_config(main, env={})
    assert cfg.project == "main_project"  # including file wins
    assert cfg.submitter == "base_submitter"  # only the include sets it
    assert (cfg.server.bind, cfg.server.port) == ("0.0.0.0", 9000)  # merged key by key
    assert (cfg.routing.limits, cfg.routing.terminal_codes) == (5, [1000, 1101])


def test_later_include_overrides_earlier_include(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": "include: [conf]\n",
            "conf/10.yaml": "server: {port: 1111}\n",
            "conf/20.yaml": "server: {port: 2222}\n",
        }
    )
    assert load_config(main, env={}).server.port == 2222


def test_error_in_an_overridden_key_points_at_the_file_that_set_it(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": "include: [base.yaml]\nserver: {bind: 127.0.0.1}\n",
            "base.yaml": "server: {port: 99999}\n",
        }
    )
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert (info.value.file, info.value.entry, info.value.key) == ("base.yaml", "server", "port")


def test_empty_sections_and_empty_files_mean_defaults(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                include: [empty.yaml]
                inbound:
                outbound:
                logging:
                """,
            "empty.yaml": "",
        }
    )
    cfg = load_config(main, env={})
    assert cfg.inbound == [] and cfg.outbound == []
    assert cfg.logging.level == "INFO"
    assert cfg.include == []


def test_invalid_yaml_names_the_file_and_line(write: WriteFiles) -> None:
    main = write({"main.yaml": "include: [bad.yaml]\n", "bad.yaml": "outbound:\n  - name: [x\n"})
    with pytest.raises(ConfigError) as info:
        load_config(main, env={})
    assert info.value.file == "bad.yaml"
    assert "invalid YAML at line" in str(info.value)


def test_missing_main_file_says_so(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist: pass the path of a YAML config file"):
        load_config(tmp_path / "absent.yaml", env={})
