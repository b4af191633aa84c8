"""Scrapy's own scheduler and dupefilter tests, run with crawlhub's classes substituted.

``python bench/scrapy_upstream.py <scrapy source tree> [--store sqlite|redis://...]``

The source tree is Scrapy's sdist unpacked (``pip download --no-deps --no-binary :all:
scrapy==$(python -c 'import scrapy; print(scrapy.__version__)')``), whose ``tests/``
holds ``test_scheduler.py`` and ``test_dupefilters.py``; they are not copied into this
repository. Three runs in one: Scrapy unchanged (the reference), ``test_scheduler.py``
with crawlhub's Scheduler (``bench/scrapy_upstream_plugin.py`` swaps it in), and
``test_dupefilters.py`` with crawlhub's DupeFilter under Scrapy's scheduler. Prints the
pass counts side by side and each test crawlhub fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
RESULT = re.compile(r"^(\S+::\S+(?: \S+)*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
FILES = {"scheduler": "tests/test_scheduler.py", "dupefilter": "tests/test_dupefilters.py"}


def run(tree: Path, files: list[str], substitute: str | None, store: str,
        src: Path = SRC, timeout: float = 600) -> dict[str, str]:
    """pytest over ``files`` of Scrapy's ``tree``; each test's outcome (PASSED, FAILED,
    ERROR, ...). A run that outlives ``timeout`` (a test hanging) is stopped; its tests
    not reported count as HUNG."""
    with tempfile.TemporaryDirectory() as tmp:
        # the plugin alone on the path (bench/incremental.py would shadow Twisted's)
        shutil.copy(HERE / "scrapy_upstream_plugin.py", tmp)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), tmp, str(tree)])}
        args = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                "-o", "asyncio_default_fixture_loop_scope=function", "-W", "default", *files]
        if substitute:
            env["CRAWLHUB_SUBSTITUTE"] = substitute
            env["CRAWLHUB_UPSTREAM_STORE"] = store
            args[3:3] = ["-p", "scrapy_upstream_plugin"]
        collected = subprocess.run([*args, "--collect-only", "-q"], cwd=tree, env=env,
                                   capture_output=True, text=True, timeout=300, check=False)
        out = {line.strip(): "HUNG" for line in collected.stdout.splitlines()
               if "::" in line}
        try:
            done = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True,
                                  timeout=timeout, check=False).stdout
        except subprocess.TimeoutExpired as exc:
            done = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        for line in done.splitlines():
            m = RESULT.match(line)
            if m:
                out[m.group(1)] = m.group(2)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tree", type=Path, help="Scrapy's source tree (with tests/)")
    parser.add_argument("--store", default="sqlite",
                        help="sqlite (a directory per test) or a redis:// URL")
    parser.add_argument("--src", type=Path, default=SRC,
                        help="the crawlhub source to test (default: this checkout's src/)")
    args = parser.parse_args()
    tree = args.tree.resolve()
    for f in FILES.values():
        if not (tree / f).is_file():
            sys.exit(f"{tree / f} is missing: give the unpacked Scrapy sdist (see --help)")
    from importlib.metadata import version

    rows = []
    failures: list[tuple[str, str]] = []
    for what, f in FILES.items():
        reference = run(tree, [f], None, args.store)
        ours = run(tree, [f], what, args.store, args.src.resolve())
        ok_ref = sum(v == "PASSED" for v in reference.values())
        ok = sum(v == "PASSED" for v in ours.values())
        rows.append((f, what, len(reference), ok_ref, ok))
        failures += [(name, v) for name, v in ours.items() if v != "PASSED"]

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Scrapy {version('scrapy')}'s own tests, crawlhub substituted"
                        f" (store: {args.store})")
    for col in ("file", "crawlhub's", "tests", "pass with Scrapy's", "pass with crawlhub's"):
        table.add_column(col, justify="right")
    for f, what, n, ok_ref, ok in rows:
        table.add_row(f, what, str(n), str(ok_ref), str(ok))
    Console().print(table)
    for name, outcome in failures:
        print(f"  {name}: {outcome}")


if __name__ == "__main__":
    main()
