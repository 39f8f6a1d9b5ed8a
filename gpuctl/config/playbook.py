"""Playbook files: validated like the inventory (exit 2 with file, line and field), resolved into
`gpuctl.core.playbook.Playbook`.

    name: nightly-consolidation
    targets: all               # or {names: [gpu0*], groups: [a100], labels: {..}, states: [..]}
    settings: {serial: 2, max_fail_percentage: 25, window: "22:00-04:00"}
    privileged: [[systemctl, restart, nvidia-persistenced]]
    steps:
      - consolidate: {max_moves: 4}
        when: fragmentation_pct > 20

Every problem is a `PlaybookError` (exit 2): unknown keys and unknown step kinds (with the
closest valid one), a step with no kind or two, a condition that does not parse or names an
unknown number, a `sudo: true` command no `privileged:` prefix allows, a job spec that does not
load, and (given an inventory) a target node or group the inventory does not define. The file's
schema (the pydantic models): `gpuctl.config.playbook_schema`.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gpuctl.config.document import Document, Loc
from gpuctl.config.loader import load_document, validate_data
from gpuctl.config.playbook_schema import (
    STEP_KEYS,
    ManyTargets,
    OneTarget,
    PlaybookFile,
    SelectorModel,
    SettingsModel,
    StepModel,
    step_field,
)
from gpuctl.core import playbook as core
from gpuctl.core.model import Inventory
from gpuctl.core.playbook.expr import Expr, ExprError, parse
from gpuctl.errors import ConfigError

KIND = "playbook"
_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")
_SERIAL_PCT = re.compile(r"^(\d{1,3}(?:\.\d+)?)%$")


class PlaybookError(ConfigError):
    pass


def load_playbook(path: Path, *, inventory: Inventory | None = None) -> core.Playbook:
    """Read, validate and resolve a playbook; with `inventory`, check its targets against it.
    Raises PlaybookError (exit 2) naming the file, the line and the field."""
    doc = load_document(path, kind=KIND, error=PlaybookError)
    _check_step_keys(doc)
    model = validate_data(
        doc.data, PlaybookFile, path=doc.path, lines=doc.lines, error=PlaybookError
    )
    selectors, listed = _selectors(doc)
    steps = tuple(_step(doc, i, s, model) for i, s in enumerate(model.steps))
    if inventory is not None:
        check_targets(doc, selectors, listed, inventory)
    return core.Playbook(
        name=model.name,
        description=model.description,
        targets=tuple(_selector(s) for s in selectors),
        steps=steps,
        settings=_settings(doc, model.settings),
        privileged=tuple(tuple(p) for p in model.privileged),
        source=str(path),
        digest=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def _fail(doc: Document, loc: Loc, message: str, hint: str | None = None) -> ConfigError:
    return doc.error(loc, message, hint=hint, error=PlaybookError)


def _check_step_keys(doc: Document) -> None:
    """An unknown key in a step is an unknown step kind: say so, with the closest kind."""
    steps = doc.data.get("steps")
    if not isinstance(steps, list):
        return
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        for key in step:
            if key not in STEP_KEYS:
                close = difflib.get_close_matches(key, STEP_KEYS, n=1, cutoff=0.6)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else "step kinds: " + ", ".join(core.STEP_KINDS)
                )
                raise _fail(doc, ("steps", i, key), f"unknown step {key!r}", hint)


def _step(doc: Document, i: int, step: StepModel, model: PlaybookFile) -> core.Step:
    kinds = step.kinds
    if len(kinds) != 1:
        found = " and ".join(kinds) if kinds else "none"
        raise _fail(
            doc,
            ("steps", i),
            f"a step has exactly one kind (found {found})",
            "step kinds: " + ", ".join(core.STEP_KINDS),
        )
    kind = kinds[0]
    raw: BaseModel = getattr(step, step_field(kind))
    options: dict[str, Any] = raw.model_dump()
    node_step = kind in core.NODE_KINDS or kind in ("wait", "assert")  # these judge each node
    when = None
    if step.when is not None:
        when = _expr(doc, ("steps", i, "when"), step.when, node_step, kind)
    if kind in ("wait", "assert"):
        key = "until" if kind == "wait" else "that"
        options[key] = _expr(doc, ("steps", i, kind, key), options[key], True, kind)
    if kind == "run":
        _check_run(doc, i, options, model)
    if kind == "submit":
        options["files"] = _job_files(doc, i, options["files"])
    return core.Step(
        index=i,
        kind=kind,
        options=options,
        name=step.name,
        when=when,
        source=doc.where(("steps", i)),
    )


def _expr(doc: Document, loc: Loc, text: str, node_facts: bool, kind: str) -> Expr:
    try:
        return parse(text, node_facts=node_facts, where=f"{kind} does not")
    except ExprError as exc:
        raise _fail(doc, loc, f"bad expression {text!r}: {exc}") from None


def _check_run(doc: Document, i: int, options: dict[str, Any], model: PlaybookFile) -> None:
    argv: list[str] = options["argv"]
    loc: Loc = ("steps", i, "run")
    if any("\x00" in a for a in argv) or not argv[0]:
        raise _fail(doc, (*loc, "argv"), "argv items are non-empty commands without NUL characters")
    if Path(argv[0]).name in ("sudo", "su", "doas", "pkexec"):
        raise _fail(
            doc,
            (*loc, "argv"),
            f"do not call {argv[0]} yourself: write the command and `sudo: true`",
            "privileged commands run through `sudo -n` and must be listed in `privileged:`",
        )
    if not options["sudo"]:
        return
    allowed = [tuple(p) for p in model.privileged]
    if not any(tuple(argv[: len(p)]) == p for p in allowed):
        declared = "; ".join(" ".join(p) for p in allowed) or "none"
        raise _fail(
            doc,
            (*loc, "sudo"),
            f"undeclared privileged command {' '.join(argv)!r}: no `privileged:` entry "
            "is a prefix of it",
            f"add [{', '.join(argv)}] (or a prefix of it) to `privileged:` (declared: {declared})",
        )


def _job_files(doc: Document, i: int, files: list[str]) -> list[str]:
    from gpuctl.config.jobspec_files import load_specs

    base = doc.path.parent
    out = []
    for k, name in enumerate(files):
        path = Path(name) if Path(name).is_absolute() else base / name
        if not path.is_file():
            raise _fail(doc, ("steps", i, "submit", "files", k), f"job spec {name!r} not found")
        out.append(str(path))
    load_specs([Path(f) for f in out], require_command=True)  # a bad spec: its own file:line
    return out


def _settings(doc: Document, s: SettingsModel) -> core.Settings:
    serial: int | None = None
    serial_pct: float | None = None
    if isinstance(s.serial, bool):
        raise _fail(doc, ("settings", "serial"), "must be a number of nodes or a percentage")
    if isinstance(s.serial, int):
        if s.serial < 1:
            raise _fail(doc, ("settings", "serial"), f"must be 1 or more (got {s.serial})")
        serial = s.serial
    elif isinstance(s.serial, str):
        m = _SERIAL_PCT.match(s.serial.strip())
        if m is None or not 0 < float(m.group(1)) <= 100:
            raise _fail(
                doc,
                ("settings", "serial"),
                f"must be a number of nodes or a percentage such as 25% (got {s.serial!r})",
            )
        serial_pct = float(m.group(1))
    return core.Settings(
        serial=serial,
        serial_pct=serial_pct,
        max_fail_percentage=s.max_fail_percentage,
        window=_window(doc, s.window),
    )


def parse_window(text: str) -> core.TimeWindow | None:
    """`HH:MM-HH:MM` -> a window; `always` -> None. Raises ValueError."""
    if text.strip() == "always":
        return None
    m = _WINDOW.match(text.strip())
    if m is None:
        raise ValueError(f"must be HH:MM-HH:MM (e.g. 22:00-04:00) or always (got {text!r})")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    window = core.TimeWindow(h1 * 60 + m1, h2 * 60 + m2)
    if window.start_min == window.end_min:
        raise ValueError(f"{text} is empty: write always for any time")
    return window


def _window(doc: Document, text: str | None) -> core.TimeWindow | None:
    if text is None:
        return None
    try:
        return parse_window(text)
    except ValueError as exc:
        raise _fail(doc, ("settings", "window"), str(exc)) from None


def _selectors(doc: Document) -> tuple[list[SelectorModel], bool]:
    """The target selectors as written, and whether they were written as a list."""
    raw = doc.data.get("targets")
    if raw == "all":
        return [SelectorModel()], False
    many = isinstance(raw, list)
    if not (many or isinstance(raw, dict)):
        raise _fail(
            doc,
            ("targets",),
            "must be all, a selector (names, groups, labels, states) or a list of selectors",
        )
    shape: type[OneTarget | ManyTargets] = ManyTargets if many else OneTarget
    checked = validate_data(
        {"targets": raw}, shape, path=doc.path, lines=doc.lines, error=PlaybookError
    )
    return (checked.targets if isinstance(checked, ManyTargets) else [checked.targets]), many


def _selector(s: SelectorModel) -> core.Selector:
    return core.Selector(
        names=tuple(s.names), groups=tuple(s.groups), labels=dict(s.labels), states=tuple(s.states)
    )


def check_targets(
    doc: Document, items: list[SelectorModel], listed: bool, inventory: Inventory
) -> None:
    """Every node name and group a selector writes must exist in the inventory (a glob must
    match a node): an undefined target is an error, not an empty run."""
    names = [n.name for n in inventory.nodes]
    groups = sorted({g for n in inventory.nodes for g in n.groups})
    for j, sel in enumerate(items):
        base: Loc = ("targets", j) if listed else ("targets",)
        for k, pattern in enumerate(sel.names):
            if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
                close = difflib.get_close_matches(pattern, names, n=1, cutoff=0.6)
                what = "matches no node" if _is_glob(pattern) else "is no node"
                raise _fail(
                    doc,
                    (*base, "names", k),
                    f"undefined target: {pattern!r} {what} of the inventory",
                    f"did you mean {close[0]!r}?" if close else "see `gpuctl inventory list`",
                )
        for k, group in enumerate(sel.groups):
            if group not in groups:
                close = difflib.get_close_matches(group, groups, n=1, cutoff=0.6)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else ("groups in the inventory: " + (", ".join(groups) or "none"))
                )
                raise _fail(
                    doc,
                    (*base, "groups", k),
                    f"undefined target: no node of the inventory is in group {group!r}",
                    hint,
                )


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


__all__ = ["PlaybookError", "load_playbook", "parse_window"]
