"""Reversibility checks: does ``down`` undo what ``up`` did?

One check, the *cycle*, runs a pending migration ``up`` → ``down`` → ``up`` through a
:class:`~migronaut.Migrator` and snapshots the user data around each step
(:mod:`migronaut.testing.snapshots`). A migration is reversible when

1. after ``down`` the data is what it was before ``up`` (``down`` restores what ``up`` changed —
   the check that catches a ``down`` that does nothing), and
2. the second ``up`` gives the data the first one gave (nothing ``down`` left behind changes what
   ``up`` does).

Failures are ``AssertionError`` with the diff of the first differing collection, so the helpers
work under pytest, unittest or a plain script; they never import pytest. Misuse (an unknown file,
a migration already applied) is a :class:`~migronaut.MigronautError`, not a failed assertion.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from migronaut.errors import ConfigInvalidError, MigrationFileNotFoundError, MigronautError
from migronaut.testing.snapshots import snapshot

if TYPE_CHECKING:
    from pymongo.database import Database

    from migronaut.api import Migrator
    from migronaut.core.results import RunResult

__all__ = ["Seed", "assert_all_reversible", "assert_reversible", "migrate_before"]

#: Puts data in the database before a migration runs (its return value is ignored).
Seed = Callable[["Database[dict[str, Any]]"], object]


def migrate_before(migrator: Migrator, name: str) -> list[RunResult]:
    """Apply every pending migration that sorts before ``name``; ``name`` stays pending.

    The way to seed data in the shape a data migration expects::

        migrate_before(migronaut_migrator, "20260102000000_split_names.py")
        migronaut_migrator.db.users.insert_one({"name": "Ada Lovelace"})
        migronaut_migrator.up("20260102000000_split_names.py")
    """
    return _migrate_before(migrator, name, "migrate_before")


def assert_reversible(migrator: Migrator, name: str, *, seed: Seed | None = None) -> None:
    """Assert that migration ``name`` is reversible (see the module docstring).

    Applies what sorts before ``name`` (:func:`migrate_before`), calls ``seed(db)`` when given,
    then runs the cycle. Afterwards ``name`` is applied. ``name`` must be pending: use a database
    where it was never applied (the ``migronaut_migrator`` fixture, not ``migronaut_db``).
    """
    __tracebackhide__ = True
    _migrate_before(migrator, name, "assert_reversible")
    _cycle(migrator, name, seed)


def assert_all_reversible(
    migrator: Migrator,
    *,
    seeds: Mapping[str, Seed] | None = None,
    skip: Collection[str] = (),
) -> None:
    """Assert that every pending migration is reversible, running the cycle on each in order.

    ``seeds`` maps a migration file name to a ``seed(db)`` called just before that migration's
    cycle (the data it should find). ``skip`` names migrations that are one-way by design: they
    are applied, not cycled. Stops at the first migration that is not reversible; at least one
    migration must be pending (a check over nothing cannot fail, so it is refused).
    """
    __tracebackhide__ = True
    seeds = dict(seeds or {})
    files = migrator.files()
    unknown = sorted((set(seeds) | set(skip)) - set(files))
    if unknown:
        raise MigrationFileNotFoundError(
            "assert_all_reversible: no such migration file: " + ", ".join(unknown),
            {"names": unknown, "directory": str(migrator.directory)},
        )
    applied = _applied(migrator)
    pending = [f for f in files if f not in applied]
    if not pending:
        raise ConfigInvalidError(
            f"assert_all_reversible: every migration is already applied in database "
            f"{migrator.db.name!r}, so there is nothing to check — use a database where they "
            "are pending (the migronaut_migrator fixture, not migronaut_db)",
            {"database": migrator.db.name},
        )
    for name in pending:
        if name in skip:
            seed = seeds.get(name)
            if seed is not None:
                seed(migrator.db)
            migrator.up(name)
        else:
            _cycle(migrator, name, seeds.get(name))


# ------------------------------------------------------------------------------- internals


def _cycle(migrator: Migrator, name: str, seed: Seed | None) -> None:
    """``up`` → ``down`` → ``up`` with snapshots; raise ``AssertionError`` on the first problem."""
    __tracebackhide__ = True
    if seed is not None:
        seed(migrator.db)
    before = snapshot(migrator)
    migrator.up(name)
    after_up = snapshot(migrator)
    try:
        migrator.down(name)
    except MigronautError as error:
        raise AssertionError(f"{name} is not reversible: down failed: {error.message}") from error
    problem = before.diff(snapshot(migrator), labels=("before up", "after down"))
    if problem:
        raise AssertionError(
            f"{name} is not reversible: down did not restore the data up changed\n{problem}"
        )
    try:
        migrator.up(name)
    except MigronautError as error:
        raise AssertionError(
            f"{name} is not reversible: up failed after down: {error.message}"
        ) from error
    problem = after_up.diff(snapshot(migrator), labels=("first up", "up after down"))
    if problem:
        raise AssertionError(
            f"{name} is not reversible: up after down did not give the data of the first up\n"
            f"{problem}"
        )


def _migrate_before(migrator: Migrator, name: str, helper: str) -> list[RunResult]:
    files, applied = _require_pending(migrator, name, helper)
    earlier = [f for f in files if f < name and f not in applied]
    return migrator.up(to=earlier[-1]) if earlier else []


def _applied(migrator: Migrator) -> set[str]:
    return {row.file for row in migrator.status("applied", checksums=False)}


def _require_pending(migrator: Migrator, name: str, helper: str) -> tuple[list[str], set[str]]:
    """The migration files and the applied ones; ``name`` must be a file and not applied."""
    from migronaut.core.files import resolve_file

    files = migrator.files()
    if name not in files:
        resolve_file(migrator.directory, name)  # the precise error: bad name, no such file
        raise MigrationFileNotFoundError(
            f"{helper}: {name} is not a migration file (ignored by discovery)",
            {"filename": name, "directory": str(migrator.directory)},
        )
    applied = _applied(migrator)
    if name in applied:
        raise ConfigInvalidError(
            f"{helper}: {name} is already applied in database {migrator.db.name!r}, and it "
            "must be pending — use a database where it was never applied (the "
            "migronaut_migrator fixture, not migronaut_db)",
            {"filename": name, "database": migrator.db.name},
        )
    return files, applied
