"""The config schema: static params, durations, defaults, the examples and the seed layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from crawlhub.config import (
    CrawlhubConfig,
    OutboundConfig,
    default_config,
    dump_config,
    load_config,
    parse_duration,
)

from .conftest import WriteFiles

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_outbound_extra_scalar_keys_become_static_params() -> None:
    out = OutboundConfig.model_validate(
        {"name": "o", "task_src": 3, "task_type": "破码", "tags": ["a", 1], "note": None}
    )
    assert out.static_params == {"task_src": 3, "task_type": "破码", "tags": ["a", 1], "note": None}


def test_outbound_defaults() -> None:
    out = OutboundConfig.model_validate({"name": "o"})
    assert (out.class_, out.retry_limits, out.max_lag, out.task_params) == ("queue", 3, -1, None)


def test_single_strings_are_wrapped_into_lists() -> None:
    out = OutboundConfig.model_validate(
        {
            "name": "o",
            "selector": "a == 1",
            "task_params": "company_name",
            "dont_retry_status": 1404,
        }
    )
    assert out.selector == ["a == 1"]
    assert out.task_params == ["company_name"]
    assert out.dont_retry_status == [1404]


def test_bare_converter_strings_are_class_names(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": """
                inbound:
                  - name: i
                    class: http
                    convert: ['logstash.RemoveBuildinKeys', {class: 'ic.ExtractTaskParams', init: {x: 1}}]
                """
        }
    )
    convert = load_config(main, env={}).inbound[0].convert
    assert [(c.class_, c.init) for c in convert] == [
        ("logstash.RemoveBuildinKeys", {}),
        ("ic.ExtractTaskParams", {"x": 1}),
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        ("45", 45.0),
        ("30s", 30.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("3d", 259200.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        (" 6H ", 21600.0),
    ],
)
def test_parse_duration_accepts_numbers_and_unit_strings(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5x", "h", True, None, [1], -1, float("nan")])
def test_parse_duration_refuses_other_values_naming_them(text: object) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_durations_in_the_schema_are_seconds(write: WriteFiles) -> None:
    main = write(
        {"main.yaml": "routing: {result_timeout: 2h}\noutbound: [{name: o, result_timeout: 90}]\n"}
    )
    cfg = load_config(main, env={})
    assert cfg.routing.result_timeout == 7200.0
    assert cfg.outbound[0].result_timeout == 90.0


def test_default_config_is_http_into_one_catch_all_queue(tmp_path: Path) -> None:
    cfg = default_config(tmp_path)
    assert cfg.project == "crawlhub"
    assert [(i.name, i.class_, i.selector) for i in cfg.inbound] == [("http", "http", [])]
    assert [(o.name, o.class_, o.selector, o.init) for o in cfg.outbound] == [
        ("default", "queue", [], {"key": "default"})
    ]
    assert cfg.storage.queues == f"sqlite:///{tmp_path}/queues.db"
    assert cfg.storage.metadata == f"sqlite:///{tmp_path}/meta.db"
    assert cfg.failure.path == f"{tmp_path}/failures.jsonl"
    assert cfg.config_path is None


def test_default_config_uses_the_default_data_dir() -> None:
    cfg = default_config(env={})
    assert cfg.data_dir == "./crawlhub-data"
    assert cfg.storage.frontier == "sqlite:///./crawlhub-data/frontier.db"


def test_default_config_without_data_dir_reads_the_settings_layers(_empty_cwd: Path) -> None:
    (_empty_cwd / ".env").write_text("CRAWLHUB_LOG_LEVEL=warning\n")
    cfg = default_config(env={"CRAWLHUB_DATA_DIR": "/var/lib/crawlhub"})
    assert cfg.storage.queues == "sqlite:////var/lib/crawlhub/queues.db"
    assert cfg.logging.level == "WARNING"
    assert default_config(overrides={"data_dir": "/x"}, env={}).data_dir == "/x"


def test_taskhub_example_loads_with_its_env_file() -> None:
    cfg = load_config(EXAMPLES / "taskhub" / "main.yaml", env={})
    assert cfg.project == "taskhub_demo"
    assert [o.name for o in cfg.outbound] == ["zongju_captcha_ts3", "default"]
    captcha = cfg.outbound[0]
    assert captcha.source_file == "config.d/20_captcha.yaml"
    assert captcha.init == {"url": "redis://127.0.0.1:6379/0", "key": "captcha_spider"}
    assert captcha.static_params == {"task_src": 3, "task_type": "破码"}
    assert (captcha.priority, captcha.rt_priority, captcha.retry_limits) == (1000, 2000, 5)
    assert captcha.failback == "default"
    assert [i.name for i in cfg.inbound] == ["http", "spider_log"]
    assert cfg.inbound[1].derive is True
    assert cfg.routing.terminal_codes == [1000, 1101]


def test_minimal_example_loads() -> None:
    cfg = load_config(EXAMPLES / "minimal.yaml", env={})
    assert [o.name for o in cfg.outbound] == ["default"]


@pytest.mark.parametrize(("example", "env"), [
    ("taskhub/main.yaml", {}),
    ("jobs.yaml", {"DEMO_URL": "http://127.0.0.1:8001"}),  # a job's literal {id}
])
def test_dumped_example_loads_back_to_the_same_config(tmp_path: Path, example: str,
                                                      env: dict[str, str]) -> None:
    cfg = load_config(EXAMPLES / example, env=env)
    dumped = dump_config(cfg, redacted=False)
    copy = tmp_path / "dumped.yaml"
    copy.write_text(yaml.safe_dump(dumped, allow_unicode=True))
    again = load_config(copy, env={})
    assert dump_config(again, redacted=False) == dumped


SEED_MAIN = """
#子配置文件引用
include:
- config.d
#项目标识
project: "name_of_project"
#内置的http服务绑定的地址和端口
server:
  bind: '0.0.0.0'
  port: 8526
