"""Human renderings of ``migronaut converge``: the plan table of a dry run or ``--check``, its
summary line, and the history table (collections.md §2.10).

The command (:mod:`migronaut.cli.commands.converge`) decides what to run and which exit code to
give; this module only turns results into cells and lines. Every name and reason from the
database or a definition passes through :func:`~migronaut._redact.sanitize_terminal`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut._redact import sanitize_terminal
from migronaut.cli.output import CYAN, DIM, GREEN, RED, YELLOW, Output

if TYPE_CHECKING:
    from migronaut.cli.render import Cell
    from migronaut.declared.plan import ConvergeResult, PlanRow

PLAN_COLUMNS = ("Collection", "Target", "Index", "Action", "Detail")
HISTORY_COLUMNS = ("When", "Trigger", "Result", "Changes", "Who", "Why")
ACTION_STYLE = {"create": GREEN, "modify": CYAN, "recreate": YELLOW, "drop": YELLOW,
                "conflict": RED}
TARGET_LABEL = {"collection": "collection", "validator": "validator", "index": "index",
                "searchIndex": "search index"}
NAME_WIDTH, DETAIL_WIDTH, VALIDATOR_WIDTH = 48, 72, 160


def _cut(text: str, width: int) -> str:
    text = sanitize_terminal(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _detail(row: PlanRow) -> str:
    if row.live_name and row.reason == "name":
        return f'renamed from "{row.live_name}"'
    if row.target == "validator" and row.action in ("create", "modify", "drop"):
        return validator_change(row.from_, row.to) or row.reason or ""
    return row.reason or ""


def _plan_cells(collection: str, row: PlanRow) -> list[Cell]:
    named = row.target in ("index", "searchIndex")
    width = VALIDATOR_WIDTH if row.target == "validator" else DETAIL_WIDTH
    return [(_cut(collection, NAME_WIDTH), None), (TARGET_LABEL[row.target], None),
            (_cut(row.name, NAME_WIDTH) if named else "", None),
            (row.action, ACTION_STYLE.get(row.action, DIM)),
            (_cut(_detail(row), width), None)]


def validator_change(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str:
    """What a validator row changes, in a line: the fields every insert must now carry (a
    versioned collection's ``__v``/``__rev`` among them — a plain ``insert_one`` without them
    is rejected), the other rules added, removed or changed, and level/action ``old → new``."""
    if not after:
        return "removes the validator: documents are no longer checked"
    before = before or {}
    old, new = _schema(before.get("validator")), _schema(after.get("validator"))
    parts = []
    added = [name for name in _required(new) if name not in _required(old)]
    dropped = [name for name in _required(old) if name not in _required(new)]
    if added:
        rejected = "logged (action warn)" if after.get("validationAction") == "warn" \
            else "rejected"
        parts.append(f"every insert must carry {', '.join(added)} (without: {rejected})")
    if dropped:
        parts.append(f"no longer requires {', '.join(dropped)}")
    rules = _changed_rules(old, new) + _changed_rules(_operators(before.get("validator")),
                                                      _operators(after.get("validator")))
    if rules:
        parts.append("rules " + ", ".join(rules[:4]) + (", …" if len(rules) > 4 else ""))
    for key, label in (("validationLevel", "level"), ("validationAction", "action")):
        if before.get(key) != after.get(key):
            parts.append(f"{label} {before[key]} → {after.get(key)}" if before.get(key)
                         else f"{label} {after.get(key)}")
    return "; ".join(parts)


def _schema(validator: Any) -> Mapping[str, Any]:
    schema = validator.get("$jsonSchema") if isinstance(validator, Mapping) else None
    return schema if isinstance(schema, Mapping) else {}


def _operators(validator: Any) -> Mapping[str, Any]:
    """A validator's query-operator rules (everything but ``$jsonSchema``)."""
    if not isinstance(validator, Mapping):
        return {}
    return {key: value for key, value in validator.items() if key != "$jsonSchema"}


def _required(schema: Mapping[str, Any]) -> list[str]:
    required = schema.get("required")
    return [str(name) for name in required] if isinstance(required, list) else []


