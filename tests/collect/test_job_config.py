"""The job config model: defaults, durations, and errors that name the job and the key."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from crawlhub.collect.build import job_pipeline_config
from crawlhub.collect.config import CollectJobConfig, load_job
from crawlhub.config.loader import load_config
from crawlhub.core.errors import ConfigError

SOURCE = {"url": "http://127.0.0.1:1/items", "date_field": "date"}


def test_defaults_follow_seed_000() -> None:
    job = CollectJobConfig.model_validate({"name": "n", "source": SOURCE})
    assert (job.strategy.type, job.strategy.batch_size, job.strategy.max_expired_batches) == (
        "incremental", 100, 3)
    assert job.enabled and not job.auto_start
    assert job.source.pagination.type == "offset"


def test_durations_take_units_and_iso_8601() -> None:
    job = CollectJobConfig.model_validate({"name": "n", "source": {
        **SOURCE, "pagination": {"window": "2d", "segment": "PT30M"}},
        "strategy": {"type": "window"}})
    assert job.source.pagination.window == timedelta(days=2)
    assert job.source.pagination.segment == timedelta(minutes=30)
    again = CollectJobConfig.model_validate(job.model_dump(mode="json"))
    assert again == job


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"strategy": {"batch_size": 0}}, "strategy.batch_size"),
        ({"source": {**SOURCE, "url": "ftp://x"}}, "source.url"),
        ({"detail": {"enabled": True, "url": "http://x/items"}}, "detail"),
        ({"source": {**SOURCE, "pagination": {"type": "page"}}}, None),
        ({"strategy": {"bogus": 1}}, "strategy.bogus"),
    ],
)
def test_errors_name_the_job_and_the_key(change: dict, key: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        load_job({"name": "orders", "source": SOURCE, **change}, file="jobs.yaml", index=2)
    assert info.value.entry == "jobs[2] 'orders'"
    assert info.value.file == "jobs.yaml"
    if key:
        assert info.value.key == key


def test_incremental_needs_offset_pagination() -> None:
    with pytest.raises(ConfigError, match="needs source.pagination.type offset"):
        load_job({"name": "x", "source": {**SOURCE, "pagination": {"type": "page"}}})


def test_a_config_file_with_a_bad_job_names_its_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("jobs:\n  - name: news\n    source: {url: 'http://127.0.0.1:1/x'}\n"
                    "    strategy: {batch_size: -5}\n")
    with pytest.raises(ConfigError, match="batch_size"):
        load_config(path)


def test_job_pipeline_settings_layer_global_job_section_and_cli() -> None:
    job = CollectJobConfig.model_validate({"name": "news", "source": SOURCE,
                                    "pipeline": {"workers": 3},
                                    "scheduler": {"rate_min": 1, "rate_max": 2}})
    cfg = job_pipeline_config(job, {"workers": 5, "batch_size": 50, "news": {"queue_size": 7}},
                              cli={"batch_size": 20})
    assert (cfg.workers, cfg.queue_size, cfg.batch_size) == (3, 7, 20)
    assert (cfg.rate_min, cfg.rate_max) == (1, 2)


def test_the_example_jobs_file_loads() -> None:
    cfg = load_config(Path(__file__).parents[2] / "examples" / "jobs.yaml")
    assert [j.name for j in cfg.jobs] == ["news", "orders"]
    assert cfg.jobs[0].detail.url is not None and cfg.jobs[0].detail.url.endswith("/{id}")
