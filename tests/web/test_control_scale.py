"""The control plane's pages at the issue's scale: 1,000 jobs and 100,000 runs. Each page
reads one page of rows through an index (keyset, never an offset), so it shows its page
size and its paging links whatever the table holds. No timing is asserted; the test
prints how long each page took."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx2

from crawlhub.app.asgi import create_app
from crawlhub.config.schema import CrawlhubConfig
from crawlhub.control.jobs import JobSpec
from crawlhub.control.jobs.store import HOST
from crawlhub.services import Services

JOBS = 1_000
RUNS = 100_000


async def test_the_pages_stay_a_page_long_at_1000_jobs_and_100000_runs(tmp_path: Path) -> None:
    config = CrawlhubConfig.model_validate({
        "data_dir": str(tmp_path), "control": {"scheduler": False},
        "storage": {"queues": f"sqlite:///{tmp_path}/q.db", "state": f"sqlite:///{tmp_path}/h.db"},
        "outbound": [{"name": "default", "init": {"key": "default"}}]})
    svc = await Services.open(config)
    assert svc.control is not None
    store = svc.control.jobs.store
    started = time.perf_counter()
    now = time.time()
    await store.db.executemany(
        f"INSERT INTO {store.jobs} (name, kind, spec, next_fire, created_at, updated_at)"
        " VALUES ($1, $2, $3, $4, $5, $5)",
        [(f"job-{i:04}", "subprocess", JobSpec(name=f"job-{i:04}", command=["true"],
                                              cron="*/5 * * * *").model_dump_json(),
          now + 300, now) for i in range(JOBS)])
    # run ids sort by start time like the runner's (r + milliseconds in hex + a suffix)
    t0 = int((now - RUNS) * 1000)
    await store.db.executemany(
        f"INSERT INTO {store.runs} (id, job, kind, status, trigger_, host, pid,"
        " scheduled_for, started_at, finished_at, heartbeat_at, exit_code, error, counters,"
        " version) VALUES ($1, $2, 'subprocess', $3, 'cron', $4, NULL, NULL, $5, $6, $6,"
        " $7, NULL, $8, NULL)",
        [(f"r{t0 + i * 1000:011x}{i % 4096:03x}000", f"job-{i % JOBS:04}",
          "failed" if i % 10 == 0 else "succeeded", HOST, (t0 + i * 1000) / 1000,
          (t0 + i * 1000) / 1000 + 0.5, 1 if i % 10 == 0 else 0,
          json.dumps({"success": i % 100})) for i in range(RUNS)])
    filled = time.perf_counter() - started
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(services=svc)),
                                base_url="http://crawlhub.test")
    timings = {}

    async def get(path: str) -> str:
        began = time.perf_counter()
        r = await client.get(path)
        timings[path] = time.perf_counter() - began
        assert r.status_code == 200, (path, r.text[:500])
        return r.text

    def rows(text: str, table: str) -> list[str]:
        body = text.split(f'id="{table}"', 1)[1].split("</table>", 1)[0]
        return re.findall(r'<tr data-key="([^"]*)"', body)

    try:
        jobs = await get("/ui/jobs")
        assert rows(jobs, "jobs") == [f"job-{i:04}" for i in range(100)]
        assert 'rel="next" href="?after=job-0099"' in jobs
        middle = await get("/ui/jobs?after=job-0499")
        assert rows(middle, "jobs")[0] == "job-0500" and 'rel="first"' in middle
        assert 'rel="next" href="?after=job-0599"' in middle
        last = await get("/ui/jobs?after=job-0899")
        assert len(rows(last, "jobs")) == 100 and 'rel="next"' not in last

        runs = await get("/ui/runs")
        newest = rows(runs, "runs")
        assert len(newest) == 50 and newest == sorted(newest, reverse=True)
        older = re.search(r'rel="next" href="\?before=(r[0-9a-f]+)"', runs)
        assert older and older[1] == newest[-1]
        page2 = await get(f"/ui/runs?before={older[1]}")
        assert rows(page2, "runs")[0] < newest[-1] and 'rel="first"' in page2
        failed = await get("/ui/runs?status=failed")
        assert len(rows(failed, "runs")) == 50 and 'rel="next"' in failed

        job = await get("/ui/job/job-0500")
        runs_of_job = rows(job, "runs")
        assert len(runs_of_job) == 50 and 'rel="next" href="?run_before=' in job
        assert await get("/ui/runs?job=job-0500")  # the same through the runs page
        assert await get(f"/ui/run/{runs_of_job[0]}")
        assert await get("/")  # the overview's cards read them too
    finally:
        await client.aclose()
        await svc.close()
    print(f"\n{JOBS} jobs and {RUNS} runs inserted in {filled:.1f} s; pages: "
          + ", ".join(f"{path} {took * 1000:.0f} ms" for path, took in timings.items()))
