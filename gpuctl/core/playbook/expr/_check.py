"""The type checker of playbook conditions, run when a playbook is read: an unknown name, a
number compared with text, a value a name never takes (`node.health == "sick"`) are errors with
the column.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from gpuctl.core.playbook.expr.model import (
    FLEET_NAMES,
    NODE_NAMES,
    BoolOp,
    Compare,
    ExprError,
    Kind,
    Lit,
    Name,
    NameInfo,
    Node,
    Not,
    name_info,
    show_value,
)


def check(tree: Node, cols: Mapping[int, int], *, node_facts: bool, where: str) -> None:
    """Check that `tree` is a condition whose names and comparisons make sense. `cols`: the column
    of each node (by id) from the parser; `node_facts`: whether `node.*` names may be used;
    `where`: the step, for the message. Raises ExprError naming the column."""
    _Checker(cols, node_facts, where).boolean(tree)


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
