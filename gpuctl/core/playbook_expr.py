"""The small, safe expression language of playbook conditions (`when:`, `assert:`, `wait:`).

    fragmentation_pct > 20
    utilization_pct < 80 and band != "over"
    node.health == "unhealthy" or node.state in ["down", "unknown"]

Grammar (no function calls, no attribute access beyond the names listed, no `eval`):

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := operand (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not in") operand)?
    operand := NUMBER | STRING | true | false | null | NAME | "[" literal, ... "]" | "(" expr ")"

Names are the fleet numbers (`FLEET_NAMES`) and the facts of a node (`NODE_NAMES`, plus
`node.labels.KEY`). Expressions are checked when the playbook is read: an unknown name, a number
compared with text, a value a name never takes (`node.health == "sick"`) are errors with the
column. Evaluation: an unknown value (null) makes `<`, `<=`, `>`, `>=` false, so a condition on a
number gpuctl could not measure never fires.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_EXPR_CHARS = 500


class Kind(enum.StrEnum):
    NUMBER = "number"
    TEXT = "text"
    BOOL = "true/false"
    LIST = "list"
    NULL = "null"


@dataclasses.dataclass(frozen=True, slots=True)
class NameInfo:
    kind: Kind
    values: tuple[str, ...] = ()  # the texts a TEXT name may take (empty: any)
    doc: str = ""


_N = NameInfo(Kind.NUMBER)
BANDS = ("idle", "low", "target", "over")
NODE_STATES = ("ready", "cordoned", "draining", "down", "unknown")
HEALTH = ("healthy", "degraded", "unhealthy", "unknown")
REACH = ("ok", "refused", "unreachable", "auth_failed", "host_key", "timeout", "error")

# The fleet numbers (`gpuctl status -o json` "numbers") and the node counts a playbook adds.
FLEET_NAMES: Mapping[str, NameInfo] = {
    "utilization_pct": _N,
    "band": NameInfo(Kind.TEXT, BANDS),
    "allocated_mib": _N,
    "capacity_mib": _N,
    "observed_util_pct": _N,
    "fragmentation_pct": _N,
    "stranded_gib": _N,
    "now": _N,
    "window_s": _N,
    "restart_budget_s": _N,
    "queue_started": _N,
    "queue_wait_p50_s": _N,
    "queue_wait_p95_s": _N,
    "queue_waiting": _N,
    "queue_oldest_wait_s": _N,
    "queue_oldest_job": NameInfo(Kind.TEXT),
    "checkpoint_running_jobs": _N,
    "checkpoint_missing": _N,
    "checkpoint_age_max_s": _N,
    "checkpoint_age_p95_s": _N,
    "checkpoint_oldest_job": NameInfo(Kind.TEXT),
    "failovers_attempted": _N,
    "failovers_succeeded": _N,
    "failovers_pending": _N,
    "failover_success_pct": _N,
    "preemptions": _N,
    "preemptions_per_hour": _N,
    "spot_jobs": _N,
    "spot_jobs_preempted": _N,
    "spot_preempted_pct": _N,
    "nodes": _N,
    "nodes_ready": _N,
    "nodes_cordoned": _N,
    "nodes_down": _N,
    "nodes_unhealthy": _N,  # null until a health step of this run
    "targets": _N,
}

NODE_NAMES: Mapping[str, NameInfo] = {
    "node.name": NameInfo(Kind.TEXT),
    "node.state": NameInfo(Kind.TEXT, NODE_STATES),
    "node.reach": NameInfo(Kind.TEXT, REACH),
    "node.health": NameInfo(Kind.TEXT, HEALTH),  # null until a health step of this run
    "node.cordoned": NameInfo(Kind.BOOL),
    "node.gpus": _N,
    "node.jobs": _N,
    "node.mem_used_mib": _N,
    "node.mem_total_mib": _N,
    "node.allocated_mib": _N,
    "node.util_pct": _N,
    "node.temp_c": _N,
    "node.groups": NameInfo(Kind.LIST),
}
LABEL_PREFIX = "node.labels."


class ExprError(ValueError):
    """A condition that cannot be read or makes no sense; `column` is 1-based."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.column = column


