"""Background migrations through the migration line: what ``up`` and ``down`` do to them.

``up`` of a background file validates its spec (before any write), then registers it — a state
document ``blocked`` or ``pending`` — and the changelog records it with ``kind: 'background'``;
no user document is touched. ``down`` re-registers it in the revert direction when it declares a
way back, withdraws it when nothing was rewritten yet, and refuses otherwise (reference §1.9).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut.background.planning.job import is_background_file
from migronaut.background.planning.spec import resolve_background, validate_requires
from migronaut.errors import (
    BackgroundConflictError,
    IrreversibleMigrationError,
    MigronautError,
)

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

    from migronaut.background.engine_core import EngineCore
    from migronaut.core.files import MigrationModule

__all__ = ["Registrar"]


class Registrar:
    def __init__(self, engine: EngineCore, *, files: Sequence[str],
                 versioning_of: Callable[[str], Mapping[str, Any] | None] | None = None) -> None:
        self.engine = engine
        self.files = list(files)
        #: the target collection's declared versioning (collections.md §3.7), if it has one
        self.versioning_of = versioning_of

    def validate(self, migration: MigrationModule) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The resolved spec and checked ``requires`` — raises before anything is written."""
        declared = migration.background
        collection = declared.get("collection") if isinstance(declared, Mapping) else None
        versioning = (self.versioning_of(collection)
                      if self.versioning_of is not None and isinstance(collection, str)
                      else None)
        resolved = resolve_background(
            migration.name, declared, reserved_collections=self.engine.reserved,
            collection_versioning=versioning,
        )
        requires = validate_requires(
            migration.name,
            migration.requires,
            self.files,
            lambda other: is_background_file(self.engine.directory / other),
        )
        return dict(resolved.spec), tuple(requires)

    def register(
        self,
        migration: MigrationModule,
        *,
        checksum: str,
        direction: str = "forward",
        session: ClientSession | None = None,
    ) -> dict[str, Any]:
        spec, requires = self.validate(migration)
        self.engine.store.ready()
        waits_for = [w["migration"] for w in self.engine.unmet(requires)]
        status = "blocked" if waits_for and direction == "forward" else "pending"
        state = self.engine.store.register(
            migration.name,
            status=status,
            direction=direction,
            mode=str(spec["mode"]),
            collection=spec.get("collection"),
            spec=spec,
            checksum=checksum,
            requires=requires,
            waits_for=waits_for if direction == "forward" else [],
            description=migration.description,
            session=session,
        )
        payload: dict[str, Any] = {"migration": migration.name, "status": status,
                                   "direction": direction}
        if waits_for and direction == "forward":
            payload["waitsFor"] = waits_for
        self.engine.emit("background:registered", payload)
        return state

    def revert(
        self, migration: MigrationModule, *, checksum: str, session: ClientSession | None = None
    ) -> str:
        """``down``: ``reverting`` (re-registered backwards) or ``withdrawn``; else refuse."""
        name = migration.name
        spec, _ = self.validate(migration)
        if spec.get("reversible"):
            self.register(migration, checksum=checksum, direction="revert", session=session)
            return "reverting"
        state = self.engine.store.get(name)
        if state is None:
            return "withdrawn"
        registration = str(state.get("registration"))
        if int(state.get("generation") or 0) == 0 and self.engine.store.withdraw(
            name, registration=registration, generation=0, session=session
        ):
            return self._withdrawn(name)
        return self._withdraw_planned(name, session)  # a plan was committed, maybe just now

    def _withdraw_planned(self, name: str, session: ClientSession | None) -> str:
        """Withdraw a migration that has a plan: stop it, let its lanes drain, look again.

        Nothing rewritten → the state goes (conditionally on what was read, in the ``down``
        migration's ``session``); rewritten → ``MIGRATION_IRREVERSIBLE``; lanes still holding
        leases after the wait → ``BACKGROUND_CONFLICT``. A refused withdrawal leaves the
        migration as it was found.
        """
        engine = self.engine
        state = engine.store.require(name)
        if self._rewritten(state):
            raise self._irreversible(name)
        paused = False
        if state["status"] in ("blocked", "pending", "running"):
            paused = engine.control(name, "pause", reason="down: withdrawing").applied == \
                "changed"
        deadline = time.monotonic() + _DRAIN_S
        while engine.store.live_leases(name) and time.monotonic() < deadline:
            time.sleep(0.25)
        state = engine.store.require(name)
        refusal: MigronautError
        if self._rewritten(state):
            refusal = self._irreversible(name)
        elif engine.store.live_leases(name):
            refusal = BackgroundConflictError(
                f"Cannot withdraw background migration {name}: lanes are still working on it "
                "(pause it first)",
                {"migration": name},
            )
        elif engine.store.withdraw(name, registration=str(state.get("registration")),
                                   generation=int(state.get("generation") or 0),
                                   session=session):
            return self._withdrawn(name)
        else:
            refusal = BackgroundConflictError(
                f"Cannot withdraw background migration {name}: its state changed meanwhile",
                {"migration": name},
            )
        if paused:
            engine.control(name, "resume", reason="down: withdrawal refused")
        raise refusal

    def _rewritten(self, state: dict[str, Any]) -> bool:
        """Documents migrated (declarative) or any checkpointed step (step mode)."""
        totals = self.engine.view(state).get("totals", {})
        return bool(totals.get("batches", 0) > 0 if state.get("mode") == "step"
                    else totals.get("migrated", 0) > 0)

    @staticmethod
    def _irreversible(name: str) -> IrreversibleMigrationError:
        return IrreversibleMigrationError(
            f"Cannot roll back {name}: it declares no revert and has already rewritten "
            "documents",
            {"names": [name]},
        )

    def _withdrawn(self, name: str) -> str:
        self.engine.emit("background:registered",
                         {"migration": name, "status": "withdrawn", "direction": "forward"})
        return "withdrawn"


#: How long a withdrawal waits for live leases to drain (reference background §1.9).
_DRAIN_S = 120.0
