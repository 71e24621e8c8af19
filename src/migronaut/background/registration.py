"""Background migrations through the migration line: what ``up`` and ``down`` do to them.

``up`` of a background file validates its spec (before any write), then registers it — a state
document ``blocked`` or ``pending`` — and the changelog records it with ``kind: 'background'``;
no user document is touched. ``down`` re-registers it in the revert direction when it declares a
way back, withdraws it when nothing was rewritten yet, and refuses otherwise (reference §1.9).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from migronaut.background.job import is_background_file
from migronaut.background.spec import resolve_background, validate_requires
from migronaut.errors import BackgroundConflictError, IrreversibleMigrationError

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession

    from migronaut.background.engine import BackgroundEngine
    from migronaut.core.files import MigrationModule

__all__ = ["Registrar"]


class Registrar:
    def __init__(self, engine: BackgroundEngine, *, files: Sequence[str]) -> None:
        self.engine = engine
        self.files = list(files)

    def validate(self, migration: MigrationModule) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The resolved spec and checked ``requires`` — raises before anything is written."""
        resolved = resolve_background(
            migration.name, migration.background, reserved_collections=self.engine.reserved
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
        totals = self.engine.view(state).get("totals", {})
        rewritten = (totals.get("batches", 0) > 0 if state.get("mode") == "step"
                     else totals.get("migrated", 0) > 0)
        if rewritten:
            raise IrreversibleMigrationError(
                f"Cannot roll back {name}: it declares no revert and has already rewritten "
                "documents",
                {"names": [name]},
            )
        if self.engine.store.live_leases(name, self.engine.ttl_ms):
            raise BackgroundConflictError(
                f"Cannot withdraw background migration {name}: lanes are still working on it "
                "(pause it first)",
                {"migration": name},
            )
        self.engine.store.withdraw(name, registration=str(state.get("registration")))
        self.engine.emit("background:registered",
                         {"migration": name, "status": "withdrawn", "direction": "forward"})
        return "withdrawn"