# --- the tree ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Lit:
    value: Any  # float, str, bool, None, or a tuple of those


@dataclasses.dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclasses.dataclass(frozen=True, slots=True)
class BoolOp:
    op: str  # "and" | "or"
    operands: tuple[Node, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Node
    right: Node


Node = Lit | Name | Not | BoolOp | Compare


@dataclasses.dataclass(frozen=True, slots=True)
class Expr:
    """A checked condition: its text, its tree, and whether it reads a node's facts."""

    text: str
    tree: Node
    uses_node: bool

    def __str__(self) -> str:
        return self.text

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        """True or false for `env` (name -> value; a missing name is null)."""
        return _truth(_eval(self.tree, env))

    def names(self) -> tuple[str, ...]:
        out: list[str] = []
        _collect(self.tree, out)
        return tuple(dict.fromkeys(out))


# --- tokens --------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "n": "\n", "t": "\t"}


@dataclasses.dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # num, str, op, name, kw, end
    text: str
    col: int
    value: Any = None


def _unquote(text: str, col: int) -> str:
    body = text[1:-1]
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt not in _ESCAPES:
                raise ExprError(f"unknown escape \\{nxt} in a string", col + i + 1)
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip()) + 1
            raise ExprError(f"unexpected character {text[col - 1]!r}", col)
        col = m.start(m.lastgroup or 0) + 1
        kind = m.lastgroup or ""
        word = m.group(kind)
        if kind == "num":
            value = float(word)
            if not math.isfinite(value):
                raise ExprError(f"number {word} is out of range", col)
            toks.append(_Tok("num", word, col, value))
        elif kind == "str":
            toks.append(_Tok("str", word, col, _unquote(word, col)))
        elif kind == "name" and word in _KEYWORDS:
            toks.append(_Tok("kw", word, col))
        else:
            toks.append(_Tok(kind, word, col))
        pos = m.end()
    toks.append(_Tok("end", "", len(text) + 1))
    return toks


# --- parsing -------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = tokenize(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        return self.tok.kind == kind and (text is None or self.tok.text == text)

    def expect(self, kind: str, text: str) -> _Tok:
        if not self.at(kind, text):
            raise ExprError(f"expected {text!r}, found {_show(self.tok)}", self.tok.col)
        return self.take()

    def parse(self) -> tuple[Node, dict[int, int]]:
        self.cols: dict[int, int] = {}
        node = self.or_()
        if not self.at("end"):
            raise ExprError(f"unexpected {_show(self.tok)}", self.tok.col)
        return node, self.cols

    def mark(self, node: Node, col: int) -> Node:
        self.cols[id(node)] = col
        return node

    def or_(self) -> Node:
        col = self.tok.col
        parts = [self.and_()]
        while self.at("kw", "or"):
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else self.mark(BoolOp("or", tuple(parts)), col)

    def and_(self) -> Node:
        col = self.tok.col
        parts = [self.not_()]
        while self.at("kw", "and"):
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else self.mark(BoolOp("and", tuple(parts)), col)

    def not_(self) -> Node:
        if self.at("kw", "not"):
            col = self.take().col
            return self.mark(Not(self.not_()), col)
        return self.compare()

    def compare(self) -> Node:
        col = self.tok.col
        left = self.operand()
        op: str | None = None
        if self.tok.kind == "op" and self.tok.text in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take().text
        elif self.at("kw", "in"):
            self.take()
            op = "in"
        elif self.at("kw", "not") and self.toks[self.i + 1].text == "in":
            self.i += 2
            op = "not in"
        if op is None:
            return left
        right = self.operand()
        if self.tok.kind == "op" and self.tok.text in ("==", "!=", "<", "<=", ">", ">="):
            raise ExprError("chained comparisons are not supported: join them with and", col)
        return self.mark(Compare(op, left, right), col)

    def operand(self) -> Node:
        tok = self.tok
        if tok.kind in ("num", "str"):
            self.take()
            return self.mark(Lit(tok.value), tok.col)
        if tok.kind == "kw" and tok.text in ("true", "false", "null"):
            self.take()
            value = {"true": True, "false": False, "null": None}[tok.text]
            return self.mark(Lit(value), tok.col)
        if tok.kind == "name":
            self.take()
            return self.mark(Name(tok.text), tok.col)
        if tok.kind == "op" and tok.text == "(":
            self.take()
            inner = self.or_()
            self.expect("op", ")")
            return inner
        if tok.kind == "op" and tok.text == "[":
            self.take()
            items: list[Any] = []
            while not self.at("op", "]"):
                item = self.operand()
                if not isinstance(item, Lit) or isinstance(item.value, tuple):
                    raise ExprError("a list holds numbers and strings only", self.cols[id(item)])
                items.append(item.value)
                if not self.at("op", "]"):
                    self.expect("op", ",")
            self.take()
            return self.mark(Lit(tuple(items)), tok.col)
        raise ExprError(f"expected a value, found {_show(tok)}", tok.col)


