"""``GET /frontier/`` and ``GET /frontier/{name}`` over real frontiers."""

from __future__ import annotations

from types import SimpleNamespace

import httpx2
from fastapi import FastAPI

from crawlhub.api import errors
from crawlhub.api.frontier import router
from crawlhub.frontier import Seed
from crawlhub.services import Services

from .conftest import MakeFrontier


class FrontiersOnly(SimpleNamespace):
    """Services with frontiers and nothing else."""

    frontier = Services.frontier


async def client_for(**frontiers: object) -> httpx2.AsyncClient:
    app = FastAPI()
    app.include_router(router)
    errors.install(app)  # the app's one mapping: an unknown frontier is a 404
    app.state.services = FrontiersOnly(frontiers=frontiers)
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t")


async def test_the_list_shows_every_frontier_with_segment_stats(
    make_frontier: MakeFrontier,
) -> None:
    news = await make_frontier("news")
    shop = await make_frontier("shop", segment="6h")
    await news.admit([Seed("http://a.com/1"), Seed("http://a.com/1#x")])
    async with await client_for(news=news, shop=shop) as client:
        response = await client.get("/frontier/")
    assert response.status_code == 200
    rows = {row["name"]: row for row in response.json()}
    assert set(rows) == {"news", "shop"}
    (segment,) = rows["news"]["segments"]
    assert (segment["admitted"], segment["duplicates"], segment["pending"]) == (1, 1, 1)
    assert rows["news"]["totals"]["admitted"] == 1
    assert rows["shop"]["config"]["segment"] == 21600


async def test_one_frontier_by_name_and_a_404_naming_the_known_ones(
    make_frontier: MakeFrontier,
) -> None:
    news = await make_frontier("news")
    async with await client_for(news=news) as client:
        ok = await client.get("/frontier/news")
        missing = await client.get("/frontier/nope")
    assert ok.status_code == 200 and ok.json()["name"] == "news"
    assert missing.status_code == 404
    assert "news" in missing.json()["detail"]
