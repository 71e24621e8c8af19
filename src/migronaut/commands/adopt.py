"""``import`` and ``baseline``: adopting migrations that ran without migronaut.

How a record finds its file and what is written: :mod:`migronaut.core.adopt`. Here: each is a
locked run (its counts go to ``run:end``), or, as a dry run, a preview outside any run.

Invariant: a dry run only reads — no lock, no events, no writes, not even an index — and refuses
what the real run would refuse; it leaves the connection as it found it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from migronaut.core.changelog import Changelog
from migronaut.core.locked_run import check_between, locked_run
from migronaut.core.plan import validate_actor
from migronaut.core.project import executed_by
from migronaut.core.results import BaselineResult, ImportResult

if TYPE_CHECKING:
    from migronaut.core.adopt import Adoption
    from migronaut.core.run import Run
    from migronaut.core.workspace import Workspace

__all__ = ["baseline", "import_changelog"]

AdoptionResult = TypeVar("AdoptionResult", ImportResult, BaselineResult)


def import_changelog(
    ws: Workspace, tool: str, *, source: str | None, target: str | None, dry_run: bool,
    trust_hash: bool, force: bool, no_lock: bool, requested_by: str | None, reason: str | None,
) -> ImportResult:
    """Adopt another tool's record of applied migrations (forward-only records)."""
    from migronaut.core.adopt import (
        IMPORT_TOOLS,
        ImportRequest,
        import_changelog,
        validate_import_options,
    )

    validate_import_options(tool, source, target)
    validate_actor(requested_by, reason)
    project = ws.project
    config = project.config
    request = ImportRequest(
        tool, source or IMPORT_TOOLS[tool].default_collection,
        target or config.migrations_collection, dry_run=dry_run, trust_hash=trust_hash,
        force=force,
    )
    validate_import_options(tool, request.source, request.target)  # defaults filled in
    return _adopt(
        ws, "import", dry_run,
        lambda adoption: import_changelog(
            request, source=ws.connection.state_db[request.source],
            target=Changelog(ws.connection.state_db[request.target]), files=project.files(),
            checksum=project.checksum, adoption=adoption, logger=project.logger,
            ensure_indexes=config.ensure_indexes
            and request.target != config.migrations_collection,
        ),
        no_lock=no_lock, requested_by=requested_by, reason=reason,
    )


def baseline(
    ws: Workspace, to: str | None, *, dry_run: bool, no_lock: bool, requested_by: str | None,
    reason: str | None,
) -> BaselineResult:
    """Mark the pending files (up to ``to``) applied without running them, in one batch."""
    from migronaut.core.adopt import baseline, validate_baseline_options

    validate_baseline_options(to)
    validate_actor(requested_by, reason)
    project = ws.project
    return _adopt(
        ws, "baseline", dry_run,
        lambda adoption: baseline(
            changelog=ws.connection.changelog, files=project.files(),
            checksum=project.checksum, to=to, dry_run=dry_run,
            environment=project.config.resolved_environment, executed_by=executed_by(),
            adoption=adoption, logger=project.logger,
        ),
        no_lock=no_lock, requested_by=requested_by, reason=reason,
    )


def _adopt(
    ws: Workspace,
    command: str,
    dry_run: bool,
    work: Callable[[Adoption], AdoptionResult],
    *,
    no_lock: bool,
    requested_by: str | None,
    reason: str | None,
) -> AdoptionResult:
    """Run an import or baseline: a preview outside any run, or a locked run."""
    from migronaut.core.adopt import Adoption

    if dry_run:
        with ws.slot.busy(), ws.transient():
            ws.connection.connect()
            ws.connection.changelog.verify()  # what the real run would refuse, the preview does
            return work(Adoption(None))
    outcome: list[AdoptionResult] = []

    def locked(run: Run) -> None:
        adoption = Adoption(run.id, run.requested_by, run.reason,
                            check_stop=lambda: check_between(run))
        result = work(adoption)
        run.counts = result.counts()
        outcome.append(result)

    locked_run(ws, command, None, locked, no_lock=no_lock, requested_by=requested_by,
               reason=reason)
    return outcome[0]