def _show(tok: _Tok) -> str:
    return "the end" if tok.kind == "end" else repr(tok.text)


# --- checking ------------------------------------------------------------------------------------


def name_info(name: str, *, node_facts: bool) -> NameInfo | None:
    if name in FLEET_NAMES:
        return FLEET_NAMES[name]
    if node_facts and name in NODE_NAMES:
        return NODE_NAMES[name]
    if node_facts and name.startswith(LABEL_PREFIX) and len(name) > len(LABEL_PREFIX):
        return NameInfo(Kind.TEXT)
    return None


class _Checker:
    def __init__(self, cols: Mapping[int, int], node_facts: bool, where: str) -> None:
        self.cols = cols
        self.node_facts = node_facts
        self.where = where

    def col(self, node: Node) -> int:
        return self.cols.get(id(node), 1)

    def kind(self, node: Node) -> tuple[Kind, NameInfo | None]:
        if isinstance(node, Lit):
            return _lit_kind(node.value), None
        if isinstance(node, Name):
            info = name_info(node.name, node_facts=self.node_facts)
            if info is None:
                raise ExprError(self.unknown(node.name), self.col(node))
            return info.kind, info
        if isinstance(node, Not):
            self.boolean(node.operand)
            return Kind.BOOL, None
        if isinstance(node, BoolOp):
            for part in node.operands:
                self.boolean(part)
            return Kind.BOOL, None
        self.compare(node)
        return Kind.BOOL, None

    def boolean(self, node: Node) -> None:
        kind, _ = self.kind(node)
        if kind is not Kind.BOOL:
            what = node.name if isinstance(node, Name) else "this value"
            raise ExprError(
                f'{what} is {_a(kind)}, not a condition: compare it (e.g. > 20, == "x")',
                self.col(node),
            )

    def compare(self, node: Compare) -> None:
        lk, linfo = self.kind(node.left)
        rk, rinfo = self.kind(node.right)
        op = node.op
        if op in ("in", "not in"):
            if rk is not Kind.LIST:
                raise ExprError(f"{op} needs a list on its right, found {_a(rk)}", self.col(node))
            if lk in (Kind.LIST, Kind.BOOL):
                raise ExprError(f"{op} needs a number or a text on its left", self.col(node))
            if isinstance(node.right, Lit):
                for item in node.right.value:
                    self.same(lk, _lit_kind(item), node, linfo)
                    self.allowed(linfo, item, node)
            elif lk is not Kind.TEXT:
                raise ExprError(
                    f"{op} {_name(node.right)} needs a text on its left", self.col(node)
                )
            return
        if Kind.LIST in (lk, rk):
            raise ExprError("a list can only be used with in / not in", self.col(node))
        if op in ("<", "<=", ">", ">="):
            for side, kind in ((node.left, lk), (node.right, rk)):
                if kind is not Kind.NUMBER:
                    raise ExprError(
                        f"{op} compares numbers; {_describe(side)} is {_a(kind)}", self.col(side)
                    )
            return
        if Kind.NULL in (lk, rk):
            return
        self.same(lk, rk, node, linfo or rinfo)
        if isinstance(node.right, Lit):
            self.allowed(linfo, node.right.value, node)
        if isinstance(node.left, Lit):
            self.allowed(rinfo, node.left.value, node)

    def same(self, a: Kind, b: Kind, node: Compare, info: NameInfo | None) -> None:
        if Kind.NULL in (a, b) or a is b:
            return
        raise ExprError(
            f"{_describe(node.left)} is {_a(a)} but {_describe(node.right)} is {_a(b)}",
            self.col(node),
        )

    def allowed(self, info: NameInfo | None, value: Any, node: Compare) -> None:
        if info is None or not info.values or not isinstance(value, str):
            return
        if value not in info.values:
            name = _name(node.left) if isinstance(node.left, Name) else _name(node.right)
            raise ExprError(
                f"{name} is never {value!r}: it is one of {', '.join(info.values)}",
                self.col(node),
            )

    def unknown(self, name: str) -> str:
        if name.startswith("node.") and not self.node_facts:
            return f"{name}: node facts are only known in steps that act on nodes ({self.where})"
        known = list(FLEET_NAMES) + (list(NODE_NAMES) if self.node_facts else [])
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown name {name!r}{hint}"


