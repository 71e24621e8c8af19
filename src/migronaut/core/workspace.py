"""The runtime objects one migrator's commands are given, and the ports they are wired through.

A :class:`Workspace` bundles the project (configuration, files), the connection and its state
handles, the run slot and its events, the progress reporter, and the background port. The port
(:class:`BackgroundPort`) is how the run loop reaches background migrations without importing
them: the layer above (:mod:`migronaut.commands.background`) plugs the background engine in.

Invariant: everything bound to the client (the connection's handles, the background engine) is
dropped together by :meth:`Workspace.close`, so a later command connects afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from migronaut.core.connection import Connection
from migronaut.core.run import RunEvents, RunSlot

if TYPE_CHECKING:
    from migronaut.core.context import MigrationContext
    from migronaut.core.files import MigrationModule
    from migronaut.core.project import Project
    from migronaut.core.run import Direction, Run

__all__ = ["BackgroundPort", "ProgressReporter", "Workspace"]


class ProgressReporter(Protocol):
    """Receives the start and end of each migration (the CLI's spinner)."""

    def on_start(self, name: str, direction: str) -> None: ...

    def on_stop(self, outcome: str) -> None: ...


class BackgroundPort(Protocol):
    """What a run needs from background migrations (their files go through ``up``/``down``)."""

    def validate(self, migrations: Sequence[MigrationModule]) -> None:
        """Refuse a broken background spec before the first migration of an ``up`` runs."""

    def body(
        self, migration: MigrationModule, direction: Direction, checksum: str
    ) -> Callable[[MigrationContext], None]:
        """The body of a background file under up/down: (re-)register it, touch no document."""

    def require_done(self, run: Run, name: str, requires: Sequence[str]) -> None:
        """Refuse (or, ``on_background_pending="stop"``, end the run before) a migration whose
        background requirements are not done."""

    def drive_inline(self, run: Run, name: str) -> None:
        """``background_inline``: run a just-registered migration to completion under the lock."""

    def forget(self) -> None:
        """Drop what is bound to the client (the connection is closing)."""


class Workspace:
    """The project, connection, run slot, events, progress and background port of a migrator."""

    def __init__(
        self,
        project: Project,
        *,
        background: Callable[[Workspace], BackgroundPort],
        progress: ProgressReporter | None = None,
        connection: Callable[[Project], Connection] = Connection,
    ) -> None:
        self.project = project
        self.connection = connection(project)
        self.slot = RunSlot()
        self.events = RunEvents(self.slot)
        self.progress = progress
        #: what the last ``up`` with ``on_background_pending="stop"`` stopped at
        self.waiting: list[dict[str, Any]] = []
        #: the converge result of the last ``up`` that converged after its migrations (a
        #: ``ConvergeResult``, :mod:`migronaut.commands.up_converge`), else ``None``
        self.last_converge: Any = None
        #: definitions resolved for an after-up converge, kept while the run is refused for a
        #: held lock (``CollectionDefinition``\ s)
        self.converge_definitions: tuple[Any, ...] | None = None
        #: a ``status`` read checked every changelog record since the last run started; the
        #: next run that reads the changelog under its lock skips its check before the lock
        self.changelog_checked = False
        self.background = background(self)

    def close(self) -> None:
        """Disconnect; an injected client is never closed."""
        self.background.forget()  # bound to the client: a later connect builds a fresh one
        self.connection.close()

    @contextmanager
    def transient(self) -> Iterator[None]:
        """A read-only command (``audit``, an import or baseline dry run) leaves the migrator as
        it found it: a connection it opened is closed again. Connecting writes nothing (no
        index: the changelog's come with the first run that may write it)."""
        opened = not self.connection.connected
        try:
            yield
        finally:
            if opened:
                self.close()
