"""``migronaut lock`` (who holds the migration lock) and ``unlock`` (force-release it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from migronaut.cli.app import command
from migronaut.cli.output import Output
from migronaut.cli.render import describe_holder
from migronaut.cli.session import Session
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.core.results import LockInfo

NOT_HELD = "No migration lock is currently held"


def _render_lock(holder: LockInfo | None, out: Output) -> None:
    out.info(f"Lock held by {describe_holder(holder)}" if holder else NOT_HELD)


def _lock_json(holder: LockInfo | None) -> dict[str, Any]:
    return {"held": holder is not None, "holder": holder.to_dict() if holder else None}


@command("lock", help="Show who holds the migration lock (read-only).", short_help="Show the lock.")
def lock(session: Session) -> int:
    return session.run(lambda migrator: migrator.lock_info(), render=_render_lock,
                       to_json=_lock_json)


@dataclass(frozen=True)
class Unlocked:
    """What ``unlock`` did: ``holder`` is who held the lock (``None``: nobody)."""

    released: bool
    holder: LockInfo | None
    declined: bool = False


def _render_unlock(outcome: Unlocked, out: Output) -> None:
    if outcome.declined:
        out.info("Aborted")
    elif outcome.released:
        out.info("✔ Lock released")
    else:
        out.info(NOT_HELD)


def _unlock_json(outcome: Unlocked) -> dict[str, Any]:
    holder = outcome.holder.to_dict() if outcome.holder else None
    return {"released": outcome.released, "holder": holder}


@command(
    "unlock",
    help="Force-release the migration lock whoever holds it. Dangerous while the holder is "
    "alive: it allows a concurrent run. Asks for confirmation unless --yes.",
    short_help="Force-release the lock.",
)
@click.option("-y", "--yes", is_flag=True, help="Release without a prompt (required with --json).")
def unlock(session: Session, yes: bool) -> int:
    if session.options.json and not yes:
        raise ConfigInvalidError(
            "unlock force-releases the migration lock and --json is non-interactive: pass --yes",
            {"option": "yes"},
        )

    def release(migrator: Migrator) -> Unlocked:
        holder = migrator.lock_info()
        if holder is None:
            return Unlocked(False, None)
        if not yes:
            session.out.warn(f"⚠ Lock held by {describe_holder(holder)}")
            if not session.confirm("Force-release this lock? [y/N] ", action="unlock"):
                return Unlocked(False, holder, declined=True)
        session.check_stop()
        removed = migrator.unlock()
        return Unlocked(removed is not None, removed)

    return session.run(release, render=_render_unlock, to_json=_unlock_json, mutating=True)
