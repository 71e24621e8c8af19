"""What every part of one database's background engine works through: handles and settings.

The coordinator, the controls, the state reads, the driver and the operator features above them
(drift, dry run, watch) all read the same database, store, lock collection, logger, events and
telemetry; this is the one place they are kept, with the two helpers every part needs (loading a
migration's job, warning once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migronaut.background.planning.job import BackgroundJob, load_job
from migronaut.observability.telemetry import DISABLED, Telemetry

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.background.state.store import BackgroundStore

__all__ = ["Emit", "EngineHandles"]

Emit = Callable[[str, dict[str, Any]], None]


class EngineHandles:
    """The database, store, lock collection, logger, events and settings of one engine."""

    def __init__(
        self,
        *,
        db: Database[dict[str, Any]],
        store: BackgroundStore,
        directory: Path,
        lock_collection: Collection[dict[str, Any]],
        lock_ttl_ms: int,
        logger: logging.Logger,
        emit: Emit,
        reserved_collections: tuple[str, ...] = (),
        reload_migrations: bool = False,
        executed_by: str = "unknown",
        telemetry: Telemetry = DISABLED,
        shard_aware: str = "auto",
        declared_floors: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.db = db
        self.store = store
        self.directory = directory
        self.lock_collection = lock_collection
        self.ttl_ms = lock_ttl_ms
        self.logger = logger
        self.telemetry = telemetry
        self.emit = telemetry.observe_background(emit)
        self.reserved = reserved_collections
        self.reload = reload_migrations
        self.executed_by = executed_by
        #: the config's ``background_shard_aware``: ``auto`` plans sharded collections by shard
        self.shard_aware = shard_aware
        self._declared_floors = declared_floors
        self._warned: set[str] = set()

    def job(self, state: Mapping[str, Any], *, strict: bool = True) -> BackgroundJob:
        """The migration of a stored state, loaded from its (pinned) file."""
        return load_job(
            self.directory,
            state["_id"],
            state=state,
            reserved_collections=self.reserved,
            reload=self.reload,
            strict_checksum=strict,
        )

    def declared_floors(self) -> Mapping[str, int]:
        """Each declared collection's ``versioning.min`` (read when asked: the declarations
        may change between two drift polls); empty when nothing is declared."""
        return self._declared_floors() if self._declared_floors is not None else {}

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """Log a warning the first time ``key`` is seen by this engine (a wait is retried)."""
        if key not in self._warned:
            self._warned.add(key)
            self.logger.warning(message, *args)