def _changed_rules(before: Any, after: Any, path: str = "") -> list[str]:
    """``+path`` / ``-path`` / ``~path`` for each rule that differs, two levels deep
    (``+properties.email``); ``required`` aside, it is said in words."""
    if not (isinstance(before, Mapping) and isinstance(after, Mapping)):
        return [] if before == after else ["~" + path]
    found: list[str] = []
    for key in [*before, *(key for key in after if key not in before)]:
        inner = f"{path}.{key}" if path else str(key)
        if inner == "required":
            continue
        if key in before and key in after:
            found.extend(_changed_rules(before[key], after[key], inner))
            continue
        side = after.get(key) if key in after else before.get(key)
        sign = "+" if key in after else "-"
        if not path and isinstance(side, Mapping) and side:
            found.extend(f"{sign}{inner}.{child}" for child in side)
        else:
            found.append(sign + inner)
    return found


def summary(result: ConvergeResult) -> str:
    """``✔ N collection(s) match…`` or ``Would make/Made N change(s) in X of Y…`` + parts."""
    plans = result.collections
    rows = [row for plan in plans for row in plan.actions]
    count = {action: sum(1 for row in rows if row.action == action)
             for action in ("unchanged", "conflict")}
    destructive = sum(1 for row in rows if row.is_destructive)
    kept = sum(1 for row in rows if row.action == "keep" and row.reason == "not declared"
               and row.target == "index")
    if result.changed == 0 and not count["conflict"]:
        head = f"✔ {len(plans)} collection(s) match their declarations"
    else:
        touched = sum(1 for plan in plans if any(
            row.is_change and (result.dry_run or row.status == "applied")
            for row in plan.actions))
        verb = "Would make" if result.dry_run else "Made"
        head = f"{verb} {result.changed} change(s) in {touched} of {len(plans)} collection(s)"
    parts = [f"{destructive} drop/rebuild" if destructive else "",
             f"{count['conflict']} conflict(s)" if count["conflict"] else "",
             f"{kept} undeclared index(es) kept" if kept else "",
             f"{count['unchanged']} unchanged" if count["unchanged"] else ""]
    return " · ".join([head, *(part for part in parts if part)])


def render_plan(result: ConvergeResult, out: Output, *, verbose: bool) -> None:
    """The ``Collection | Target | Index | Action | Detail`` table and its summary."""
    from migronaut.cli.render import table

    if not result.collections:
        out.info("No collections declared — set collections or collections_dir")
        return
    cells = [_plan_cells(plan.name, row) for plan in result.collections for row in plan.actions
             if verbose or row.action != "unchanged"]
    if cells:
        table(PLAN_COLUMNS, cells, out, wrap=("Detail",))
    out.info(summary(result))


def _when(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value or "—")


def drift_line(result: ConvergeResult) -> str:
    """The ``✖`` line of a ``--check`` that found the collections out of sync."""
    plans = result.collections
    drifted = [plan.name for plan in plans if plan.changes or plan.conflicts]
    conflicts = sum(len(plan.conflicts) for plan in plans)
    names = ", ".join(sanitize_terminal(name) for name in drifted[:5]) + (
        ", …" if len(drifted) > 5 else "")
    what = f"{result.changed} change(s)" + (f" and {conflicts} conflict(s)" if conflicts else "")
    fix = "resolve the conflicts, then run" if conflicts else "run"
    return (f"✖ COLLECTIONS_DRIFT: {what} pending in {len(drifted)} of {len(plans)} "
            f"collection(s): {names} — {fix} `migronaut converge` to apply them")


def render_history(entries: Sequence[Mapping[str, Any]], out: Output) -> None:
    """The ``When | Trigger | Result | Changes | Who | Why`` table."""
    from migronaut.cli.render import table

    if not entries:
        out.info("No converge history yet (only runs that changed something or failed are "
                 "recorded)")
        return
    rows: list[list[Cell]] = []
    for entry in entries:
        success = bool(entry.get("success"))
        why = entry.get("reason") if success else entry.get("error") or entry.get("reason")
        rows.append([(_when(entry.get("startedAt")), None),
                     (sanitize_terminal(str(entry.get("trigger", ""))), None),
                     ("success" if success else "failed", GREEN if success else RED),
                     (str(entry.get("changed", 0)), None),
                     (_cut(str(entry.get("requestedBy") or entry.get("executedBy") or ""),
                           NAME_WIDTH), None),
                     (_cut(str(why or ""), DETAIL_WIDTH), None)])
    table(HISTORY_COLUMNS, rows, out, wrap=("Why",))
