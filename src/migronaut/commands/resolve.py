"""``resolve``: the operator's decision on a migration in doubt.

A migration is in doubt when a run claimed its changelog record (``running``/``reverting``) and
ended without recording whether its body finished — killed, its lock lost, its final write
failed. Only someone who looked at the data can say; ``resolve`` records what they say, under
the lock, and nothing else settles it.

Invariant: ``resolve`` changes only a record in doubt — one another run left ``running`` or
``reverting`` (holding the lock, this run knows that run is gone) — and only that run's claim of
it; the decision, who took it, why and the claim it replaced stay on the record
(``resolution``) and in the run log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from migronaut.core.changelog import UNFINISHED, judge_unfinished, resolved_write
from migronaut.core.files import check_name
from migronaut.core.locked_run import locked_run
from migronaut.core.plan import validate_actor
from migronaut.errors import ConfigInvalidError, NotAppliedError, StateInvalidError

if TYPE_CHECKING:
    from migronaut.core.run import Run
    from migronaut.core.workspace import Workspace

__all__ = ["Resolution", "check_resolve_options", "resolve"]

Outcome = Literal["applied", "pending"]


@dataclass(frozen=True)
class Resolution:
    """What ``resolve`` recorded: ``file`` is now ``status`` (``applied``, ``failed`` — the next
    ``up`` runs it — or ``reverted``), by the operator's decision ``resolved_as``."""

    file: str
    resolved_as: Outcome
    status: str
    previous: str
    run_id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "resolvedAs": self.resolved_as, "status": self.status,
                "previous": self.previous, "runId": self.run_id, "reason": self.reason}


def resolve(
    ws: Workspace, file: str, *, outcome: Outcome, reason: str | None,
    requested_by: str | None = None,
) -> Resolution:
    """Record whether the in-doubt migration ``file`` is applied (``outcome="applied"``: its
    body finished) or not (``"pending"``); ``reason`` is required."""
    name = check_resolve_options(file, outcome, reason, requested_by)
    assert reason is not None
    done: list[Resolution] = []

    def work(run: Run) -> None:
        done.append(_resolve(ws, run, name, outcome=outcome, reason=reason))

    locked_run(ws, "resolve", None, work, no_lock=False, requested_by=requested_by,
               reason=reason, settling=True)
    return done[0]


def check_resolve_options(
    file: Any, outcome: Any, reason: Any, requested_by: Any
) -> str:
    """Every option checked before connecting; the bare migration name."""
    name = check_name(file, field="file")
    if outcome not in ("applied", "pending"):
        raise ConfigInvalidError(
            f"resolve needs the outcome: --applied or --pending (got {outcome!r})",
            {"option": "outcome"})
    if reason is None or (isinstance(reason, str) and not reason.strip()):
        raise ConfigInvalidError(
            "resolve needs --reason: what you checked to decide (kept in the changelog and "
            "the run log)", {"option": "reason"})
    validate_actor(requested_by, reason)
    return name


def _resolve(ws: Workspace, run: Run, name: str, *, outcome: Outcome, reason: str) -> Resolution:
    changelog = ws.connection.changelog
    record = changelog.get(name)
    if record is None or record.get("status") not in UNFINISHED:
        status = record.get("status") if record else "no record"
        raise NotAppliedError(
            f"Migration {name} is not in doubt ({status}): only a record a run left running or "
            "reverting is resolved", {"name": name, "status": status})
    found = judge_unfinished([record], live_owner=run.lock.owner if run.lock else None)[0]
    applied = outcome == "applied"
    resolution = {"as": outcome, "by": run.requested_by or run.executed_by, "reason": reason,
                  "runId": run.id}
    change = resolved_write(record, applied=applied, resolution=resolution)
    if not changelog.write(change).matched_count:
        raise StateInvalidError(
            f"The changelog record of {name} changed while it was being resolved; run "
            "migronaut status and resolve again", {"name": name})
    status = "applied" if applied else "failed" if found.status == "running" else "reverted"
    logger = ws.project.logger
    fields = {"runId": run.id, "migration": name, "resolvedAs": outcome, "status": status,
              "inDoubt": found.to_dict(), "reason": reason, "event": "migration:resolved"}
    message, args = "✔ Resolved %s as %s (now %s): %s", (name, outcome, status, reason)
    logger.info(message, *args, extra=fields)
    if run.recording is not None:
        run.recording.line(logging.INFO, message, args, fields, {"runId": run.id,
                                                                 "migration": name},
                           userland=False)
    return Resolution(name, outcome, status, found.status, found.run_id, reason)
