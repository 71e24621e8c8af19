"""Converge after ``up`` (collections.md §2.11): the declared collections are converged inside
the same locked run, after the migrations, with ``trigger: 'up'``.

Invariants: only a bulk ``up`` (no file, no ``to``) converges; the definitions are resolved
before the lock, so a broken definition file fails ``up`` before any migration runs; a plain
``up`` never reads ``collections_dir``; the converge runs even when nothing was pending (a
converge that failed last deploy is retried), never with ``prune`` or ``rebuild_unique``
overrides and never with a prompt; definitions stay cached only while the run is refused for a
held lock (a ``run_migrations`` lock-wait retry does not reload them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from migronaut.commands.converge_options import ConvergeOptions
    from migronaut.core.config import Config
    from migronaut.core.run import Run
    from migronaut.core.workspace import Workspace
    from migronaut.declared.definition import CollectionDefinition

__all__ = ["AfterUp", "after_up", "converges_after_up", "forget_definitions", "note_preview"]


def _declares(config: Config) -> bool:
    return bool(config.collections) or bool(config.collections_dir)


def converges_after_up(config: Config) -> bool:
    """``converge_after_up`` is on and something is declared — config only: no connection, no
    definition file read."""
    return bool(config.converge_after_up) and _declares(config)


@dataclass(frozen=True)
class AfterUp:
    """The converge a bulk ``up`` owes once its migrations ran."""

    ws: Workspace
    definitions: Sequence[CollectionDefinition]
    options: ConvergeOptions

    def run(self, run: Run) -> None:
        if run.waiting:  # stopped before a migration waiting for a background one: not done
            self.ws.project.logger.info(
                "Converge after up skipped: the run stopped before a pending migration")
            return
        from migronaut.commands.converge import converge_in_run  # pymongo-heavy: lazily

        self.ws.last_converge = converge_in_run(self.ws, run, self.definitions, self.options)


def after_up(ws: Workspace, *, file: str | None, to: str | None, converge: bool | None,
             requested_by: str | None, reason: str | None) -> AfterUp | None:
    """The converge this ``up`` ends with, its definitions already loaded — or ``None``."""
    config = ws.project.config
    wanted = config.converge_after_up if converge is None else converge
    if not wanted or file is not None:
        return None  # a single-file up never converges (converge=True with a file is refused)
    # (imported only when an up converges: most never do)
    from migronaut.commands.converge_options import ConvergeOptions
    from migronaut.declared.sources import load_definitions

    logger = ws.project.logger
    if to is not None:
        logger.info("Converge after up skipped: up --to applies only part of the migrations "
                    "— run migronaut converge once they are all applied")
        return None
    if ws.converge_definitions is None:
        ws.converge_definitions = load_definitions(config)
    definitions = ws.converge_definitions
    if not definitions:
        if converge:
            logger.info("No collections declared — set collections or collections_dir to "
                        "declare some")
        return None
    return AfterUp(ws, definitions, ConvergeOptions(trigger="up", requested_by=requested_by,
                                                    reason=reason))


def forget_definitions(ws: Workspace) -> None:
    """Drop the cached definitions once a run got past the lock (or failed otherwise)."""
    ws.converge_definitions = None


def note_preview(ws: Workspace, *, file: str | None, to: str | None) -> None:
    """``dry_run('up')`` does not preview the converge; say where to look when one would
    follow the bulk preview."""
    if file is None and to is None and converges_after_up(ws.project.config):
        ws.project.logger.info("◎ Dry-run  the declared collections converge after these "
                               "migrations — run migronaut converge --dry-run once they are "
                               "applied to preview it")
