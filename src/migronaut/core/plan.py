"""Target selection for ``up``, ``down`` and ``redo``, shared by the real commands and ``dry-run``.

Invariant: the same inputs select the same migrations in the same order whether the run is real
or a preview (reference core §4.7). Every decision reads ``status: 'applied'`` records only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from migronaut._values import is_int
from migronaut.core.changelog import (
    UNFINISHED,
    Changelog,
    ChangelogRead,
    Unfinished,
    judge_unfinished,
)
from migronaut.core.files import check_name, is_valid_name, resolve_file
from migronaut.core.results import StatusRow
from migronaut.errors import (
    ChecksumMismatchError,
    ConfigInvalidError,
    IrreversibleMigrationError,
    MigrationBlockedError,
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
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _positive_int(value: Any, option: str) -> int | None:
    if value is None:
        return None
    if not is_int(value) or value <= 0:
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


def _ordered(ordered: Any, file: Any) -> None:
    if not isinstance(ordered, bool):
        raise ConfigInvalidError(f"ordered must be a boolean (got {ordered!r})",
                                 {"option": "ordered"})
    if ordered and file is None:
        raise ConfigInvalidError("ordered requires a migration file", {"option": "ordered"})


def validate_up_options(
    file: Any, *, to: Any = None, step: bool = False, batch: Any = None, force: bool = False,
    requested_by: Any = None, reason: Any = None, converge: Any = None, ordered: Any = False,
    checksum: Any = None,
) -> None:
    """Pure checks that run before any config load or connection."""
    _bare(file, "file")
    _bare(to, "--to")
    _positive_int(batch, "batch")
    _ordered(ordered, file)
    if checksum is not None:
        if not isinstance(checksum, str) or not _SHA256.fullmatch(checksum):
            raise ConfigInvalidError("checksum must be 64 lower-case hex characters (a SHA-256)",
                                     {"option": "checksum"})
        if file is None:
            raise ConfigInvalidError("checksum requires a migration file",
                                     {"option": "checksum"})
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
    requested_by: Any = None, reason: Any = None, ordered: Any = False,
) -> None:
    _bare(file, "file")
    _ordered(ordered, file)
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
    #: Applied files edited since (their checksum differs from the record's), name order.
    drifted: list[str] = field(default_factory=list)


def plan_up(
    changelog: Changelog | ChangelogRead,
    files: Sequence[str],
    directory: Path,
    *,
    file: str | None,
    to: str | None,
    force: bool,
    strict: bool,
    on_out_of_order: str,
    checksum: Checksum,
    ordered: bool = False,
    planned_checksum: str | None = None,
    drift: bool = False,
) -> UpPlan:
    """The targets of ``up``. A single-file run skips the bulk checks unless ``ordered``
    (reference core §11.7): then the file must be of the sequence, every earlier file applied
    (else ``MIGRATION_BLOCKED``), and the strict and out-of-order checks apply as in a bulk run.
    ``planned_checksum`` pins the file's content to what the producer planned; ``drift`` lists
    the applied files edited since (a bulk run warns of them) from the same read."""
    if file is not None:
        resolve_file(directory, file)
        record = changelog.get(file)
        applied = bool(record and record.get("status") == "applied")
        plan = UpPlan([file], {file: record} if record and applied else {})
        if ordered:
            if file not in files:
                raise MigrationFileNotFoundError(
                    f"Not a migration of the sequence: {file}", {"filename": file})
            if not applied or force:
                plan = _ordered_single(changelog, files, file, plan, force=force, strict=strict,
                                       on_out_of_order=on_out_of_order, checksum=checksum)
        if planned_checksum is not None:
            actual = checksum(file)
            if actual != planned_checksum:
                raise ChecksumMismatchError(
                    f"Checksum mismatch for {file}: the file is not the one planned",
                    {"name": file, "expected": planned_checksum, "actual": actual,
                     "planned": True})
        return plan

    drifted: list[str] = []
    applied_names = _applied_names(changelog, files, strict=strict and not force,
                                   checksum=checksum, drifted=drifted if drift else None)
    pending = [name for name in files if name not in applied_names]
    if to is not None:
        if to not in files:
            raise MigrationFileNotFoundError(f"Migration file not found: {to}", {"to": to})
        if to in applied_names:
            pending = []
        else:
            pending = [name for name in pending if name <= to]
    newest, late = _late(applied_names, pending, on_out_of_order)
    return UpPlan(pending, late=late, newest_applied=newest, drifted=drifted)


def _applied_names(changelog: Changelog | ChangelogRead, files: Sequence[str], *, strict: bool,
                   checksum: Checksum, drifted: list[str] | None = None) -> set[str]:
    """The applied names; under ``strict``, first every applied file's checksum against disk
    (the first drift is ``CHECKSUM_MISMATCH``); else, given ``drifted``, the drifted names are
    appended to it (one read either way: ``status`` compares the same way)."""
    if not strict and drifted is None:
        return set(changelog.applied_names())
    applied = changelog.applied()
    on_disk = set(files)  # a set: one lookup per applied record, not a scan of the files
    for record in applied:
        name = record["name"]
        if not is_valid_name(name) or name not in on_disk:
            continue
        actual = checksum(name)
        expected = record.get("checksum")
        if actual is not None and expected and actual != expected:
            if not strict and drifted is not None:
                drifted.append(name)
                continue
            raise checksum_mismatch(name, expected, actual)
    return {r["name"] for r in applied}


def checksum_mismatch(name: str, expected: Any, actual: str | None) -> ChecksumMismatchError:
    """``CHECKSUM_MISMATCH`` for an applied file edited since, saying what to do next."""
    return ChecksumMismatchError(
        f"Checksum mismatch for {name}: the file changed after it was applied. "
        + drift_advice(name),
        {"name": name, "expected": expected, "actual": actual},
    )


def drift_advice(name: str) -> str:
    """What to do about an applied migration whose file changed (the warning of ``up`` and the
    error under ``strict`` say the same)."""
    return ("Restore the file as it was applied (e.g. `git checkout`) and put the change in a new "
            f"migration (`migronaut create NAME`); or run it again as edited with `migronaut up "
            f"{name} --force`")


def _late(applied_names: Collection[str], pending: Sequence[str],
          on_out_of_order: str) -> tuple[str | None, list[str]]:
    """The newest applied name and the pending names sorting before it (``error``: refused)."""
    newest = max(applied_names) if applied_names else None
    late = [name for name in pending if newest is not None and name < newest]
    if late and on_out_of_order == "error":
        raise OutOfOrderMigrationError(
            f"{len(late)} pending migration(s) sort before the newest applied one ({newest}): "
            + ", ".join(late),
            {"names": late, "newestApplied": newest},
        )
    return newest, late if on_out_of_order == "warn" else []


def _ordered_single(
    changelog: Changelog | ChangelogRead, files: Sequence[str], file: str, plan: UpPlan, *,
    force: bool, strict: bool, on_out_of_order: str, checksum: Checksum,
) -> UpPlan:
    """An ordered single-file ``up``: the bulk run's guarantees for one file of the sequence."""
    applied_names = _applied_names(changelog, files, strict=strict and not force,
                                   checksum=checksum)
    earlier = [name for name in files if name < file and name not in applied_names]
    if earlier:
        failed = [r["name"] for r in changelog.records_named(earlier)
                  if r.get("status") == "failed"]
        raise MigrationBlockedError(
            f"{file} is blocked: {len(earlier)} earlier migration(s) still pending: "
            + ", ".join(earlier[:10]) + (", …" if len(earlier) > 10 else ""),
            {"name": file, "direction": "up", "blockedBy": earlier, "failed": failed})
    newest, late = _late(applied_names - {file}, [] if file in applied_names else [file],
                         on_out_of_order)
    return replace(plan, late=late, newest_applied=newest)


