"""Records a job writes carry what the README says they carry (issue 7, item 17)."""

from __future__ import annotations

from datetime import datetime

from crawlhub.collect.build import new_run
from crawlhub.collect.store import SqlMetadataStore
from tests.collect.conftest import LazyItems, ListSink, job_config
from tests.httpapi import ApiServer


async def test_written_records_carry_source_endpoint_and_fetched_at_only(
    store: SqlMetadataStore,
) -> None:
    sink = ListSink()
    async with ApiServer(items=LazyItems(5)) as api:  # type: ignore[arg-type]
        await new_run(job_config(api.url), store=store, sink=sink).run()
    row = sink.rows[0]
    assert row["source_endpoint"] == "/items"
    assert datetime.fromisoformat(row["fetched_at"]).utcoffset() is not None
    assert "source_file" not in row  # README: set only by records that bring one
