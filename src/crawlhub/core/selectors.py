"""Safe selector compiler: routing rules in Python-expression syntax, checked and compiled once.

A selector's text is parsed, checked against an allow-list and turned into a plain function.
"""

from __future__ import annotations

import ast
import copy
import logging
import operator
import types
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from crawlhub.core.errors import SelectorError

__all__ = [
    "ALLOWED_FUNCTIONS",
    "MATCH_ALL",
    "MAX_DEPTH",
    "MAX_SEQUENCE_LENGTH",
    "MAX_SELECTOR_LENGTH",
    "Selector",
    "SelectorSet",
    "compile_selector",
    "compile_selectors",
    "with_location",
]

logger = logging.getLogger("crawlhub.selectors")

# What a selector may do, and why the limits are what they are:
#
# * Names are keys of the task dict; a missing key reads as ``None``.  A name is never a
#   Python variable: ``province`` becomes ``task.get('province')``, so no selector can
#   reach a global, a builtin or a helper of this module.
# * ``x['k']`` / ``x[0]`` / ``x[-1]`` take a *constant* key and read ``None`` when the
#   container is missing, is not a dict/list/tuple/str/bytes, or lacks the key.
# * Calls: only the functions in ALLOWED_FUNCTIONS, by bare name, positional arguments.
# * ``**`` is rejected outright: routing rules never need it and ``9**9**9`` is the
#   classic way to hang an evaluator.  ``<<``, ``>>``, ``&``, ``|``, ``^``, ``~``, ``@``
#   are rejected too.
# * ``*`` runs through a guard: repeating a str/bytes/list/tuple may not produce more than
#   MAX_SEQUENCE_LENGTH items (a runtime error, i.e. "not matching", not a MemoryError);
#   a literal string or list times anything but a small constant int is refused at load.
# * ``%`` is arithmetic only: printf-style formatting (``'%0999999999d' % 1``) is refused
#   at load for literal strings and at run time for strings from the task.
# * The text may be at most MAX_SELECTOR_LENGTH characters and MAX_DEPTH levels deep.

#: The functions a selector may call, bound to the real builtins.
ALLOWED_FUNCTIONS: Mapping[str, Callable[..., Any]] = types.MappingProxyType(
    {
        "int": int,
        "str": str,
        "float": float,
        "len": len,
        "bool": bool,
        "min": min,
        "max": max,
        "abs": abs,
        "any": any,
        "all": all,
    }
)

MAX_SELECTOR_LENGTH = 2000
MAX_DEPTH = 40
MAX_SEQUENCE_LENGTH = 100_000

_CONSTANT_TYPES = (str, int, float, bool, type(None), bytes)
_SEQUENCE_TYPES = (str, bytes, list, tuple)

_PLAIN_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Div: "/",
    ast.FloorDiv: "//",
}

# Constructs that are valid Python expressions but not valid selectors, with the fix
# the error message suggests.
_FORBIDDEN: dict[type[ast.AST], tuple[str, str]] = {
    ast.Attribute: (
        "attribute access",
        "read nested values with a constant subscript, e.g. task_parms['province']",
    ),
    ast.Lambda: ("a lambda", "write the condition inline"),
    ast.ListComp: ("a list comprehension", "use any(...)/all(...) over a literal list"),
    ast.SetComp: ("a set comprehension", "use a literal set"),
    ast.DictComp: ("a dict comprehension", "use a literal dict"),
    ast.GeneratorExp: ("a generator expression", "use any(...)/all(...) over a literal list"),
    ast.NamedExpr: ("an assignment expression (:=)", "selectors cannot assign; repeat the name"),
    ast.JoinedStr: ("an f-string", "compare with a plain string literal"),
    ast.FormattedValue: ("an f-string", "compare with a plain string literal"),
    ast.Starred: ("star unpacking (*)", "list the values explicitly"),
    ast.Await: ("await", "selectors are plain expressions"),
    ast.Yield: ("yield", "selectors are plain expressions"),
    ast.YieldFrom: ("yield from", "selectors are plain expressions"),
    ast.Slice: ("a slice", "use a constant key such as x[0] or x['name']"),
}