#路由基本设置
routing:
  #任务最大的路由次数
  limits: -1
  #任务终结状态码
  terminal_codes:
  - 1000
  - 1101
#失败任务记录
failure:
  path: '{failure_path}'
  compress: False
#任务输入设置
inbound:
#任务分发设置
outbound:
#日志设置
logging:
"""

SEED_INBOUND = """
inbound:
- name: 'spider_log'
  disable: False
  weight: 10
  selector:
  - "submitter == 'taskhub' and (company_name or credit_no or company_code) and int(task_src) in [1, 11, 5, 3, 22, 21, 7]"
  # AH 的老工商URL无法访问
  - "task_type == '找新' and detail_url and province != 'AH' and task_src == 0"
  # JS TL 找新无URL,但可以走老工商破码上线
  - "task_type == '找新' and province in ['JS', 'TJ', 'ZJ'] and task_result == 1000 and task_src == 0"
  - "task_type == '小微企业补充行业'"
  class: 'kafka.KafkaInbound'
  init:
    consumer_settings:
      # kafka服务地址
      bootstrap.servers: '{kafka_servers}'
      # 消费者组ID
      group.id: 'taskhub-project-ic'
    #爬虫日志的主题列表
    topics:
    - 'collie-ic-spider-business-log'
  convert:
  - class: 'logstash.RemoveBuildinKeys'
  - class: 'ic.ExtractTaskParams'
  - class: 'ic.CaptchaExtraItem'
  - class: 'ic.ChangeSearchKey'
  - class: 'ic.ParseSearchinfoItems'
  - class: 'ic.ParseNoticeItem'
  threads: 8
"""

SEED_OUTBOUND = """
outbound:
# 新成立及变更企业上线,指定更新维度
- name: 'zongju_captcha_ts3'
  # disable: True
  selector:
  - "task_src in [3] and not detail_url and data_type and task_parms['province'] == 'GD'"
  max_lag: -1
  retry_limits: 5
  token_scope: "*"
  class: 'redis_queue.RedisListOutbound'
  init:
    url: '{redis_url}'
    key: "captcha_spider"
  task_params:
  - company_name
  - company_code
  - company_key
  - credit_no
  - search_key
  - province
  - outbound
  - company_name_digest
  - search_id
  - change_id
  - data_type
  task_src: 3
  task_type: 破码
  priority: 1000
  rt_priority: 2000
"""


def test_seed_taskhub_layout_loads_unchanged(write: WriteFiles) -> None:
    main = write(
        {
            "main.yaml": SEED_MAIN,
            "config.d/sub_config_a.yaml": SEED_INBOUND,
            "config.d/sub_config_b.yaml": SEED_OUTBOUND,
        }
    )
    cfg = load_config(
        main,
        env={"KAFKA_SERVERS": "127.0.0.1:9092"},
        overrides={"failure_path": "/tmp/failures.jsonl", "redis_url": "redis://127.0.0.1:6379/0"},
    )
    inbound, outbound = cfg.inbound[0], cfg.outbound[0]
    assert inbound.class_ == "kafka.KafkaInbound"
    assert inbound.init["consumer_settings"]["bootstrap.servers"] == "127.0.0.1:9092"
    assert [c.class_ for c in inbound.convert][:2] == [
        "logstash.RemoveBuildinKeys",
        "ic.ExtractTaskParams",
    ]
    assert len(inbound.selector) == 4 and inbound.threads == 8
    assert outbound.class_ == "redis_queue.RedisListOutbound"
    assert outbound.static_params == {"task_src": 3, "task_type": "破码"}
    assert outbound.token_scope == "*"
    assert cfg.failure.path == "/tmp/failures.jsonl"
    assert (cfg.server.bind, cfg.server.port) == ("0.0.0.0", 8526)


def test_model_is_usable_without_the_loader() -> None:
    cfg = CrawlhubConfig.model_validate({"outbound": [{"name": "x", "class": "redis_list"}]})
    assert cfg.outbound[0].label == "outbound 'x'"
    assert cfg.outbound_named("x") is cfg.outbound[0]
    assert cfg.outbound_named("y") is None


def test_a_config_built_in_python_keeps_default_storage_under_its_data_dir(
        tmp_path: Path) -> None:
    """Without the loader, ``{data_dir}`` in default URLs is still filled in (before, a
    literal ``{data_dir}/`` folder appeared in the working directory)."""
    cfg = CrawlhubConfig.model_validate({"data_dir": str(tmp_path)})
    assert cfg.storage.queues == f"sqlite:///{tmp_path}/queues.db"
    assert cfg.storage.state == f"sqlite:///{tmp_path}/hub.db"
    assert cfg.storage.metadata == f"sqlite:///{tmp_path}/meta.db"
    assert cfg.storage.frontier == f"sqlite:///{tmp_path}/frontier.db"
    assert cfg.failure.path == f"{tmp_path}/failures.jsonl"
    mine = CrawlhubConfig.model_validate({"data_dir": str(tmp_path),
                                          "storage": {"queues": "redis://h:1/0"}})
    assert mine.storage.queues == "redis://h:1/0"
