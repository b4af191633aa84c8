"""``crawlhub frontier``: show a URL's key and why, per-segment stats, add seeds from a
file or stdin (JSON lines, a JSON array, or one URL per line) with a progress bar."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crawlhub.core import jsoncodec
from crawlhub.core.errors import CrawlhubError, FrontierError
from crawlhub.frontier import Frontier, KeyResolver, Seed, open_frontiers, segment_resolver
from crawlhub.frontier.config import FrontierConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Frontier: dedup keys, per-segment stats, adding seeds.",
)
out = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", envvar="CRAWLHUB_CONFIG", help="YAML config file."),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", envvar="CRAWLHUB_DATA_DIR", help="Where embedded data lives."),
]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="Setting name=value (highest layer).")
]
NameOpt = Annotated[str | None, typer.Option("--name", "-n", help="Frontier name.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]

_BATCH = 1000
_SHOWN = 20  # invalid lines listed one by one; the rest are counted


def _config(config: Path | None, data_dir: Path | None, sets: list[str] | None) -> Any:
    from crawlhub.cli import get_config

    return get_config(config, data_dir, sets)


def _pick(cfg: Any, name: str | None) -> tuple[str | None, FrontierConfig]:
    frontiers: dict[str, FrontierConfig] = dict(cfg.frontier or {})
    if name is not None:
        if name not in frontiers:
            known = ", ".join(sorted(frontiers)) or "none"
            err.print(f"no frontier named {name!r} in the config (known: {known})")
            raise typer.Exit(2)
        return name, frontiers[name]
    if len(frontiers) == 1:
        only = next(iter(frontiers))
        return only, frontiers[only]
    if frontiers:
        err.print(f"the config has several frontiers ({', '.join(sorted(frontiers))}): "
                  "choose one with --name")
        raise typer.Exit(2)
    return None, FrontierConfig()


# ---------------------------------------------------------------------------- key
@app.command()
def key(
    url: Annotated[str, typer.Argument(help="The URL to resolve.")],
    config: ConfigOpt = None,
    name: NameOpt = None,
    method: Annotated[str, typer.Option(help="HTTP method (matters with include_method).")] = "GET",
    body: Annotated[str | None, typer.Option(help="Request body (matters with include_body).")] = None,
    data_dir: DataDirOpt = None,
    sets: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the dedup key of URL and why.

    Prints the key, the segment it falls in now, and why the key looks like that.
    """
    cfg = _config(config, data_dir, sets) if config is not None else None
    fname, fc = _pick(cfg, name) if cfg is not None else (None, FrontierConfig())
    try:
        resolver = KeyResolver(fc.key)
        seed = Seed(url, method=method, body=body)
        explanation = resolver.explain(seed)
        segments = segment_resolver(fc)
    except CrawlhubError as exc:
        err.print(str(exc), highlight=False, markup=False)
        raise typer.Exit(2) from None
    import time

    segment = segments.segment_of(seed, time.time())
    if as_json:
        out.print_json(data={
            "key": explanation.key,
            "canonical_url": explanation.canonical_url,
            "frontier": fname,
            "segment": segment,
            "segment_label": segments.label(segment),
            "steps": explanation.steps,
        })
        return
    where = f"frontier {fname!r}" if fname else "default rules (no frontier configured)"
    lines = [
        f"key:      {explanation.key}",
        f"segment:  {segment} ({segments.label(segment)}), {where}",
        "why:",
        *(f"  - {step}" for step in explanation.steps),
    ]
    for line in lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


