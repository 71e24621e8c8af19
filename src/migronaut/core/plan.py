"""Target selection for ``up``, ``down`` and ``redo``, shared by the real commands and ``dry-run``.

Invariant: the same inputs select the same migrations in the same order whether the run is real
or a preview (reference core §4.7). Every decision reads ``status: 'applied'`` records only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from migronaut.core.changelog import Changelog
from migronaut.core.files import check_name, is_valid_name, resolve_file
from migronaut.core.results import StatusRow
from migronaut.errors import (
    ChecksumMismatchError,
    ConfigInvalidError,
    IrreversibleMigrationError,
    MigrationFileNotFoundError,
    MigrationInvalidNameError,
    NotAppliedError,
    OutOfOrderMigrationError,
    StateInvalidError,
)

__all__ = [
    "FORWARD_ONLY_ORIGINS",
    "MAX_SELECTOR",
    "UpPlan",
    "build_status_rows",
    "check_forward_only",
    "plan_down",
    "plan_up",
    "validate_actor",
    "validate_down_options",
    "validate_up_options",
]

#: Origins of records migronaut never ran the ``up`` of. ``"migronaut"`` (or none) is a native
#: record in the original's storage; one imported from the Node original is ``"migronaut-node"``.
FORWARD_ONLY_ORIGINS = frozenset({"migrate-mongo", "mongodb-migrations", "migronaut-node",
                                  "baseline"})
Checksum = Callable[[str], str | None]


#: The largest batch number or step count a selector takes: a 32-bit integer, so a number no
#: BSON integer can hold never reaches the server as a raw encoding error.
MAX_SELECTOR = 2**31 - 1


def _positive_int(value: Any, option: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigInvalidError(
            f"{option} must be a positive integer (got {value!r})", {"option": option}
        )
    if value > MAX_SELECTOR:
        raise ConfigInvalidError(
            f"{option} must be a positive integer of at most {MAX_SELECTOR} (got {value!r})",
            {"option": option},
        )
    return value


def _bare(value: Any, option: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise MigrationInvalidNameError(
            f"{option} must be a migration file name (got {type(value).__name__})",
            {"name": repr(value)[:200]},
        )
    return check_name(value, field=option.lstrip("-"))


def validate_actor(requested_by: Any, reason: Any) -> None:
    """``requested_by`` (≤ 128 characters) and ``reason`` (≤ 512): non-empty strings or ``None``."""
    for value, option, limit in ((requested_by, "requested_by", 128), (reason, "reason", 512)):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip() or len(value) > limit:
            raise ConfigInvalidError(
                f"{option} must be a non-empty string of at most {limit} characters",
                {"option": option},
            )


def validate_up_options(
    file: Any, *, to: Any = None, step: bool = False, batch: Any = None, force: bool = False,
    requested_by: Any = None, reason: Any = None, converge: Any = None,
) -> None:
    """Pure checks that run before any config load or connection."""
    _bare(file, "file")
    _bare(to, "--to")
    _positive_int(batch, "batch")
    if converge is not None:
        if not isinstance(converge, bool):
            raise ConfigInvalidError("converge must be a boolean", {"option": "converge"})
        if converge and (file is not None or to is not None):
            raise ConfigInvalidError(
                "converge applies to a bulk up only: not with a migration file or --to",
                {"option": "converge"})
    if file is not None and to is not None:
        raise ConfigInvalidError("--to cannot be combined with a migration file", {"option": "to"})
    if force and file is None:
        raise ConfigInvalidError("--force requires a specific migration file", {"option": "force"})
    if batch is not None and step:
        raise ConfigInvalidError("batch cannot be combined with --step", {"option": "batch"})
    validate_actor(requested_by, reason)


def validate_down_options(
    file: Any, *, steps: Any = None, batch: Any = None, to: Any = None,
    requested_by: Any = None, reason: Any = None,
) -> None:
    _bare(file, "file")
    _bare(to, "--to")
    _positive_int(steps, "--steps")
    _positive_int(batch, "--batch")
    chosen = [n for n, v in (("file", file), ("--steps", steps), ("--batch", batch), ("--to", to))
              if v is not None]
    if len(chosen) > 1:
        raise ConfigInvalidError(
            f"{' and '.join(chosen)} cannot be combined: choose one selector",
            {"options": chosen},
        )
    validate_actor(requested_by, reason)


@dataclass
class UpPlan:
    """What ``up`` will do: the targets in order, and named files it will skip."""

    targets: list[str]
    already_applied: dict[str, dict[str, Any]] = field(default_factory=dict)
    late: list[str] = field(default_factory=list)
    newest_applied: str | None = None


def plan_up(
    changelog: Changelog,
    files: Sequence[str],
    directory: Path,
    *,
    file: str | None,
    to: str | None,
    force: bool,
    strict: bool,
    on_out_of_order: str,
    checksum: Checksum,
) -> UpPlan:
    if file is not None:
        resolve_file(directory, file)
        record = changelog.get(file)
        if record and record.get("status") == "applied":
            return UpPlan([file], {file: record})
        return UpPlan([file])

    if strict and not force:
        applied = changelog.applied()
        applied_names = {r["name"] for r in applied}
        on_disk = set(files)  # a set: one lookup per applied record, not a scan of the files
        for record in applied:
            name = record["name"]
            if not is_valid_name(name) or name not in on_disk:
                continue
            actual = checksum(name)
            expected = record.get("checksum")
            if actual is not None and expected and actual != expected:
                raise ChecksumMismatchError(
                    f"Checksum mismatch for {name}",
                    {"name": name, "expected": expected, "actual": actual},
                )
    else:
        applied_names = set(changelog.applied_names())

    pending = [name for name in files if name not in applied_names]
    if to is not None:
        if to not in files:
            raise MigrationFileNotFoundError(f"Migration file not found: {to}", {"to": to})
        if to in applied_names:
            pending = []
        else:
            pending = [name for name in pending if name <= to]
    newest = max(applied_names) if applied_names else None
    late = [name for name in pending if newest is not None and name < newest]
    if late and on_out_of_order == "error":
        raise OutOfOrderMigrationError(
            f"{len(late)} pending migration(s) sort before the newest applied one ({newest}): "
            + ", ".join(late),
            {"names": late, "newestApplied": newest},
        )
    return UpPlan(pending, late=late if on_out_of_order == "warn" else [], newest_applied=newest)


def plan_down(
    changelog: Changelog,
    *,
    file: str | None,
    steps: int | None,
    batch: int | None,
    to: str | None,
) -> list[dict[str, Any]]:
    """The applied records to revert, in execution order."""
    if file is not None:
        record = changelog.get(file)
        if not record or record.get("status") != "applied":
            raise NotAppliedError(f"Migration is not applied: {file}", {"filename": file})
        return [record]
    if steps is not None:
        return changelog.last_applied(steps)
    if to is not None:
        record = changelog.get(to)
        if not record or record.get("status") != "applied":
            raise NotAppliedError(f"Migration is not applied: {to}", {"to": to})
        selected = changelog.applied_after(to)
    else:
        _require_batches(changelog)
        target_batch = batch if batch is not None else changelog.last_batch()
        selected = changelog.by_batch(target_batch) if target_batch is not None else []
    return sorted(selected, key=lambda r: r["name"], reverse=True)


def _require_batches(changelog: Changelog) -> None:
    """A batch revert refuses while an applied record has no batch: it could belong to the
    batch, and reverting the others without it would leave it applied without a word."""
    names = changelog.applied_without_batch()
    if not names:
        return
    collection = changelog.collection.name
    if len(names) == 1:
        what = (f"the applied record of {names[0]} ({collection}) has no batch — revert it by "
                f"name (migronaut down {names[0]}) or give it its batch")
    else:
        what = (f"the applied records of {', '.join(names)} ({collection}) have no batch — "
                "revert them by name (migronaut down <file>) or give them their batch")
    raise StateInvalidError(f"Cannot tell which batch to revert: {what}",
                            {"collection": collection, "names": names})


def check_forward_only(records: Sequence[dict[str, Any]]) -> None:
    """Refuse a revert that selects imported or baselined records, before anything is touched:
    migronaut never ran their ``up``, so it has nothing of its own to undo."""
    refused = [r for r in records if r.get("origin") in FORWARD_ONLY_ORIGINS]
    if refused:
        names = [r["name"] for r in refused]
        described = ", ".join(
            f"{r['name']} (" + ("baselined" if r["origin"] == "baseline"
                                else f"imported from {r['origin']}") + ")"
            for r in refused
        )
        raise IrreversibleMigrationError(
            f"Cannot roll back {len(names)} forward-only migration(s): {described} — they were "
            "recorded as applied without migronaut running them",
            {"names": names, "origins": {r["name"]: r["origin"] for r in refused}},
        )


def build_status_rows(
    records: Sequence[dict[str, Any]],
    files: Sequence[str],
    *,
    checksum: Checksum | None,
    filter: str = "all",
    duplicates: Collection[str] = (),
) -> list[StatusRow]:
    """Files ∪ records, name-sorted; ``reverted`` shows as pending, ``failed`` as failed.

    A name in ``duplicates`` has several records: its row shows the applied one when there is
    one, and says ``duplicate``.
    """
    by_name: dict[Any, dict[str, Any]] = {}
    for record in records:
        seen = by_name.get(record.get("name"))
        if seen is None or (record.get("status") == "applied" and seen.get("status") != "applied"):
            by_name[record.get("name")] = record
    on_disk = set(files)
    applied_names = [n for n, r in by_name.items() if r.get("status") == "applied" and
                     isinstance(n, str)]
    newest = max(applied_names) if applied_names else None
    rows: list[StatusRow] = []
    names = sorted({n for n in by_name if isinstance(n, str)} | on_disk)
    for name in names:
        record = by_name.get(name) or {}
        status = record.get("status")
        applied = status == "applied"
        row_status = "applied" if applied else "failed" if status == "failed" else "pending"
        if (filter == "pending" and applied) or (filter == "applied" and not applied):
            continue
        invalid = not is_valid_name(name)
        checksum_ok: bool | None = None
        if applied:
            if invalid:
                checksum_ok = False
            elif checksum is not None and name in on_disk:
                actual = checksum(name)
                checksum_ok = None if actual is None else actual == record.get("checksum")
        rows.append(
            StatusRow(
                file=name,
                status=row_status,  # type: ignore[arg-type]
                batch=record.get("batch") if applied else None,
                applied_at=record.get("appliedAt") if applied else None,
                duration=record.get("duration") if applied else None,
                checksum_ok=checksum_ok,
                description=record.get("description"),
                executed_by=record.get("executedBy"),
                environment=record.get("environment"),
                run_id=record.get("runId"),
                reverted_at=record.get("revertedAt"),
                origin=record.get("origin"),
                error=record.get("error") if status == "failed" else None,
                failed_at=record.get("failedAt") if status == "failed" else None,
                failed_checksum=record.get("checksum") if status == "failed" else None,
                kind=record.get("kind"),
                out_of_order=not applied and newest is not None and name < newest,
                invalid=invalid,
                requested_by=record.get("requestedBy"),
                reason=record.get("reason"),
                revert_requested_by=record.get("revertRequestedBy"),
                revert_reason=record.get("revertReason"),
                duplicate=name in duplicates,
            )
        )
    return rows
