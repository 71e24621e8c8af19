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
NAME_WIDTH, DETAIL_WIDTH = 48, 72


def _cut(text: str, width: int) -> str:
    text = sanitize_terminal(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def _detail(row: PlanRow) -> str:
    if row.live_name and row.reason == "name":
        return f'renamed from "{row.live_name}"'
    return row.reason or ""


def _plan_cells(collection: str, row: PlanRow) -> list[Cell]:
    named = row.target in ("index", "searchIndex")
    return [(_cut(collection, NAME_WIDTH), None), (TARGET_LABEL[row.target], None),
            (_cut(row.name, NAME_WIDTH) if named else "", None),
            (row.action, ACTION_STYLE.get(row.action, DIM)),
            (_cut(_detail(row), DETAIL_WIDTH), None)]


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
