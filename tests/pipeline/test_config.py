"""Pipeline settings: seed defaults, per-job overrides, layers, and errors naming key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from crawlhub.config.schema import CrawlhubConfig
from crawlhub.config.settings import load_settings
from crawlhub.fetch import RequestScheduler
from crawlhub.pipeline import (
    PipelineConfig,
    PipelineConfigError,
    cli_overrides,
    resolve_pipeline_config,
)


def test_defaults_are_the_seeds() -> None:
    cfg = resolve_pipeline_config()
    assert (cfg.workers, cfg.queue_size, cfg.batch_size) == (2, 100, 100)
    assert (cfg.batch_timeout, cfg.rate_min, cfg.rate_max) == (5.0, 5.0, 20.0)
    assert cfg.max_consecutive_failures == 10 and cfg.tries == 3


def test_a_job_override_wins_and_other_keys_fall_back_to_the_global_ones() -> None:
    section = {"workers": 3, "batch_size": 50, "orders": {"workers": 8}}
    orders = resolve_pipeline_config(section, "orders")
    other = resolve_pipeline_config(section, "refunds")
    assert (orders.workers, orders.batch_size) == (8, 50)
    assert (other.workers, other.batch_size) == (3, 50)


def test_layers_go_dotenv_then_dotenv_local_then_environment_then_cli(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "CRAWLHUB_PIPELINE__WORKERS=3\nCRAWLHUB_PIPELINE__BATCH_SIZE=30\n"
        "CRAWLHUB_PIPELINE__RATE_MIN=1\nCRAWLHUB_PIPELINE__RATE_MAX=9\n"
    )
    (tmp_path / ".env.local").write_text(
        "CRAWLHUB_PIPELINE__BATCH_SIZE=40\nCRAWLHUB_PIPELINE__QUEUE_SIZE=400\n"
    )
    environ = {"CRAWLHUB_PIPELINE__QUEUE_SIZE": "500", "CRAWLHUB_PIPELINE__RATE_MAX": "8"}
    settings = load_settings(tmp_path, env=environ, cwd=tmp_path)
    section = {"workers": 1, "batch_timeout": 2}
    cfg = resolve_pipeline_config(section, "orders", settings, cli_overrides(rate_max=7))
    assert cfg.batch_timeout == 2.0  # config file
    assert cfg.workers == 3  # .env beats the config file
    assert cfg.batch_size == 40  # .env.local beats .env
    assert cfg.queue_size == 500  # environment beats .env.local
    assert cfg.rate_min == 1.0 and cfg.rate_max == 7.0  # CLI beats the environment


def test_per_job_keys_come_from_any_layer(tmp_path: Path) -> None:
    environ = {"CRAWLHUB_PIPELINE__ORDERS__WORKERS": "6", "pipeline.orders.batch_size": "12"}
    cfg = resolve_pipeline_config({"workers": 2}, "orders", environ, {"workers": 4})
    assert cfg.workers == 6  # pipeline.<job>.* wins over a global value, even from the CLI
    assert cfg.batch_size == 12
    assert resolve_pipeline_config({"workers": 2}, "other", environ, {"workers": 4}).workers == 4
    assert resolve_pipeline_config({}, "orders", None, {"orders.workers": 9}).workers == 9


@pytest.mark.parametrize(
    ("values", "key", "shown"),
    [
        ({"workers": 0}, "pipeline.workers", "value 0"),
        ({"queue_size": 0}, "pipeline.queue_size", "value 0"),
        ({"batch_size": 0}, "pipeline.batch_size", "value 0"),
        ({"workers": "many"}, "pipeline.workers", "value 'many'"),
        ({"batch_timeout": -1}, "pipeline.batch_timeout", "value -1"),
        ({"rate_min": 30, "rate_max": 10}, "pipeline.rate_min", "value 30.0"),
        ({"orders": {"queue_size": -2}}, "pipeline.orders.queue_size", "value -2"),
    ],
)
def test_bad_values_are_value_errors_naming_key_and_value(
    values: dict[str, object], key: str, shown: str
) -> None:
    with pytest.raises(ValueError) as err:
        resolve_pipeline_config(values, "orders")
    assert isinstance(err.value, PipelineConfigError)
    assert f"key '{key}'" in str(err.value)
    assert shown in str(err.value)


def test_rate_min_above_rate_max_says_how_to_fix_it() -> None:
    with pytest.raises(ValueError, match=r"greater than pipeline\.rate_max=10\.0.*set rate_min <= rate_max"):
        resolve_pipeline_config({"rate_min": 30, "rate_max": 10})


def test_an_error_names_where_the_value_came_from() -> None:
    with pytest.raises(PipelineConfigError, match=r"value '0' \(from CRAWLHUB_PIPELINE__WORKERS\)"):
        resolve_pipeline_config({}, None, {"CRAWLHUB_PIPELINE__WORKERS": "0"})
    with pytest.raises(PipelineConfigError, match=r"from CLI --pipeline-batch-size"):
        resolve_pipeline_config({}, None, None, cli_overrides(batch_size=0))


def test_a_job_rate_range_above_the_global_max_is_caught_after_layering() -> None:
    with pytest.raises(PipelineConfigError, match=r"pipeline\.orders\.rate_min"):
        resolve_pipeline_config({"rate_max": 10, "orders": {"rate_min": 15}}, "orders")
    cfg = resolve_pipeline_config({"rate_max": 60, "orders": {"rate_min": 15}}, "orders")
    assert (cfg.rate_min, cfg.rate_max) == (15.0, 60.0)


def test_an_unknown_key_is_an_error_with_a_suggestion() -> None:
    with pytest.raises(PipelineConfigError, match="did you mean 'batch_size'"):
        resolve_pipeline_config({"batchsize": 10})


def test_the_config_file_section_holds_global_and_job_keys() -> None:
    config = CrawlhubConfig.model_validate({"pipeline": {"workers": 4, "orders": {"workers": 6}}})
    assert resolve_pipeline_config(config.pipeline, "orders").workers == 6
    assert config.model_dump()["pipeline"] == {"workers": 4, "orders": {"workers": 6}}
    with pytest.raises(ValueError, match=r"pipeline\.workers"):
        CrawlhubConfig.model_validate({"pipeline": {"workers": 0}})


def test_a_scheduler_is_built_from_a_pipeline_config() -> None:
    cfg = PipelineConfig(rate_min=1, rate_max=2, mode="concurrent", scope="domain",
                         concurrency=3, rate_per_second=5)
    scheduler = RequestScheduler.from_config(cfg)
    assert (scheduler.mode, scheduler.scope, scheduler.concurrency) == ("concurrent", "domain", 3)
    assert (scheduler.rate_min, scheduler.rate_max, scheduler.rate_per_second) == (1, 2, 5)