def plan_down(
    changelog: Changelog,
    *,
    file: str | None,
    steps: int | None,
    batch: int | None,
    to: str | None,
    ordered: bool = False,
) -> list[dict[str, Any]]:
    """The applied records to revert, in execution order. An ``ordered`` single-file revert
    refuses (``MIGRATION_BLOCKED``) while a migration applied after it is still applied."""
    if file is not None:
        record = changelog.get(file)
        if not record or record.get("status") != "applied":
            raise NotAppliedError(f"Migration is not applied: {file}", {"filename": file})
        if ordered:
            _check_newest(changelog, record)
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


def _check_newest(changelog: Changelog, record: dict[str, Any]) -> None:
    later = [r["name"] for r in changelog.applied_later_than(record)]
    if later:
        raise MigrationBlockedError(
            f"{record['name']} is blocked: {len(later)} migration(s) applied after it are still "
            "applied: " + ", ".join(later[:10]) + (", …" if len(later) > 10 else ""),
            {"name": record["name"], "direction": "down", "blockedBy": later, "failed": []})


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
    live_owner: str | None = None,
) -> list[StatusRow]:
    """Files ∪ records, name-sorted; ``reverted`` shows as pending, ``failed`` as failed.

    A name in ``duplicates`` has several records: its row shows the applied one when there is
    one, and says ``duplicate``. A ``running``/``reverting`` record shows as ``running`` while
    its run holds the lock (``live_owner``, the owner of a lock held within its TTL), else as
    ``in-doubt``: neither applied nor pending, and never listed as applied.
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
        unfinished = judge_unfinished([record], live_owner=live_owner) \
            if status in UNFINISHED else []
        if unfinished:
            row_status = "running" if unfinished[0].alive else "in-doubt"
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
                run_id=unfinished[0].run_id if unfinished else record.get("runId"),
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
                **_intent_fields(unfinished[0] if unfinished else None),
            )
        )
    return rows


def _intent_fields(unfinished: Unfinished | None) -> dict[str, Any]:
    if unfinished is None:
        return {}
    return {"direction": unfinished.direction,
            "host": unfinished.host, "pid": unfinished.pid, "started_at": unfinished.started_at}
