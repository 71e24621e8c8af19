"""``logs``: the recorded runs and their log lines (``runs_collection``).

Invariant: only reads. The lock is read alongside, so that a record still ``running`` whose run no
longer holds the lock shows as ``interrupted`` (:mod:`migronaut.observability.history`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migronaut.commands.lock import lock_status

if TYPE_CHECKING:
    from migronaut.core.workspace import Workspace
    from migronaut.observability.history import RunLog, RunRecord

__all__ = ["run_log", "runs"]


def runs(ws: Workspace, limit: int) -> list[RunRecord]:
    """The newest recorded runs, newest first (``migronaut logs``)."""
    from migronaut.observability.history import recent_runs

    with ws.slot.busy():
        return recent_runs(ws.connection.run_store, limit, lock=lock_status(ws).holder)


def run_log(
    ws: Workspace, run_id: str | None, *, migration: str | None, level: str | None
) -> RunLog | None:
    """A recorded run (by id or unique id prefix; ``None``: the newest) and its log lines."""
    from migronaut.observability.history import read_run_log

    with ws.slot.busy():
        return read_run_log(ws.connection.run_store, run_id, migration=migration, level=level,
                            lock=lock_status(ws).holder)
