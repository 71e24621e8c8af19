"""``status`` (and ``list``): where each migration on disk or in the changelog stands.

Invariant: only reads — no lock, no write, no event, no index; a changelog with duplicate records
is shown (with a warning) rather than refused, and ``pending`` never hashes a file. A record a
run left ``running``/``reverting`` shows as ``running`` while that run holds the lock, else
``in-doubt`` — never as applied, never as merely pending.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from migronaut.core.changelog import UNFINISHED, Unfinished, in_doubt_error
from migronaut.core.lock import read_lock_status
from migronaut.core.plan import build_status_rows
from migronaut.errors import ConfigInvalidError, MigrationInDoubtError

if TYPE_CHECKING:
    from migronaut.core.results import StatusRow
    from migronaut.core.workspace import Workspace

__all__ = ["StatusFilter", "in_doubt", "status"]

StatusFilter = Literal["all", "pending", "applied"]


def status(ws: Workspace, filter: StatusFilter, *, checksums: bool) -> list[StatusRow]:
    """Every migration on disk or in the changelog, name-sorted."""
    if filter not in ("all", "pending", "applied"):
        raise ConfigInvalidError(
            f"filter must be 'all', 'pending' or 'applied' (got {filter!r})",
            {"option": "filter"},
        )
    project = ws.project
    with ws.slot.busy():
        files = project.files()
        changelog = ws.connection.changelog
        checked = changelog.check()
        checked.require_readable(changelog.collection.name)
        if checked.duplicates:
            project.logger.warning(
                "⚠ %s; up, down, redo, baseline and import refuse to run until one record "
                "per migration is left", checked.duplicates_text(changelog.collection.name),
                extra={"event": "changelog:duplicates"})
        # every record understood and one per name: an ``up`` right after may skip its own
        # check before the lock (its read under the lock checks them all again)
        ws.changelog_checked = not checked.duplicates
        use_checksums = checksums and filter != "pending"
        live_owner = None
        if any(record.get("status") in UNFINISHED for record in checked.records):
            lock = read_lock_status(ws.connection.lock_collection,
                                    ttl_ms=project.config.lock_ttl_seconds * 1000)
            live_owner = lock.holder.run_id if lock.state == "held" and lock.holder else None
        return build_status_rows(
            checked.records, files, checksum=project.checksum if use_checksums else None,
            filter=filter, duplicates=checked.duplicates, live_owner=live_owner,
        )


def in_doubt(rows: list[StatusRow]) -> MigrationInDoubtError | None:
    """``MIGRATION_IN_DOUBT`` naming the ``in-doubt`` rows (``status --check``), else ``None``."""
    found = [Unfinished(name=row.file, status="running" if row.direction == "up" else "reverting",
                        run_id=str(row.run_id), host=row.host, pid=row.pid,
                        started_at=row.started_at, alive=False)
             for row in rows if row.status == "in-doubt"]
    return in_doubt_error(found) if found else None
