"""The small, safe expression language of playbook conditions (`when:`, `assert:`, `wait:`): the
names a condition may read, the tree and its evaluation (`model`), and `parse`, which reads a
condition's text and type-checks it (private `_parse` and `_check`).
"""

from __future__ import annotations

from gpuctl.core.playbook.expr._parse import MAX_EXPR_CHARS, parse, tokenize
from gpuctl.core.playbook.expr.model import (
    BANDS,
    FLEET_NAMES,
    HEALTH,
    LABEL_PREFIX,
    NODE_NAMES,
    NODE_STATES,
    REACH,
    BoolOp,
    Compare,
    Expr,
    ExprError,
    Kind,
    Lit,
    Name,
    NameInfo,
    Not,
    collect_names,
    name_info,
    show_value,
)

__all__ = [
    "BANDS",
    "FLEET_NAMES",
    "HEALTH",
    "LABEL_PREFIX",
    "MAX_EXPR_CHARS",
    "NODE_NAMES",
    "NODE_STATES",
    "REACH",
    "BoolOp",
    "Compare",
    "Expr",
    "ExprError",
    "Kind",
    "Lit",
    "Name",
    "NameInfo",
    "Not",
    "collect_names",
    "name_info",
    "parse",
    "show_value",
    "tokenize",
]
