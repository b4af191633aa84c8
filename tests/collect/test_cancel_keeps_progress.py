"""Cancelling a run never loses saved progress: not before the total answers, not while
the detail stage runs, not with SIGKILL (issue 7, items 15 and 16)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from crawlhub.collect.build import new_run
from crawlhub.collect.service import metadata_url_for
from crawlhub.collect.store import SqlMetadataStore, open_metadata_store
from crawlhub.config.loader import load_config
from crawlhub.fetch.retry import RetryPolicy
from crawlhub.pipeline.result import Status
from tests.collect.conftest import LazyItems, ListSink, job_config, list_offsets
from tests.httpapi import DATE_FORMAT, ApiServer, Fault

FAST_RETRY = RetryPolicy(tries=2, backoff_base=0.001, jitter=0, error_field="code",
                         ok_values=(0,))


def is_total_probe(request: Any) -> bool:
    return request.path == "/items" and request.query.get("limit") == "1"


async def stopped_midway(api: ApiServer, store: SqlMetadataStore, sink: ListSink) -> None:
    """A first run stopped while offset 500 hangs: 900..600 delivered, 500 is next."""
    api.inject(Fault.slow(30), when=lambda r: r.query.get("offset") == "500")
    run = new_run(job_config(api.url), store=store, sink=sink, retry=FAST_RETRY)
    task = asyncio.create_task(run.run())
    await api.wait_for_requests(6)  # total, 900, 800, 700, 600, 500 (hangs)
    run.token.cancel("manual stop")
    assert (await task).status is Status.CANCELLED
    api.clear_faults()


async def test_a_stop_before_the_total_answers_keeps_the_saved_progress(
    any_store: SqlMetadataStore,
) -> None:
    store = any_store
    sink = ListSink()
    async with ApiServer(items=LazyItems(1000)) as api:  # type: ignore[arg-type]
        await stopped_midway(api, store, sink)
        before = await store.load_progress("news")
        assert before is not None and before.saved_offset == 500

        api.inject(Fault.slow(30), when=is_total_probe)
        run = new_run(job_config(api.url), store=store, sink=sink, retry=FAST_RETRY)
        task = asyncio.create_task(run.run())
        await api.wait_for_requests(len(api.log) + 1)  # the total probe hangs
        run.token.cancel("manual stop")
        assert (await task).status is Status.CANCELLED
        after = await store.load_progress("news")
        assert after is not None
        assert (after.state, after.saved_offset, after.start_offset, after.last_total) == (
            before.state, before.saved_offset, before.start_offset, before.last_total)
        assert after.status == "CANCELLED" and after.run_id is None

        api.clear_faults()
        api.log.clear()
        third = await new_run(job_config(api.url), store=store, sink=sink,
                              retry=FAST_RETRY).run()
        offsets = list_offsets(api)
    assert third.status is Status.SUCCEEDED
    assert offsets == [(0, 1)] + [(o, 100) for o in range(500, -1, -100)]  # no re-read
    assert sorted(sink.rows) == list(range(1000))


async def test_a_failed_total_probe_keeps_the_saved_progress(store: SqlMetadataStore) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(1000)) as api:  # type: ignore[arg-type]
        await stopped_midway(api, store, sink)
        before = await store.load_progress("news")
        api.inject(Fault.http(503), times=None, when=is_total_probe)
        failed = await new_run(job_config(api.url), store=store, sink=sink,
                               retry=FAST_RETRY).run()
        after = await store.load_progress("news")
    assert failed.status is Status.FAILED
    assert before is not None and after is not None
    assert (after.state, after.saved_offset) == (before.state, before.saved_offset)


# ---- the detail stage, stopped from the command line -----------------------------------------
def detail_config(tmp_path: Path, url: str) -> Path:
    cfg = {
        "data_dir": str(tmp_path / "data"),
        "jobs": [{
            "name": "deals",
            "source": {"url": f"{url}/items", "items_path": "items", "total_path": "total",
                       "date_field": "date", "date_format": DATE_FORMAT,
                       "error_field": "code", "ok_values": [0]},
            "strategy": {"type": "incremental", "batch_size": 10},
            "detail": {"enabled": True, "url": f"{url}/items/{{{{id}}}}", "item_path": "item"},
            "pipeline": {"rate_min": 0, "rate_max": 0, "progress_interval": 0,
                         "batch_size": 5, "batch_timeout": 0.05},
            "sink": {"type": "jsonl", "path": str(tmp_path / "deals.jsonl")},
        }],
    }
    path = tmp_path / "crawlhub.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def with_details(path: Path) -> set[int]:
    """Ids whose detail record is in the JSON lines file."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["id"] for row in rows if row.get("detail")}


async def interrupted_in_details(tmp_path: Path, sig: signal.Signals) -> tuple[Path, str]:
    """Run ``crawlhub collect deals`` until details reach id 24 (it hangs), send ``sig``."""
    items = LazyItems(40)
    async with ApiServer(items=items) as api:  # type: ignore[arg-type]
        cfg_path = detail_config(tmp_path, api.url)
        api.inject(Fault.slow(120), when=lambda r: r.path == "/items/24")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from crawlhub.cli import main; main()",
            "collect", "deals", "-c", str(cfg_path), "--no-progress", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            while not api.requests_to("/items/24"):
                await api.wait_for_requests(len(api.log) + 1, timeout=60)
            proc.send_signal(sig)
            stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert with_details(tmp_path / "deals.jsonl") < set(range(40))
        api.clear_faults()
        api.log.clear()
        cfg = load_config(cfg_path)
        store = await open_metadata_store(metadata_url_for(cfg))
        try:
            pending = await store.detail_ids("deals")
            assert 24 in pending
            again = await new_run(cfg.jobs[0], store=store, config=cfg).run()
            assert await store.detail_ids("deals") == []
        finally:
            await store.close()
        fetched = sorted(int(r.path.rsplit("/", 1)[1]) for r in api.requests_to("/items/"))
    assert again.status is Status.SUCCEEDED
    assert fetched == sorted(pending)  # the next run fetches exactly what was left
    assert with_details(tmp_path / "deals.jsonl") == set(range(40))
    return cfg_path, stdout.decode()


async def test_ctrl_c_in_the_detail_stage_keeps_the_ids_for_the_next_run(tmp_path: Path) -> None:
    _, stdout = await interrupted_in_details(tmp_path, signal.SIGINT)
    result = json.loads(stdout)
    assert result["status"] == "CANCELLED"
    assert result["detail"]["pending"] >= 1 and result["detail"]["skipped"] == 0
    assert result["detail"]["ok"] + result["detail"]["pending"] == 40


@pytest.mark.slow
async def test_sigkill_in_the_detail_stage_keeps_the_ids_for_the_next_run(tmp_path: Path) -> None:
    await interrupted_in_details(tmp_path, signal.SIGKILL)
