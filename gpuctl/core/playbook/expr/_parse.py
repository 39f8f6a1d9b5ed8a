"""Reading a playbook condition: the tokenizer, the parser, and `parse`, which type-checks the
tree (`_check`) and returns an `Expr` (`model`).

Grammar (no function calls, no attribute access beyond the names listed, no `eval`):

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := operand (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not in") operand)?
    operand := NUMBER | STRING | true | false | null | NAME | "[" literal, ... "]" | "(" expr ")"
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from gpuctl.core.playbook.expr._check import check
from gpuctl.core.playbook.expr.model import (
    BoolOp,
    Compare,
    Expr,
    ExprError,
    Lit,
    Name,
    Node,
    Not,
    collect_names,
)

MAX_EXPR_CHARS = 500


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


def parse(text: str, *, node_facts: bool, where: str = "this step") -> Expr:
    """Parse and check `text`. `node_facts`: whether `node.*` names may be used (steps that act
    on nodes). Raises ExprError naming the column."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("a condition must not be empty", 1)
    if len(text) > MAX_EXPR_CHARS:
        raise ExprError(f"a condition is at most {MAX_EXPR_CHARS} characters", 1)
    tree, cols = _Parser(text).parse()
    check(tree, cols, node_facts=node_facts, where=where)
    names: list[str] = []
    collect_names(tree, names)
    return Expr(text.strip(), tree, any(n.startswith("node.") for n in names))