_OPERATOR_NAMES: dict[type[ast.AST], str] = {
    ast.Pow: "the power operator (**)",
    ast.LShift: "the shift operator (<<)",
    ast.RShift: "the shift operator (>>)",
    ast.BitOr: "the bitwise operator (|)",
    ast.BitAnd: "the bitwise operator (&)",
    ast.BitXor: "the bitwise operator (^)",
    ast.MatMult: "the matrix operator (@)",
    ast.Invert: "the bitwise operator (~)",
}

_ALLOWED_NAMES_HINT = ", ".join(ALLOWED_FUNCTIONS)


# --------------------------------------------------------------------------- run-time helpers
# Bound into each selector's private namespace under names a selector cannot spell.


def _item(container: Any, key: Any) -> Any:
    """``container[key]``, or ``None`` when there is no such item."""
    if type(container) is dict:
        return container.get(key)
    if isinstance(container, _SEQUENCE_TYPES):
        if type(key) is int and -len(container) <= key < len(container):
            return container[key]
        return None
    if isinstance(container, Mapping):
        try:
            return container.get(key)
        except TypeError:
            return None
    return None


def _mul(left: Any, right: Any) -> Any:
    """``left * right``, refusing to build a sequence longer than MAX_SEQUENCE_LENGTH."""
    if isinstance(left, _SEQUENCE_TYPES) and isinstance(right, int):
        size, count = len(left), right
    elif isinstance(right, _SEQUENCE_TYPES) and isinstance(left, int):
        size, count = len(right), left
    else:
        return left * right
    if size * count > MAX_SEQUENCE_LENGTH:
        raise ValueError(
            f"repeating a sequence of {size} items {count} times exceeds the selector "
            f"limit of {MAX_SEQUENCE_LENGTH} items"
        )
    return left * right


def _mod(left: Any, right: Any) -> Any:
    """``left % right`` for numbers only: printf-style string formatting is refused."""
    if isinstance(left, (str, bytes)):
        raise TypeError("selectors do not format strings with %")
    return left % right


# The generated code, written by us (never from user text).  ``_EXPR_`` is replaced by
# the checked, translated selector expression.
_TEMPLATE = """
def _selector_value(task):
    return _EXPR_

def _selector_match(task):
    try:
        return True if _EXPR_ else False
    except _Exception as exc:
        return _failed(task, exc)
"""
_FILENAME = "<selector>"


class Selector:
    """One compiled selector.

    ``selector(task)`` says whether the task matches and never raises: an error while
    evaluating (``int(None)``, ``len(5)``, ``1 / 0``) counts as not matching and is
    logged once per selector.  ``evaluate(task)`` returns the raw value and lets errors
    through (for tests and the dry-run API).
    """

    __slots__ = ("text", "names", "code", "errors", "_value", "_match", "_logged")

    text: str
    #: Task keys the selector reads (top-level names only).
    names: frozenset[str]
    #: Code object of the matching function (compiled once, at load).
    code: types.CodeType
    #: How many evaluations failed with an error (each counted as not matching).
    errors: int

    def __init__(self, text: str, expression: ast.expr, names: frozenset[str]) -> None:
        self.text = text
        self.names = names
        self.errors = 0
        self._logged = False
        namespace: dict[str, Any] = {
            "__builtins__": {},
            "_Exception": Exception,
            "_item": _item,
            "_mul": _mul,
            "_mod": _mod,
            "_failed": self._failed,
            **ALLOWED_FUNCTIONS,
        }
        functions = _build_functions(expression, namespace)
        self._value = functions["_selector_value"]
        self._match = functions["_selector_match"]
        self.code = self._match.__code__

    if TYPE_CHECKING:

        def __call__(self, task: Mapping[str, Any]) -> bool: ...

    else:
        # ``selector(task)`` goes straight to the generated function: the C-level getter
        # saves the Python frame a ``def __call__`` would add (~30% of a typical call).
        __call__ = property(operator.attrgetter("_match"))

    def evaluate(self, task: Mapping[str, Any]) -> Any:
        """The selector's raw value for ``task``; evaluation errors propagate."""
        return self._value(task)

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"

    def _failed(self, task: Mapping[str, Any], exc: Exception) -> bool:
        self.errors += 1
        if not self._logged:
            self._logged = True
            try:
                task_key = task.get("task_uuid") or "(no task_uuid)"
            except Exception:  # a task that is not even a mapping
                task_key = "(not a mapping)"
            logger.warning(
                'selector "%s" failed on task %s with %s: %s; counted as not matching '
                "(logged once per selector, later failures are only counted)",
                self.text,
                task_key,
                type(exc).__name__,
                exc,
            )
        return False


