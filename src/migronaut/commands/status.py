"""``status`` (and ``list``): where each migration on disk or in the changelog stands.

Invariant: only reads — no lock, no write, no event, no index; a changelog with duplicate records
is shown (with a warning) rather than refused, and ``pending`` never hashes a file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from migronaut.core.plan import build_status_rows
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.core.results import StatusRow
    from migronaut.core.workspace import Workspace

__all__ = ["StatusFilter", "status"]

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
        use_checksums = checksums and filter != "pending"
        return build_status_rows(
            checked.records, files, checksum=project.checksum if use_checksums else None,
            filter=filter, duplicates=checked.duplicates,
        )
