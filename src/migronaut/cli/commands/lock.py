"""``migronaut lock`` (who holds the migration lock) and ``unlock`` (force-release it).

Both show the lock as ``up`` judges it: an expired lock is one the next run reclaims, and a lock
document migronaut cannot read is held until ``unlock`` removes it (the operator's way out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from migronaut.cli.app import command
from migronaut.cli.output import Output
from migronaut.cli.render import describe_holder
from migronaut.cli.session import Session
from migronaut.errors import ConfigInvalidError, LockAlreadyHeldError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.core.results import LockInfo, LockStatus

NOT_HELD = "No migration lock is currently held"


def unreadable_line(status: LockStatus) -> str:
    """The problems of an unreadable lock document, as ``lock`` and ``unlock`` show them."""
    return (f"✖ The lock document cannot be read: {status.describe_problems()}; runs treat it "
            "as held until it is removed (migronaut unlock)")


def _render_lock(status: LockStatus, out: Output) -> None:
    if status.holder is None:
        out.info(NOT_HELD)
        return
    out.info(f"Lock held by {describe_holder(status.holder)}")
    if status.state == "invalid":
        out.error(unreadable_line(status))
    elif status.state == "expired":
        ttl_s = (status.ttl_ms or 0) / 1000
        out.warn(f"⚠ Past its TTL of {ttl_s:g}s (likely a crashed run): the next run reclaims it")


@command(
    "lock",
    help="Show who holds the migration lock (read-only): held, expired (the next run reclaims "
    "it) or a lock document migronaut cannot read (held until `unlock` removes it).",
    short_help="Show the lock.",
)
def lock(session: Session) -> int:
    return session.run(lambda migrator: migrator.lock_status(), render=_render_lock,
                       to_json=lambda status: status.to_dict(), read_only=True)


@dataclass(frozen=True)
class Unlocked:
    """What ``unlock`` did: ``holder`` is who held the lock (``None``: nobody)."""

    released: bool
    holder: LockInfo | None
    declined: bool = False
    #: What migronaut could not read in the document it removed (``LockStatus.problems``).
    problems: tuple[dict[str, str], ...] = ()


def _render_unlock(outcome: Unlocked, out: Output) -> None:
    if outcome.declined:
        out.info("Aborted")
    elif outcome.released:
        out.info("✔ Lock released")
    else:
        out.info(NOT_HELD)


def _unlock_json(outcome: Unlocked) -> dict[str, Any]:
    holder = outcome.holder.to_dict() if outcome.holder else None
    out: dict[str, Any] = {"released": outcome.released, "holder": holder}
    if outcome.problems:
        out["problems"] = list(outcome.problems)
    return out


@command(
    "unlock",
    help="Force-release the migration lock whoever holds it, and whatever its document holds. "
    "Refused while the holder looks alive unless --force (its migration in flight is then left "
    "in doubt). Asks for confirmation unless --yes.",
    short_help="Force-release the lock.",
)
@click.option("-y", "--yes", is_flag=True, help="Release without a prompt (required with --json).")
@click.option("--force", is_flag=True,
              help="Release even when the holder looks alive (its heartbeat is younger than "
              "its TTL, or its pid is alive on this host).")
def unlock(session: Session, yes: bool, force: bool) -> int:
    if session.options.json and not yes:
        raise ConfigInvalidError(
            "unlock force-releases the migration lock and --json is non-interactive: pass --yes",
            {"option": "yes"},
        )

    def release(migrator: Migrator) -> Unlocked:
        from migronaut.core.lock import looks_alive

        status = migrator.lock_status()
        holder = status.holder
        if holder is None:
            return Unlocked(False, None)
        problems = tuple(problem.to_dict() for problem in status.problems)
        alive = looks_alive(status)
        if alive is not None and not force:
            raise LockAlreadyHeldError(
                f"The lock holder looks alive ({alive}): {describe_holder(holder)}; releasing "
                "it would let another run in beside it and leave the migration it is running "
                "in doubt — wait for it, or pass --force", {"holder": holder.to_dict(),
                                                           "alive": alive})
        if not yes:
            if alive is not None:
                session.out.warn(f"⚠ The holder looks alive ({alive}): the migration it is "
                                 "running will be left in doubt")
            session.out.warn(f"⚠ Lock held by {describe_holder(holder)}")
            if status.problems:
                session.out.warn(unreadable_line(status))
            if not session.confirm("Force-release this lock? [y/N] ", action="unlock"):
                return Unlocked(False, holder, declined=True, problems=problems)
        session.check_stop()
        removed = migrator.unlock()
        return Unlocked(removed is not None, removed, problems=problems if removed else ())

    return session.run(release, render=_render_unlock, to_json=_unlock_json, mutating=True)
