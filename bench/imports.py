"""The import graph's figures: packages, package cycles, upward edges, largest modules.

    python bench/imports.py            # figures for the installed crawlhub (src/)
    python bench/imports.py --edges    # ... and every package edge that points up
    PYTHONPATH=/other/checkout/src python bench/imports.py   # another tree, today's layers

A "package" is a direct child of ``crawlhub`` (a sub-package or a top-level module).
Every import counts, including those inside functions (they run too), except the ones
under ``if TYPE_CHECKING:``. Layers are read from ``.importlinter``'s layers contract
when it has one, else from LAYERS below; an edge from a lower layer to a higher one is
"upward".
"""

from __future__ import annotations

import argparse
import configparser
import os
import sys
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]

# The layers, top to bottom; names on one line ("a | b") are siblings.
LAYERS = [
    "cli",
    "api | web",
    "app",
    "contrib",
    "control",
    "collect | center | agents",
    "hub",
    "pipeline | sinks",
    "frontier | queues | fetch",
    "config",
    "backends",
    "core",
]


#: Where the flat modules of the old plan (before the redesign) went, so its graph can be
#: measured against today's layers.
OLD_PLACES = {
    **dict.fromkeys(["task", "errors", "clock", "jsoncodec", "keys", "loading", "extras",
                     "rejects", "signing", "userregex", "selectors", "logs"], "core"),
    "storage": "backends", "sqlitedb": "backends", "service": "services", "check": "app",
}


def layers_from_contract() -> list[str] | None:
    path = ROOT / ".importlinter"
    if not path.exists():
        return None
    parser = configparser.ConfigParser()
    parser.read(path)
    for section in parser.sections():
        if parser[section].get("type") == "layers":
            lines = [ln.strip() for ln in parser[section]["layers"].splitlines() if ln.strip()]
            return [ln.replace("crawlhub.", "") for ln in lines]
    return None


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def sccs(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--edges", action="store_true", help="list the upward package edges")
    args = ap.parse_args()
    graph = grimp.build_graph("crawlhub", exclude_type_checking_imports=True, cache_dir=None)
    import crawlhub

    src = Path(crawlhub.__file__).parents[1]
    modules = {m for m in graph.modules if m.startswith("crawlhub")}
    pkg_edges: dict[str, set[str]] = defaultdict(set)
    mod_edges: dict[str, set[str]] = defaultdict(set)
    via: dict[tuple[str, str], list[str]] = defaultdict(list)
    for m in modules:
        for dep in graph.find_modules_directly_imported_by(m):
            if not dep.startswith("crawlhub"):
                continue
            mod_edges[m].add(dep)
            a, b = top(m), top(dep)
            if a != b and "crawlhub" not in (a, b):
                pkg_edges[a].add(b)
                via[(a, b)].append(f"{m} -> {dep}")
    packages = sorted({top(m) for m in modules} - {"crawlhub"})
    layers = layers_from_contract() or LAYERS
    rank: dict[str, int] = {}
    for i, line in enumerate(layers):
        for name in line.replace(":", "|").split("|"):
            rank[name.strip()] = i
    for old, new in OLD_PLACES.items():
        if old not in rank and new in rank:
            rank[old] = rank[new]
    upward = sorted(
        (a, b) for a, bs in pkg_edges.items() for b in bs
        if a in rank and b in rank and rank[b] < rank[a]
    )
    unlayered = [p for p in packages if p not in rank and p != "__main__"]
    pkg_cycles = sccs(set(packages), pkg_edges)
    mod_cycles = sccs(modules, mod_edges)
    sizes = []
    for m in modules:
        path = Path(src) / (m.replace(".", os.sep))
        p = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if p.exists():
            sizes.append((sum(1 for _ in p.open()), m))
    sizes.sort(reverse=True)
    n_edges = sum(len(v) for v in pkg_edges.values())
    print("| figure | value |")
    print("|---|---|")
    print(f"| modules | {len(modules)} |")
    print(f"| packages (children of crawlhub) | {len(packages)} |")
    print(f"| package edges | {n_edges} |")
    print(f"| package cycles (strongly connected sets) | {len(pkg_cycles)} |")
    for c in pkg_cycles:
        print(f"|   cycle of {len(c)} | {', '.join(c)} |")
    print(f"| module cycles | {len(mod_cycles)} |")
    for c in mod_cycles:
        print(f"|   cycle of {len(c)} | {', '.join(x.removeprefix('crawlhub.') for x in c)} |")
    typed = grimp.build_graph("crawlhub", exclude_type_checking_imports=False,
                               cache_dir=None)
    typed_edges: dict[str, set[str]] = defaultdict(set)
    for m in modules:
        typed_edges[m] = {d for d in typed.find_modules_directly_imported_by(m)
                          if d.startswith("crawlhub") and d != m.rpartition(".")[0]}
    typed_cycles = sccs(modules, typed_edges)
    print(f"| module cycles counting `if TYPE_CHECKING:` imports (a package's own "
          f"__init__ aside) | {len(typed_cycles)} |")
    for c in typed_cycles:
        print(f"|   cycle of {len(c)} | {', '.join(x.removeprefix('crawlhub.') for x in c)} |")
    print(f"| upward package edges (layers: {'contract' if layers_from_contract() else 'LAYERS'}) | {len(upward)} |")
    print(f"| packages outside the layers | {len(unlayered)}: {', '.join(unlayered)} |")
    print(f"| lines in src | {sum(s for s, _ in sizes)} |")
    print()
    print("| largest modules | lines |")
    print("|---|---|")
    for s, m in sizes[:10]:
        print(f"| {m} | {s} |")
    if args.edges:
        print()
        for a, b in upward:
            print(f"{a} -> {b}:  " + "; ".join(via[(a, b)][:4]))


if __name__ == "__main__":
    main()