class SelectorSet:
    """An ordered list of selectors; a task matches when any of them matches.

    An **empty** set matches every task (an inbound or outbound without selectors takes
    everything); :meth:`match` then returns :data:`MATCH_ALL`.
    """

    __slots__ = ("selectors", "_matchers")

    def __init__(self, selectors: Sequence[Selector]) -> None:
        self.selectors: tuple[Selector, ...] = tuple(selectors)
        self._matchers = tuple(selector._match for selector in self.selectors)

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(selector.text for selector in self.selectors)

    @property
    def matchers(self) -> tuple[Callable[[Mapping[str, Any]], bool], ...]:
        """The selectors' matching functions, in order (each is ``selector(task)``
        without the attribute lookup): for callers that chain several sets."""
        return self._matchers

    def match(self, task: Mapping[str, Any]) -> Selector | None:
        """The first selector that matches ``task``, or ``None``; never raises."""
        if not self.selectors:
            return MATCH_ALL
        for selector, matcher in zip(self.selectors, self._matchers, strict=True):
            if matcher(task):
                return selector
        return None

    def matches(self, task: Mapping[str, Any]) -> bool:
        """Whether any selector matches ``task`` (always true for an empty set)."""
        for matcher in self._matchers:
            if matcher(task):
                return True
        return not self._matchers

    def __len__(self) -> int:
        return len(self.selectors)

    def __iter__(self) -> Iterator[Selector]:
        return iter(self.selectors)

    def __repr__(self) -> str:
        return f"SelectorSet({list(self.texts)!r})"