def _lit_kind(value: Any) -> Kind:
    if value is None:
        return Kind.NULL
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, float | int):
        return Kind.NUMBER
    if isinstance(value, tuple):
        return Kind.LIST
    return Kind.TEXT


def _a(kind: Kind) -> str:
    return {
        Kind.NUMBER: "a number",
        Kind.TEXT: "a text",
        Kind.BOOL: "true/false",
        Kind.LIST: "a list",
        Kind.NULL: "null",
    }[kind]


def _name(node: Node) -> str:
    return node.name if isinstance(node, Name) else "the value"


def _describe(node: Node) -> str:
    if isinstance(node, Name):
        return node.name
    if isinstance(node, Lit):
        return show_value(node.value)
    return "the condition"


def show_value(value: Any) -> str:
    """A value as an expression would write it: 20, 12.5, "text", true, null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float | int):
        return f"{value:g}"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return str(value)


def parse(text: str, *, node_facts: bool, where: str = "this step") -> Expr:
    """Parse and check `text`. `node_facts`: whether `node.*` names may be used (steps that act
    on nodes). Raises ExprError naming the column."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("a condition must not be empty", 1)
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"a condition is at most {MAX_EXPR_CHARS} characters", 1)
    tree, cols = _Parser(text).parse()
    checker = _Checker(cols, node_facts, where)
    checker.boolean(tree)
    names: list[str] = []
    _collect(tree, names)
    return Expr(text.strip(), tree, any(n.startswith("node.") for n in names))


def _collect(node: Node, out: list[str]) -> None:
    if isinstance(node, Name):
        out.append(node.name)
    elif isinstance(node, Not):
        _collect(node.operand, out)
    elif isinstance(node, BoolOp):
        for part in node.operands:
            _collect(part, out)
    elif isinstance(node, Compare):
        _collect(node.left, out)
        _collect(node.right, out)


# --- evaluating ----------------------------------------------------------------------------------


def _eval(node: Node, env: Mapping[str, Any]) -> Any:
    if isinstance(node, Lit):
        return node.value
    if isinstance(node, Name):
        value = env.get(node.name)
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, list):
            return tuple(value)
        return value
    if isinstance(node, Not):
        return not _truth(_eval(node.operand, env))
    if isinstance(node, BoolOp):
        if node.op == "and":
            return all(_truth(_eval(p, env)) for p in node.operands)
        return any(_truth(_eval(p, env)) for p in node.operands)
    return _compare(node.op, _eval(node.left, env), _eval(node.right, env))


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "==":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    if op in ("in", "not in"):
        found = isinstance(b, Sequence) and a is not None and a in b
        return found if op == "in" else not found
    if not isinstance(a, float | int) or not isinstance(b, float | int):
        return False  # unknown (null) never satisfies an ordering
    if op == "<":
        return bool(a < b)
    if op == "<=":
        return bool(a <= b)
    if op == ">":
        return bool(a > b)
    return bool(a >= b)


def _truth(value: Any) -> bool:
    return value is True
