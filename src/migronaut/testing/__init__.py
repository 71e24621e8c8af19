"""migronaut.testing — test your migrations with pytest (or any test runner).

The pytest plugin (:mod:`migronaut.testing.plugin`, loaded automatically when migronaut is
installed) gives each test a fresh database: ``migronaut_db`` with every migration applied,
``migronaut_migrator`` with none applied. The helpers here work with or without pytest:

* :func:`assert_reversible` — ``up`` → ``down`` → ``up`` of one migration leaves the data as it
  was (``down`` restores what ``up`` changed, and a second ``up`` gives what the first gave);
* :func:`assert_all_reversible` — the same for every pending migration, in order;
* :func:`migrate_before` — apply what precedes a migration, to seed data in the shape it expects;
* :func:`snapshot` — the user data of a database (:class:`DatabaseSnapshot`), comparable and
  diffable.

The user guide is <https://migronaut.readthedocs.io/en/latest/testing/>. Imports are lazy:
importing this package costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from migronaut import _lazy_exports

if TYPE_CHECKING:
    from migronaut.testing.reversible import (
        Seed,
        assert_all_reversible,
        assert_reversible,
        migrate_before,
    )
    from migronaut.testing.snapshots import CollectionSnapshot, DatabaseSnapshot, snapshot

__all__ = [
    "CollectionSnapshot",
    "DatabaseSnapshot",
    "Seed",
    "assert_all_reversible",
    "assert_reversible",
    "migrate_before",
    "snapshot",
]

_LAZY = {
    "Seed": "migronaut.testing.reversible",
    "assert_all_reversible": "migronaut.testing.reversible",
    "assert_reversible": "migronaut.testing.reversible",
    "migrate_before": "migronaut.testing.reversible",
    "CollectionSnapshot": "migronaut.testing.snapshots",
    "DatabaseSnapshot": "migronaut.testing.snapshots",
    "snapshot": "migronaut.testing.snapshots",
}


__getattr__, __dir__ = _lazy_exports("migronaut.testing", _LAZY, globals(), __all__)