def compile_selector(text: str) -> Selector:
    """Check ``text`` against the allow-list and compile it once.

    Raises :class:`SelectorError` (quoting the text and naming the construct or the
    syntax error and its position) when it is not a valid selector.
    """
    if not isinstance(text, str):
        raise SelectorError(
            f"selector {text!r} is a {type(text).__name__}, not a string; "
            'quote it in the config, e.g. "task_src == 3"'
        )
    source = text.strip()
    if not source:
        raise SelectorError(
            'selector "" is empty; write an expression such as "task_src == 3", or leave '
            "the selector list empty to match every task"
        )
    if len(source) > MAX_SELECTOR_LENGTH:
        raise SelectorError(
            f"selector {_quote(source)} is {len(source)} characters long, over the limit of "
            f"{MAX_SELECTOR_LENGTH}; split it into several selectors"
        )
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise SelectorError(
            f"selector {_quote(source)} is not a valid expression: {exc.msg}"
            f"{_syntax_position(source, exc)}"
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise SelectorError(
            f"selector {_quote(source)} cannot be parsed: {type(exc).__name__}: {exc}"
        ) from None
    translator = _Translator(source)
    expression = translator.translate(tree.body, 1)
    return Selector(source, expression, frozenset(translator.names))


def compile_selectors(texts: Sequence[str] | str | None) -> SelectorSet:
    """Compile a selector list (a single string counts as a list of one).

    An error names the failing entry as ``key="selector[i]"``; the config loader adds the
    file and the entry with :func:`with_location`.
    """
    if texts is None:
        texts = []
    elif isinstance(texts, str):
        texts = [texts]
    elif not isinstance(texts, list | tuple):
        raise SelectorError(
            f"selector must be a list of expressions (strings), got {texts!r}; write e.g."
            ' selector: ["task_src == 3"]', key="selector"
        )
    selectors = []
    for index, text in enumerate(texts):
        try:
            selectors.append(compile_selector(text))
        except SelectorError as exc:
            raise SelectorError(exc.reason, key=f"selector[{index}]") from None
    return SelectorSet(selectors)


def with_location(
    error: SelectorError, *, file: str | None = None, entry: str | None = None
) -> SelectorError:
    """The same error located in a config ``file`` and ``entry`` (its key is kept)."""
    located = SelectorError(
        error.reason,
        file=file if file is not None else error.file,
        entry=entry if entry is not None else error.entry,
        key=error.key,
    )
    located.__cause__ = error.__cause__
    return located


# --------------------------------------------------------------------------- translation


class _Translator:
    """Checks one parsed selector against the allow-list and builds the code to run.

    Every node type it does not know is refused: the check is an allow-list by
    construction, and the output tree is built fresh (no user node is reused).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.names: set[str] = set()

    def translate(self, node: ast.AST, depth: int) -> ast.expr:
        if depth > MAX_DEPTH:
            raise SelectorError(
                f"selector {_quote(self.source)} is nested more than {MAX_DEPTH} levels "
                "deep; split it into several selectors"
            )
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            construct, fix = _FORBIDDEN.get(
                type(node), (f"a {type(node).__name__} expression", "use a simpler expression")
            )
            if isinstance(node, ast.Attribute):
                construct = f"attribute access (.{node.attr})"
            raise self._forbidden(node, construct, fix)
        result: ast.expr = handler(node, depth + 1)
        return result

    # -- leaves

    def _Constant(self, node: ast.Constant, depth: int) -> ast.expr:
        if not isinstance(node.value, _CONSTANT_TYPES):
            raise self._forbidden(
                node,
                f"the constant {node.value!r}",
                "use a string, number, True, False or None",
            )
        return ast.Constant(value=node.value)

    def _Name(self, node: ast.Name, depth: int) -> ast.expr:
        if not isinstance(node.ctx, ast.Load):
            raise self._forbidden(node, "an assignment", "selectors only read task keys")
        self._check_name(node, node.id)
        self.names.add(node.id)
        # task.get('name'): a missing key reads as None.
        return _call(ast.Attribute(value=_task(), attr="get", ctx=ast.Load()), _const(node.id))

    # -- operators

    def _BoolOp(self, node: ast.BoolOp, depth: int) -> ast.expr:
        return ast.BoolOp(
            op=type(node.op)(), values=[self.translate(v, depth) for v in node.values]
        )

    def _UnaryOp(self, node: ast.UnaryOp, depth: int) -> ast.expr:
        if not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            raise self._forbidden(node, _OPERATOR_NAMES[type(node.op)], "compare values instead")
        return ast.UnaryOp(op=type(node.op)(), operand=self.translate(node.operand, depth))

    def _BinOp(self, node: ast.BinOp, depth: int) -> ast.expr:
        op = type(node.op)
        if op in _PLAIN_BINOPS:
            return ast.BinOp(
                left=self.translate(node.left, depth),
                op=op(),
                right=self.translate(node.right, depth),
            )
        if op is ast.Mult:
            self._check_repeat(node)
            return _call(
                _helper("_mul"), self.translate(node.left, depth), self.translate(node.right, depth)
            )
        if op is ast.Mod:
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, (str, bytes)):
                raise self._forbidden(
                    node, "string formatting with %", "compare with a plain string literal"
                )
            return _call(
                _helper("_mod"), self.translate(node.left, depth), self.translate(node.right, depth)
            )
        fix = "selectors do not need exponentiation" if op is ast.Pow else "use + - * / // %"
        raise self._forbidden(node, _OPERATOR_NAMES.get(op, op.__name__), fix)

    def _Compare(self, node: ast.Compare, depth: int) -> ast.expr:
        return ast.Compare(
            left=self.translate(node.left, depth),
            ops=[type(op)() for op in node.ops],
            comparators=[self.translate(c, depth) for c in node.comparators],
        )

    def _IfExp(self, node: ast.IfExp, depth: int) -> ast.expr:
        return ast.IfExp(
            test=self.translate(node.test, depth),
            body=self.translate(node.body, depth),
            orelse=self.translate(node.orelse, depth),
        )

    # -- literals

    def _List(self, node: ast.List, depth: int) -> ast.expr:
        return ast.List(elts=[self.translate(e, depth) for e in node.elts], ctx=ast.Load())

    def _Tuple(self, node: ast.Tuple, depth: int) -> ast.expr:
        return ast.Tuple(elts=[self.translate(e, depth) for e in node.elts], ctx=ast.Load())

    def _Set(self, node: ast.Set, depth: int) -> ast.expr:
        return ast.Set(elts=[self.translate(e, depth) for e in node.elts])

    def _Dict(self, node: ast.Dict, depth: int) -> ast.expr:
        keys: list[ast.expr | None] = []
        for key in node.keys:
            if key is None:
                raise self._forbidden(node, "dict unpacking (**)", "list the keys explicitly")
            keys.append(self.translate(key, depth))
        return ast.Dict(keys=keys, values=[self.translate(v, depth) for v in node.values])

    # -- subscripts and calls

    def _Subscript(self, node: ast.Subscript, depth: int) -> ast.expr:
        key = _constant_key(node.slice)
        if key is None:
            if isinstance(node.slice, ast.Slice):
                construct, fix = _FORBIDDEN[ast.Slice]
            else:
                construct = "a subscript with a computed key"
                fix = "use a constant key such as x['province'] or x[0]"
            raise self._forbidden(node.slice, construct, fix)
        return _call(_helper("_item"), self.translate(node.value, depth), _const(key[0]))

    def _Call(self, node: ast.Call, depth: int) -> ast.expr:
        func = node.func
        if not isinstance(func, ast.Name):
            raise self._forbidden(
                node,
                "a call of a computed value",
                f"call one of the allowed functions by name: {_ALLOWED_NAMES_HINT}",
            )
        if func.id not in ALLOWED_FUNCTIONS:
            raise SelectorError(
                f"selector {_quote(self.source)} calls {func.id}(){self._at(node)}, which "
                f"selectors do not allow; the allowed functions are {_ALLOWED_NAMES_HINT}"
            )
        if node.keywords:
            raise self._forbidden(
                node, f"keyword arguments to {func.id}()", "pass positional arguments only"
            )
        # Name(func.id) resolves in the selector's private namespace: the real builtin.
        return _call(
            ast.Name(id=func.id, ctx=ast.Load()), *(self.translate(a, depth) for a in node.args)
        )

    # -- checks

    def _check_name(self, node: ast.AST, name: str) -> None:
        if name.startswith("__"):
            raise self._forbidden(
                node,
                f"the reserved name {name}",
                "names starting with '__' are reserved; rename the task key",
            )

    def _check_repeat(self, node: ast.BinOp) -> None:
        """Refuse ``'a' * n`` / ``[0] * n`` unless ``n`` is a small constant int."""
        for sequence, count in ((node.left, node.right), (node.right, node.left)):
            size = _literal_size(sequence)
            if size is None:
                continue
            ok = (
                isinstance(count, ast.Constant)
                and type(count.value) is int
                and count.value * max(size, 1) <= MAX_SEQUENCE_LENGTH
            )
            if not ok:
                raise self._forbidden(
                    node,
                    "repetition of a literal string or list by a large or computed count",
                    f"repeat by a constant count (at most {MAX_SEQUENCE_LENGTH} items in all)",
                )

    def _forbidden(self, node: ast.AST, construct: str, fix: str) -> SelectorError:
        return SelectorError(
            f"selector {_quote(self.source)} uses {construct}{self._at(node)}, which "
            f"selectors do not allow; {fix}"
        )

    def _at(self, node: ast.AST) -> str:
        lineno = getattr(node, "lineno", None)
        col = getattr(node, "col_offset", None)
        if isinstance(node, ast.Attribute) and node.end_col_offset is not None:
            # Point at the attribute name, not at the start of the object expression.
            lineno = node.end_lineno
            col = node.end_col_offset - len(node.attr.encode("utf-8"))
        if lineno is None or col is None:
            return ""
        line = self.source.splitlines()[lineno - 1] if self.source else ""
        column = len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore")) + 1
        return _position(self.source, lineno, column)


# --------------------------------------------------------------------------- small builders


def _task() -> ast.expr:
    return ast.Name(id="task", ctx=ast.Load())


def _helper(name: str) -> ast.expr:
    return ast.Name(id=name, ctx=ast.Load())


def _const(value: Any) -> ast.expr:
    return ast.Constant(value=value)


def _call(func: ast.expr, *args: ast.expr) -> ast.expr:
    return ast.Call(func=func, args=list(args), keywords=[])


def _constant_key(node: ast.expr) -> tuple[str | int] | None:
    """The constant subscript key (``'k'``, ``0``, ``-1``) as a 1-tuple, else None."""
    if isinstance(node, ast.Constant) and type(node.value) in (str, int):
        value: str | int = node.value  # type: ignore[assignment]
        return (value,)
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) is int
    ):
        return (-node.operand.value,)
    return None


def _literal_size(node: ast.expr) -> int | None:
    """Length of a literal string/bytes/list/tuple/set, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        return len(node.value)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return len(node.elts)
    return None


def _build_functions(
    expression: ast.expr, namespace: dict[str, Any]
) -> dict[str, types.FunctionType]:
    """Compile the template around ``expression`` and bind its functions to ``namespace``.

    The functions are made from their code objects directly: nothing is ``exec``-ed.
    """
    module = ast.parse(_TEMPLATE, filename=_FILENAME, mode="exec")
    for placeholder_parent in ast.walk(module):
        for field, value in ast.iter_fields(placeholder_parent):
            if isinstance(value, ast.Name) and value.id == "_EXPR_":
                setattr(placeholder_parent, field, copy.deepcopy(expression))
    ast.fix_missing_locations(module)
    with warnings.catch_warnings():
        # e.g. SyntaxWarning for `x is 1`: a legal (if odd) selector.
        warnings.simplefilter("ignore")
        module_code = compile(module, _FILENAME, "exec")
    functions: dict[str, types.FunctionType] = {}
    for const in module_code.co_consts:
        if isinstance(const, types.CodeType):
            functions[const.co_name] = types.FunctionType(const, namespace, const.co_name)
    return functions


def _quote(source: str) -> str:
    shown = source if len(source) <= 200 else source[:200] + "..."
    return f'"{shown}"'


def _syntax_position(source: str, exc: SyntaxError) -> str:
    if not exc.lineno or not exc.offset:
        return ""
    return _position(source, exc.lineno, exc.offset)


def _position(source: str, lineno: int, column: int) -> str:
    if "\n" in source:
        return f" at line {lineno}, column {column}"
    return f" at column {column}"


#: What :meth:`SelectorSet.match` returns for an empty set: a selector matching every task.
MATCH_ALL = compile_selector("True")
