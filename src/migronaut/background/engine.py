"""The background engine of one database: the engine core and the operator features, composed.

:class:`BackgroundEngine` is what :attr:`migronaut.Migrator.background` returns. It is the
:class:`~migronaut.background.engine_core.EngineCore` (coordinator steps, plan commits, passes,
controls, state reads, driving) plus the operator features that work through it: drift
verification (:mod:`~migronaut.background.tools.drift`), dry runs
(:mod:`~migronaut.background.tools.dryrun`) and the live watcher
(:mod:`~migronaut.background.tools.watch`). The layering runs one way — those features import the
core, never this façade, and the core imports none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from migronaut.background.coordination.controls import ControlResult
from migronaut.background.coordination.coordinator import Answer
from migronaut.background.engine_core import EngineCore

if TYPE_CHECKING:
    from migronaut.background.tools.watch import Watcher

__all__ = ["Answer", "BackgroundEngine", "ControlResult"]


class BackgroundEngine(EngineCore):
    """Coordinator, controls and views over one database's background migrations, with drift
    verification, dry runs and the live watcher."""

    # -- dry runs -------------------------------------------------------------------------
    def dry_run(
        self,
        name: str,
        *,
        sample: int | None = None,
        first: int | None = None,
        validate: bool = False,
        direction: str = "forward",
        steps: int | None = None,
        max_documents: int = 20,
        from_start: bool = False,
        deadline_ms: int = 50_000,
    ) -> dict[str, Any]:
        """Preview ``name`` (registered or not) without writing anything (reference §6.7).

        See :func:`migronaut.background.tools.dryrun.dry_run` for the report and the errors, and
        :func:`migronaut.background.tools.dryrun.exit_code` for the CLI exit code of a report.
        """
        from migronaut.background.tools.dryrun import dry_run

        return dry_run(self, name, sample=sample, first=first, validate=validate,
                       direction=direction, steps=steps, max_documents=max_documents,
                       from_start=from_start, deadline_ms=deadline_ms)

    def verify(
        self,
        *,
        on_drift: str | None = None,
        collections: Sequence[str] | None = None,
        drift_mode: str | None = None,
    ) -> dict[str, Any]:
        """Poll for old-shape documents after completion (reference §3.7): ``{checked, skipped,
        drift: [{migration, collection, action}]}``. ``on_drift`` defaults to ``'reopen'`` and
        ``drift_mode`` (the config's ``background_drift``) to ``'poll'`` — pass the config's.
        See :func:`migronaut.background.tools.drift.verify`."""
        from migronaut.background.tools.drift import verify

        return verify(self, on_drift=on_drift, collections=collections, drift_mode=drift_mode)

    def watch(self, **options: Any) -> Watcher:
        """Start the live drift watcher (reference §6.8) and return its handle; a standalone
        server is refused with ``CONFIG_INVALID`` first. See
        :class:`migronaut.background.tools.watch.Watcher` for the options."""
        from migronaut.background.tools.watch import Watcher

        return Watcher(self, **options).start()

    def watch_status(self, collection: str | None = None) -> list[dict[str, Any]]:
        """The stored watch rows (never the resume token)."""
        from migronaut.background.tools.watch import watch_status

        return watch_status(self, collection)
