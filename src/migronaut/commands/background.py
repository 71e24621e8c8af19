"""Background migrations inside the migration line: the engine of a migrator and its wiring.

Owns the :class:`~migronaut.background.engine.BackgroundEngine` of a migrator's database (built
on first use, dropped with the connection it is bound to) and plugs it into the run loop through
:class:`~migronaut.core.workspace.BackgroundPort`: a background file's spec is validated before
the run, registered (or reverted) as its body under ``up``/``down``, driven to completion under the
lock in inline mode; a contract migration's ``requires`` are checked before it runs.

Invariant: registration touches no user document, and what ``up`` refuses for a background file it
refuses before the first migration of the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from migronaut.core.project import executed_by
from migronaut.core.step import WaitingForBackground
from migronaut.errors import BackgroundPendingError

if TYPE_CHECKING:
    from migronaut.background.engine import BackgroundEngine
    from migronaut.background.state.registration import Registrar
    from migronaut.core.context import MigrationContext
    from migronaut.core.files import MigrationModule
    from migronaut.core.run import Direction, Run
    from migronaut.core.workspace import Workspace
    from migronaut.declared.definition import CollectionDefinition

__all__ = ["BackgroundWiring"]


class BackgroundWiring:
    """The background engine of one workspace, and the :class:`BackgroundPort` over it."""

    def __init__(self, ws: Workspace) -> None:
        self._ws = ws
        self._engine: BackgroundEngine | None = None

    @property
    def engine(self) -> BackgroundEngine:
        """The background engine of this database (state, coordinator, controls, views)."""
        if self._engine is None:
            from migronaut.background.engine import BackgroundEngine
            from migronaut.background.state.store import BackgroundStore
            from migronaut.declared.inline import reserved_names

            ws = self._ws
            project, connection = ws.project, ws.connection
            config = project.config
            store = BackgroundStore(connection.state_db, collection=config.background_collection,
                                    ensure_indexes=config.ensure_indexes)
            reserved = tuple(sorted(reserved_names(
                migrations_collection=config.migrations_collection,
                lock_collection=config.lock_collection,
                converge_log_collection=config.converge_log_collection,
                background_collection=config.background_collection,
                runs_collection=config.runs_collection)))
            emit = ws.events.emit
            self._engine = BackgroundEngine(
                db=connection.state_db, store=store, directory=project.directory,
                lock_collection=connection.lock_collection,
                lock_ttl_ms=config.lock_ttl_seconds * 1000, logger=project.logger,
                emit=lambda event, payload: emit(event, **payload),
                reserved_collections=reserved, reload_migrations=config.reload_migrations,
                executed_by=executed_by(), telemetry=project.telemetry,
                shard_aware=config.background_shard_aware,
                declared_floors=_declared_floors(ws),
            )
        return self._engine

    def forget(self) -> None:
        self._engine = None

    def _registrar(self) -> Registrar:
        from migronaut.background.state.registration import Registrar

        return Registrar(self.engine, files=self._ws.project.files(),
                         versioning_of=_declared_versioning(self._ws))

    def validate(self, migrations: Sequence[MigrationModule]) -> None:
        registrar = self._registrar()
        for migration in migrations:
            registrar.validate(migration)

    def body(
        self, migration: MigrationModule, direction: Direction, checksum: str
    ) -> Callable[[MigrationContext], None]:
        """The "body" of a background file under up/down: (re-)register it, touch no document."""
        registrar = self._registrar()
        if direction == "up":
            registrar.validate(migration)  # fail before any write
        self.engine.store.ready()  # indexes outside any transaction

        def body(ctx: MigrationContext) -> None:
            if direction == "up":
                registrar.register(migration, checksum=checksum, session=ctx.session)
            else:
                registrar.revert(migration, checksum=checksum, session=ctx.session)

        return body

    def require_done(self, run: Run, name: str, requires: Sequence[str]) -> None:
        """A contract migration refuses to run until its background requirements are done."""
        from migronaut.background.tools.drift import probe_requirement

        engine = self.engine
        for required in requires:  # reopens a completed one whose old shape reappeared
            probe_requirement(engine, required)
        waiting = engine.unmet(requires, self._ws.connection.changelog)
        if waiting:
            names = ", ".join(f"{w['migration']} ({w['status']})" for w in waiting)
            if run.stop_when_waiting:
                run.waiting.append({"migration": name, "waitsFor": waiting})
                self._ws.events.emit("background:waiting", migration=name, waitsFor=waiting)
                self._ws.project.logger.info(
                    "⧗ %s waits for %d background migration(s): %s — stopping here",
                    name, len(waiting), names)
                raise WaitingForBackground(name)
            raise BackgroundPendingError(
                f"{name} is blocked: {len(waiting)} background migration(s) not done: {names}",
                {"migration": name, "waitsFor": waiting,
                 "results": [r.to_dict() for r in run.results]},
            )

    def drive_inline(self, run: Run, name: str) -> None:
        """``background_inline``: run the registered migration to completion under the lock."""
        from migronaut.background.state.fields import max_parallel

        engine = self.engine
        state = engine.store.require(name)
        for required in state.get("requires") or []:
            if engine.requirement_status(required, self._ws.connection.changelog) != "completed":
                self.drive_inline(run, required)
        engine.drive(name, concurrency=max_parallel(state),
                     cancellation=run.cancellation, driver="inline", inline=True)


def _declared_floors(ws: Workspace) -> Callable[[], dict[str, int]]:
    """Each declared collection → its ``versioning.min``, for the drift checks: a floor at or
    above a migration's ``to`` means the validator refuses its old shape. The definitions are
    read each time (only when something is declared), as converge reads them."""

    def floors() -> dict[str, int]:
        config = ws.project.config
        if not config.collections and not config.collections_dir:
            return {}
        from migronaut.declared.sources import load_definitions

        return {definition.name: definition.versioning.min
                for definition in load_definitions(config)
                if definition.versioning is not None and definition.versioning.min > 0}

    return floors


def _declared_versioning(ws: Workspace) -> Callable[[str], dict[str, Any] | None]:
    """A background spec's target collection → its declared ``versioning`` (collections.md
    §3.7: field names default from it, ``to`` may not pass ``current``). The definitions are
    loaded lazily, once per registrar, and only when something is declared (§1.1)."""
    loaded: list[tuple[CollectionDefinition, ...]] = []

    def versioning_of(collection: str) -> dict[str, Any] | None:
        config = ws.project.config
        if not config.collections and not config.collections_dir:
            return None
        if not loaded:
            from migronaut.declared.sources import load_definitions

            loaded.append(load_definitions(config))
        for definition in loaded[0]:
            spec = definition.versioning
            if definition.name == collection and spec is not None:
                return {"field": spec.field, "current": spec.current,
                        "revision": spec.revision, "revision_field": spec.revision_field}
        return None

    return versioning_of