# ---------------------------------------------------------------------------- stats
@app.command()
def stats(
    config: ConfigOpt = None,
    name: NameOpt = None,
    data_dir: DataDirOpt = None,
    sets: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per-segment stats of every frontier (or --name).

    Admitted, duplicates, pending, leased, done, failed, dispatched."""
    cfg = _config(config, data_dir, sets)
    if not cfg.frontier:
        err.print("the config defines no frontier: add a 'frontier:' section")
        raise typer.Exit(2)
    if name is not None:
        _pick(cfg, name)
    rows = asyncio.run(_stats(cfg, name))
    if as_json:
        out.print_json(data=rows)
        return
    for frontier in rows:
        table = Table(title=f"frontier {frontier['name']} ({frontier['backend']}), "
                      f"current segment {frontier['current_label']}", title_justify="left",
                      collapse_padding=True)  # eight columns in 80 characters, none cut
        columns = ("admitted", "duplicates", "pending", "leased", "done", "failed",
                   "dispatched")
        table.add_column("segment", no_wrap=True)
        for column in columns:
            table.add_column(column, justify="right")
        for row in frontier["segments"]:
            table.add_row(row["label"], *(str(row[c]) for c in columns))
        table.add_row("total", *(str(frontier["totals"][c]) for c in columns), style="bold")
        out.print(table)


async def _stats(cfg: Any, name: str | None) -> list[dict[str, Any]]:
    frontiers = open_frontiers(cfg)
    rows = []
    try:
        for fname, frontier in frontiers.items():
            if name is None or fname == name:
                rows.append(await frontier.describe())
    finally:
        for frontier in frontiers.values():
            await frontier.close()
    return rows


# ---------------------------------------------------------------------------- add
@app.command()
def add(
    file: Annotated[str, typer.Argument(help="File of seeds, or - for stdin.")] = "-",
    name: NameOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    sets: SetOpt = None,
) -> None:
    """Admit seeds from a file or stdin.

    JSON lines ({"url": ..., "priority": ..., "not_before": ...}), a
    JSON array of such objects, or one http(s) URL per line. Prints admitted and
    duplicates; lines that are not seeds with an http(s) URL are listed on stderr with
    their line numbers, nothing is admitted for them, and the exit code is 1."""
    cfg = _config(config, data_dir, sets)
    fname, _ = _pick(cfg, name)
    if fname is None:
        err.print("the config defines no frontier: add a 'frontier:' section")
        raise typer.Exit(2)
    if file == "-":
        stream: IO[str] = sys.stdin
        total = None
    else:
        path = Path(file)
        if not path.is_file():
            err.print(f"no such file: {file}")
            raise typer.Exit(2)
        stream = path.open(encoding="utf-8")
        total = path.stat().st_size
    try:
        counts, problems = asyncio.run(_add(cfg, fname, stream, total))
    finally:
        if stream is not sys.stdin:
            stream.close()
    for problem in problems[:_SHOWN]:
        err.print(problem, highlight=False, markup=False, soft_wrap=True)
    if len(problems) > _SHOWN:
        err.print(f"... and {len(problems) - _SHOWN} more", highlight=False, markup=False)
    if problems:
        err.print(f"{len(problems)} invalid (nothing admitted for them)", highlight=False,
                  markup=False)
    out.print(f"frontier {fname}: read {counts['read']}, admitted {counts['admitted']}, "
              f"duplicates {counts['duplicates']}, invalid {len(problems)}", highlight=False)
    if problems:
        raise typer.Exit(1)


def parse_seeds(stream: IO[str], problems: list[str]) -> Iterator[tuple[Seed, int, str]]:
    """Seeds in ``stream`` with the characters consumed so far and where each was read
    (``line 3`` / ``item 2``); bad lines go to problems, named the same way."""
    first = stream.read(1)
    while first and first.isspace():
        first = stream.read(1)
    if first == "[":
        text = first + stream.read()
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"the JSON array is invalid: {exc}")
            return
        except RecursionError:
            problems.append(f"the JSON array is invalid: {jsoncodec.TooDeepError('it')}")
            return
        for i, item in enumerate(items):
            seed = _seed(item, f"item {i}", problems)
            if seed is not None:
                yield seed, len(text), f"item {i}"
        return
    consumed = 0
    for n, line in enumerate(_prepend(first, stream), start=1):
        consumed += len(line.encode())
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                problems.append(f"line {n}: not valid JSON ({exc.msg})")
                continue
            except RecursionError:
                problems.append(f"line {n}: {jsoncodec.TooDeepError('the seed')}")
                continue
            seed = _seed(data, f"line {n}", problems)
        else:
            seed = _seed({"url": text}, f"line {n}", problems)
        if seed is not None:
            yield seed, consumed, f"line {n}"


def _prepend(first: str, stream: IO[str]) -> Iterator[str]:
    if not first:
        return
    rest = stream.readline()
    yield first + rest
    yield from stream


def _seed(data: Any, where: str, problems: list[str]) -> Seed | None:
    if not isinstance(data, dict):
        problems.append(f"{where}: expected a JSON object with 'url', got {type(data).__name__}")
        return None
    if jsoncodec.too_deep(data):
        problems.append(f"{where}: {jsoncodec.TooDeepError('the seed')}")
        return None
    try:
        seed = Seed.from_mapping(data)
    except (CrawlhubError, TypeError, ValueError) as exc:
        problems.append(f"{where}: {exc}")
        return None
    problem = url_problem(seed.url)
    if problem is not None:
        problems.append(f"{where}: {problem}")
        return None
    return seed


def url_problem(url: str) -> str | None:
    """Why ``url`` is not a URL a crawler can fetch (None when it is): an http or https
    scheme, a host, a valid port, no spaces."""
    shown = url if len(url) <= 200 else url[:200] + "..."
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{shown!r} is not a valid URL ({exc})"
    if parts.scheme.lower() not in ("http", "https"):
        scheme = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        return f"{shown!r} is not an http(s) URL ({scheme}); write http://host/path"
    if not parts.hostname:
        return f"{shown!r} has no host; write http://host/path"
    if port == 0:
        return f"{shown!r} has port 0"
    if any(c.isspace() for c in url):
        return f"{shown!r} contains whitespace; percent-encode it as %20"
    return None


async def _add(
    cfg: Any, name: str, stream: IO[str], total: int | None
) -> tuple[dict[str, int], list[str]]:
    frontier: Frontier = open_frontiers(cfg)[name]
    problems: list[str] = []
    counts = {"read": 0, "admitted": 0, "duplicates": 0}
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn() if total is None else TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("admitted {task.fields[admitted]}  duplicates {task.fields[duplicates]}"),
        TimeElapsedColumn(),
    )
    await frontier.open()
    try:
        with Progress(*columns, console=err, transient=False) as progress:
            task = progress.add_task(f"adding to {name}", total=total, admitted=0, duplicates=0)
            batch: list[Seed] = []
            where: list[str] = []
            position = 0

            async def flush(position: int) -> None:
                try:
                    flags = await frontier.admit(batch)
                except FrontierError:
                    # one bad URL: admit the batch seed by seed to find it
                    flags = []
                    for seed, place in zip(batch, where, strict=True):
                        try:
                            flags += await frontier.admit([seed])
                        except FrontierError as exc:
                            problems.append(f"{place}: {exc}")
                counts["read"] += len(flags)
                counts["admitted"] += sum(flags)
                counts["duplicates"] += len(flags) - sum(flags)
                batch.clear()
                where.clear()
                progress.update(
                    task,
                    completed=position if total is not None else counts["read"],
                    admitted=counts["admitted"],
                    duplicates=counts["duplicates"],
                )

            for seed, position, place in parse_seeds(stream, problems):
                batch.append(seed)
                where.append(place)
                if len(batch) >= _BATCH:
                    await flush(position)
            if batch:
                await flush(position)
            if total is not None:
                progress.update(task, completed=total)
    finally:
        await frontier.close()
    return counts, problems
