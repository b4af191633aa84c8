"""Reading config YAML safely: a duplicate key, an alias bomb, a recursive alias or very
deep nesting is a YAMLProblem with a line and a place, found before anything is expanded.

PyYAML alone takes the last of two equal keys silently, expands ``&a [*b, *b, ...]``
chains into gigabytes further down the line, and ends deep nesting in a RecursionError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: Deepest nesting of mappings and lists a config may have (real configs stay under 10).
MAX_DEPTH = 64
#: Most values aliases may add to a file once expanded (beyond the values written out).
MAX_NODES = 200_000
#: Top-level lists whose items are named entries (``outbound[1] 'name'`` in messages).
ENTRY_LISTS = ("inbound", "outbound", "jobs")

_MERGE_TAG = "tag:yaml.org,2002:merge"
Path = tuple[str | int, ...]


@dataclass
class YAMLProblem(Exception):
    """What is wrong, the 1-based line, and where: ``entry``/``key`` as ConfigError has them."""

    message: str
    line: int | None = None
    entry: str | None = None
    key: str | None = None

    def __str__(self) -> str:
        return self.message


def read_yaml(text: str) -> Any:
    """The data of one YAML document; raises YAMLProblem or yaml.YAMLError."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _Checker(root, MAX_NODES + loader.written).check()
        return loader.construct_document(root)
    finally:
        loader.dispose()


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer refuses nesting deeper than MAX_DEPTH (before recursing)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str | int] = []
        #: Nodes written out in the text (an alias adds none here).
        self.written = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # type: ignore[override]
        if parent is not None:
            label: str | int = (
                index if isinstance(index, int)
                else index.value if isinstance(index, ScalarNode)
                else "?"
            )
            self._path.append(label)
        try:
            if len(self._path) >= MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YAMLProblem(
                    f"nesting deeper than {MAX_DEPTH} levels at line {mark.line + 1}: a config"
                    " never needs this many; flatten it",
                    mark.line + 1, *_place(tuple(self._path[:3]), {}),
                )
            if not self.check_event(yaml.AliasEvent):
                self.written += 1
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        finally:
            if parent is not None:
                self._path.pop()


class _Checker:
    """One pass over the composed node graph (shared nodes once): duplicate keys,
    recursive aliases and the size the aliases would expand to."""

    def __init__(self, root: Node, limit: int) -> None:
        self.root = root
        self.limit = limit
        self.sizes: dict[int, int] = {}
        self.open: set[int] = set()
        self.names = _entry_names(root)

    def check(self) -> None:
        self._size(self.root, ())

    def _size(self, node: Node, path: Path) -> int:
        ident = id(node)
        known = self.sizes.get(ident)
        if known is not None:
            return known
        if ident in self.open:
            raise self._problem(
                f"an alias at line {node.start_mark.line + 1} refers to a node that contains"
                " it (a recursive alias); a config must be a tree", node, path)
        self.open.add(ident)
        total = 1
        if isinstance(node, SequenceNode):
            for index, child in enumerate(node.value):
                total += self._size(child, (*path, index))
                self._limit(total, child, path)
        elif isinstance(node, MappingNode):
            seen: dict[tuple[str, str], ScalarNode] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    total += self._size(value_node, path)
                    self._limit(total, value_node, path)
                    continue
                if isinstance(key_node, ScalarNode):
                    ident_key = (key_node.tag, key_node.value)
                    first = seen.get(ident_key)
                    if first is not None:
                        raise self._problem(
                            f"duplicate key {key_node.value!r} at line"
                            f" {key_node.start_mark.line + 1}: line {first.start_mark.line + 1}"
                            " already sets it; YAML keeps only one, so remove or rename the"
                            " other", key_node, (*path, key_node.value))
                    seen[ident_key] = key_node
                label = key_node.value if isinstance(key_node, ScalarNode) else "?"
                total += self._size(key_node, path) + self._size(value_node, (*path, label))
                self._limit(total, value_node, path)
        self.open.discard(ident)
        self.sizes[ident] = total
        return total

    def _limit(self, total: int, node: Node, path: Path) -> None:
        if total > self.limit:
            raise self._problem(
                f"aliases expand this file by more than {MAX_NODES} values (near line"
                f" {node.start_mark.line + 1}): an alias bomb? Write the values out, or"
                " split the config with include:", node, path)

    def _problem(self, message: str, node: Node, path: Path) -> YAMLProblem:
        return YAMLProblem(message, node.start_mark.line + 1, *_place(path, self.names))


def _entry_names(root: Node) -> dict[tuple[str, int], str]:
    """(section, index) -> name of each inbound/outbound/job entry, for messages."""
    names: dict[tuple[str, int], str] = {}
    if not isinstance(root, MappingNode):
        return names
    for key_node, value_node in root.value:
        if key_node.value in ENTRY_LISTS and isinstance(value_node, SequenceNode):
            for index, item in enumerate(value_node.value):
                if isinstance(item, MappingNode):
                    for k, v in item.value:
                        if k.value == "name" and isinstance(v, ScalarNode):
                            names[(key_node.value, index)] = v.value
    return names


def _place(path: Path, names: dict[tuple[str, int], str]) -> tuple[str | None, str | None]:
    """(entry, key) for a path, the way the loader names places."""
    if not path:
        return None, None
    head = str(path[0])
    if len(path) == 1:
        return None, head
    if head in ENTRY_LISTS and isinstance(path[1], int):
        name = names.get((head, path[1]))
        entry = f"{head}[{path[1]}]" + (f" '{name}'" if name else "")
        return entry, ".".join(str(p) for p in path[2:]) or None
    return head, ".".join(str(p) for p in path[1:])
