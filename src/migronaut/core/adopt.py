"""Adopting an existing database: record migrations as applied without running them.

Two ways in (reference core §11.1, §11.2):

* **import** reads the record another tool kept of the migrations it applied and writes one
  changelog record per applied migration, so ``up`` runs only what is new. Tools understood:

  ``migrate-mongo``
      collection ``changelog``, one document per applied file:
      ``{fileName, appliedAt, fileHash?, migrationBlock?}``.
  ``mongodb-migrations`` (PyPI)
      its "metastore", collection ``database_migrations``: one document per applied version,
      ``{migration_datetime: "<digits>", created_at}``. The version is the leading digits of the
      file name (``20200101120000_add_users.py``); a downgrade deletes the document, so every
      document stands for an applied migration. ``created_at`` is the client's local time,
      kept as it is.
  ``migronaut`` (the Node.js original)
      the same changelog as ours, ``_migronaut_migrations``: ``{name, status, appliedAt, …}``
      with ``name`` a ``.js``/``.ts``/``.mjs``/``.cjs`` file. Only ``status: 'applied'``
      records count; records of our own ``.py`` files in that collection are not the tool's
      and are left out. By default the import writes into that same collection: each Node
      record stays as it is (a record is never deleted or rewritten by an import) and the
      ``.py`` file it stands for gets a record of its own, with ``origin: "migronaut-node"``
      (``"migronaut"`` marks a native record in that storage); a Node record with no ``.py``
      file is left alone (skipped, with a warning).

* **baseline** marks the pending migration files (up to ``to``) applied as they are on disk.

Invariants: the source collection is only read. An import or baseline is fully planned —
matched to files, ordered, batched, checksummed — before its first write, so a refusal leaves
the changelog as it was. Every record written here is forward-only (``origin`` is the tool's
name or ``baseline``), which ``down``/``redo`` refuse. An imported record keeps the tool's
``appliedAt`` and has a batch of its own, numbered after the batches of the records not being
imported, so a forced re-import rewrites the same records with the same batches. A baseline is
one batch and re-running it only adds what is still pending.

Which file an imported record stands for (:class:`FileIndex`) — the first rule that finds any:

1. the file with exactly the recorded name;
2. the file with the same stem, compared in lower case with runs of other characters than
   letters and digits read as one ``_`` (``20200101120000-add-users.js`` ↔
   ``20200101120000_add_users.py``: a migrate-mongo project rewritten in Python);
3. the file whose leading digits — the timestamp or version — equal the record's
   (``20200101120000`` ↔ ``20200101120000_add_users.py``: every mongodb-migrations record).

A rule that finds several files refuses the import (``CONFIG_INVALID``): recording the wrong one
as applied would make ``up`` skip a migration that never ran or re-run one that did. A record
that finds no file keeps the recorded name (it stays applied, shows in ``status``, and its
checksum cannot be verified). A recorded name that is not a bare, safe file name
(``../../etc/passwd``, ``$where.js``) refuses the whole import (``MIGRATION_INVALID_NAME``), as
every unsafe name does; a document with no name at all is skipped and counted.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from migronaut._redact import shown_value
from migronaut.core.config import validate_collection_name
from migronaut.core.files import check_name
from migronaut.core.plan import Checksum
from migronaut.core.results import BaselineResult, ChecksumSource, ImportResult, ImportRow
from migronaut.errors import (
    ConfigInvalidError,
    ImportTargetNotEmptyError,
    MigrationFileNotFoundError,
    StateInvalidError,
)

if TYPE_CHECKING:
    from pymongo.collection import Collection

    from migronaut.core.changelog import Changelog

__all__ = [
    "IMPORT_TOOLS",
    "Adoption",
    "FileIndex",
    "ImportRequest",
    "Source",
    "SourceEntry",
    "baseline",
    "import_changelog",
    "match_file",
    "read_source",
    "validate_baseline_options",
    "validate_import_options",
]

#: ``environment`` and ``executedBy`` of every imported record (reference core §4.1).
IMPORTED_ENVIRONMENT = "imported"
IMPORTED_BY = "migronaut-import"
BASELINE_ORIGIN = "baseline"
#: Records per changelog write; a stop request is honoured between writes.
WRITE_CHUNK = 500


# ---------------------------------------------------------------------------- source formats


def _require_dates(entries: Sequence[SourceEntry], fmt: SourceFormat, source: str) -> None:
    """Every record to import says when it was applied, as a date — else nothing is imported.

    The date is kept verbatim as ``appliedAt``: a string or a number there would be a record
    every later command refuses (``STATE_INVALID``), so the import refuses it first.
    """
    bad = [entry for entry in entries if not isinstance(entry.applied_at, dt.datetime)]
    if not bad:
        return
    problems = [{"record": entry.name, "field": fmt.date_field,
                 "message": f"{fmt.date_field} {shown_value(entry.applied_at)} is not a date"}
                for entry in bad]
    first = problems[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise StateInvalidError(
        f'Cannot import from "{source}": record {first["record"]}: {first["message"]}{more} — '
        "nothing was imported",
        {"collection": source, "problems": problems},
    )


@dataclass(frozen=True)
class SourceEntry:
    """One applied migration as another tool recorded it."""

    name: str
    applied_at: Any
    file_hash: str | None
    order: tuple[Any, ...]


def _epoch_ms(value: Any) -> float:
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return aware.timestamp() * 1000
    return 0.0


def _recorded_name(doc: Mapping[str, Any], key: str) -> str | None:
    """The recorded file name: ``None`` when there is none (skipped); an unsafe one refuses
    the import (``MIGRATION_INVALID_NAME``), never silently skipped."""
    name = doc.get(key)
    if not isinstance(name, str) or not name.strip():
        return None
    return check_name(name, field=key)


def _migrate_mongo_entry(doc: Mapping[str, Any]) -> SourceEntry | None:
    name = _recorded_name(doc, "fileName")
    if name is None:
        return None
    file_hash = doc.get("fileHash")
    block = doc.get("migrationBlock")
    applied_at = doc.get("appliedAt")
    # migrate-mongo's migrationBlock is the epoch-ms start of the `up` that applied the file.
    rank = block if isinstance(block, (int, float)) and not isinstance(block, bool) else \
        _epoch_ms(applied_at)
    return SourceEntry(name, applied_at, file_hash if isinstance(file_hash, str) and file_hash
                       else None, (rank, name))


_VERSION = re.compile(r"[0-9]+")


def _mongodb_migrations_entry(doc: Mapping[str, Any]) -> SourceEntry | None:
    version = doc.get("migration_datetime")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        return None
    return SourceEntry(version, doc.get("created_at"), None, (version,))


def _migronaut_entry(doc: Mapping[str, Any]) -> SourceEntry | None:
    name = _recorded_name(doc, "name")
    if name is None:
        return None
    applied_at = doc.get("appliedAt")
    # The Node checksum hashes the .js file: never comparable with the .py file's.
    return SourceEntry(name, applied_at, None, (_epoch_ms(applied_at), name))


#: The file extensions of this port's own migrations: such records in the Node original's
#: changelog (the same collection) are ours, not the tool's.
_OWN_EXTENSIONS = (".py",)


def _migronaut_owns(doc: Mapping[str, Any]) -> bool:
    name = doc.get("name")
    return not (isinstance(name, str) and name.endswith(_OWN_EXTENSIONS))


def _always(doc: Mapping[str, Any]) -> bool:
    return True


@dataclass(frozen=True)
class SourceFormat:
    """Where a tool keeps its record and how one of its documents reads.

    ``owns`` tells the tool's documents from others sharing the collection (left out, never
    counted); ``applied`` tells which of its documents stand for an applied migration (the
    others are left out too); ``parse`` reads one (``None``: unusable, skipped and counted).
    """

    tool: str
    default_collection: str
    key_field: str
    #: the field holding when the tool applied a migration (kept verbatim as ``appliedAt``)
    date_field: str
    projection: Mapping[str, int]
    parse: Callable[[Mapping[str, Any]], SourceEntry | None]
    owns: Callable[[Mapping[str, Any]], bool] = _always
    applied: Callable[[Mapping[str, Any]], bool] = _always
    #: The ``origin`` of the records it imports (default: the tool's name).
    origin: str = ""

    @property
    def record_origin(self) -> str:
        return self.origin or self.tool


IMPORT_TOOLS: Mapping[str, SourceFormat] = {
    "migrate-mongo": SourceFormat(
        "migrate-mongo", "changelog", "fileName", "appliedAt",
        {"fileName": 1, "fileHash": 1, "appliedAt": 1, "migrationBlock": 1},
        _migrate_mongo_entry,
    ),
    "mongodb-migrations": SourceFormat(
        "mongodb-migrations", "database_migrations", "migration_datetime", "created_at",
        {"migration_datetime": 1, "created_at": 1},
        _mongodb_migrations_entry,
    ),
    "migronaut": SourceFormat(
        "migronaut", "_migronaut_migrations", "name", "appliedAt",
        {"name": 1, "status": 1, "appliedAt": 1},
        _migronaut_entry,
        owns=_migronaut_owns,
        applied=lambda doc: doc.get("status") == "applied",
        # "migronaut" is what a native record may carry in the original's storage
        origin="migronaut-node",
    ),
}


@dataclass(frozen=True)
class ImportRequest:
    """A validated import: which tool's record, from and to which collection, and how."""

    tool: str
    source: str
    target: str
    dry_run: bool = False
    trust_hash: bool = False
    force: bool = False

    @property
    def format(self) -> SourceFormat:
        return IMPORT_TOOLS[self.tool]

    @property
    def in_place(self) -> bool:
        """Reading and writing one collection (the Node original's changelog is ours)."""
        return self.source == self.target


def validate_import_options(tool: Any, source: Any = None, target: Any = None) -> None:
    """Pure checks that run before any connection: a known tool, valid collection names."""
    if tool not in IMPORT_TOOLS:
        raise ConfigInvalidError(
            f"--tool must be one of {', '.join(repr(t) for t in IMPORT_TOOLS)} (got {tool!r})",
            {"option": "tool"},
        )
    for option, value in (("--from", source), ("--to", target)):
        problem = None if value is None else validate_collection_name(value)
        if problem:
            raise ConfigInvalidError(f"{option} {problem} (got {value!r})", {"option": option})
    if source is not None and source == target and tool != "migronaut":
        raise ConfigInvalidError(
            f"--from and --to name the same collection ({source!r})",
            {"options": ["--from", "--to"]},
        )


@dataclass
class Source:
    """What was read from the source: the usable entries in import order, how many of the
    tool's documents were skipped, and the names of all the tool's documents."""

    entries: list[SourceEntry]
    skipped: int
    names: set[str]


def read_source(
    collection: Collection[dict[str, Any]], fmt: SourceFormat, logger: logging.Logger
) -> Source:
    """Read the whole source (only reads) and parse it, before anything is written."""
    entries: list[SourceEntry] = []
    names: set[str] = set()
    skipped = 0
    for doc in collection.find({}, dict(fmt.projection)):
        if not fmt.owns(doc):
            continue
        key = doc.get(fmt.key_field)
        if isinstance(key, str):
            names.add(key)
        if not fmt.applied(doc):
            continue
        entry = fmt.parse(doc)
        if entry is None:
            skipped += 1
            logger.warning("⚠ Skipping source doc without a usable %s (_id %s)", fmt.key_field,
                           doc.get("_id"))
            continue
        entries.append(entry)
    entries.sort(key=lambda e: e.order)
    return Source(entries, skipped, names)


# ---------------------------------------------------------------------------- name mapping


def _stem_key(name: str) -> str:
    stem = name.rpartition(".")[0] or name
    return re.sub(r"[^0-9a-z]+", "_", stem.lower()).strip("_")


def _leading_digits(name: str) -> str | None:
    found = re.match(r"[0-9]+", name)
    return found.group(0) if found else None


class FileIndex:
    """The migration files on disk, indexed by each matching rule (module docstring)."""

    RULES: tuple[Callable[[str], str | None], ...] = (_stem_key, _leading_digits)

    def __init__(self, files: Sequence[str]) -> None:
        self._names = set(files)
        self._by_rule: list[dict[str, list[str]]] = []
        for key in self.RULES:
            groups: dict[str, list[str]] = {}
            for name in files:
                value = key(name)
                if value:
                    groups.setdefault(value, []).append(name)
            self._by_rule.append(groups)

    def match(self, recorded: str) -> str | None:
        """The file ``recorded`` stands for, or ``None``; several → ``CONFIG_INVALID``."""
        if recorded in self._names:
            return recorded
        for key, groups in zip(self.RULES, self._by_rule, strict=True):
            wanted = key(recorded)
            found = groups.get(wanted, []) if wanted else []
            if len(found) == 1:
                return found[0]
            if found:
                raise ConfigInvalidError(
                    f"Cannot tell which migration file {recorded!r} stands for: "
                    + ", ".join(found) + " — keep one file per migration, then import again",
                    {"recorded": recorded, "files": found},
                )
        return None


def match_file(recorded: str, files: Sequence[str]) -> str | None:
    """The migration file a recorded name stands for (module docstring), or ``None``."""
    return FileIndex(files).match(recorded)


# ---------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class Adoption:
    """What every record written by an import or a baseline carries besides its own fields:
    the run that wrote it (``None`` for a dry run) and who asked, and why."""

    run_id: str | None
    requested_by: str | None = None
    reason: str | None = None
    check_stop: Callable[[], None] = lambda: None

    def stamp(self) -> dict[str, Any]:
        return {"duration": 0, "runId": self.run_id, "requestedBy": self.requested_by,
                "reason": self.reason}

    def write(self, changelog: Changelog, records: Sequence[Mapping[str, Any]]) -> None:
        for start in range(0, len(records), WRITE_CHUNK):
            self.check_stop()
            changelog.mark_applied_bulk(records[start:start + WRITE_CHUNK])


def _resolve_checksum(
    entry: SourceEntry, file: str | None, checksum: Checksum, trust_hash: bool
) -> tuple[str, ChecksumSource]:
    """Reference core §11.1: a trusted or matching source hash is reused, else the file's."""
    if trust_hash and entry.file_hash:
        return entry.file_hash, "reused"
    actual = checksum(file) if file is not None else None
    if actual is not None:
        return actual, "reused" if entry.file_hash == actual else "recomputed"
    if entry.file_hash:
        return entry.file_hash, "reused"
    return "", "missing"


def import_changelog(
    request: ImportRequest,
    *,
    source: Collection[dict[str, Any]],
    target: Changelog,
    files: Sequence[str],
    checksum: Checksum,
    adoption: Adoption,
    logger: logging.Logger,
    ensure_indexes: bool,
) -> ImportResult:
    """Plan the whole import, refuse or preview it, then write it (reference core §11.1)."""
    fmt = request.format
    read = read_source(source, fmt, logger)
    entries, skipped = read.entries, read.skipped
    # In place (the Node original's changelog is ours), the tool's own records are not "records
    # already in the target": only ours are.
    others_empty = target.is_empty(excluding=read.names if request.in_place else ())

    def result(imported: int, rows: list[ImportRow]) -> ImportResult:
        if request.dry_run:  # nothing was imported: say what would be, in a field saying so
            return ImportResult(source=request.source, target=request.target, imported=0,
                                skipped=skipped, dry_run=True, rows=rows,
                                origin=fmt.record_origin, would_import=imported)
        return ImportResult(source=request.source, target=request.target, imported=imported,
                            skipped=skipped, dry_run=False, rows=rows, origin=fmt.record_origin)

    if not entries:
        logger.info('Nothing to import from "%s"', request.source)
        return result(0, [])
    _require_dates(entries, fmt, request.source)
    if not request.force and not others_empty:  # a dry run predicts the refusal
        raise ImportTargetNotEmptyError(
            f'The target changelog "{request.target}" already has records — pass --force to '
            "merge the import into it",
            {"target": request.target},
        )

    index = FileIndex(files)
    planned: list[tuple[SourceEntry, str, str | None]] = []
    claimed: dict[str, str] = {}
    for entry in entries:
        file = index.match(entry.name)
        if file is None and request.in_place:  # its own record is already there, applied
            skipped += 1
            logger.warning("⚠ Skipping %s: no migration file stands for it — its record stays "
                           "as it is", entry.name)
            continue
        name = file or entry.name
        if name in claimed:
            skipped += 1
            logger.warning("⚠ Skipping %s: %s is already imported from %s", entry.name, name,
                           claimed[name])
            continue
        claimed[name] = entry.name
        if file is None:
            logger.warning("⚠ File not found on disk: %s — checksum unverifiable", entry.name)
        elif file != entry.name:
            logger.debug("%s → %s", entry.name, file)
        planned.append((entry, name, file))

    offset = target.max_batch(excluding=claimed)
    rows: list[ImportRow] = []
    records: list[dict[str, Any]] = []
    for position, (entry, name, file) in enumerate(planned, start=1):
        value, how = _resolve_checksum(entry, file, checksum, request.trust_hash)
        batch = offset + position
        rows.append(ImportRow(file=name, batch=batch, applied_at=entry.applied_at, checksum=value,
                              checksum_source=how,
                              source_name=entry.name if entry.name != name else None))
        records.append({
            **adoption.stamp(), "name": name, "batch": batch, "status": "applied",
            "appliedAt": entry.applied_at, "checksum": value,
            "environment": IMPORTED_ENVIRONMENT, "executedBy": IMPORTED_BY,
            "origin": fmt.record_origin,
        })

    if request.dry_run:
        logger.info('◎ Dry-run  Would import %d record(s) from "%s" → "%s"', len(rows),
                    request.source, request.target)
        return result(len(rows), rows)
    if ensure_indexes:
        target.ensure_indexes()
    adoption.write(target, records)
    logger.info('✔ Imported %d record(s) from "%s" → "%s"', len(rows), request.source,
                request.target)
    return result(len(rows), rows)


def baseline(
    *,
    changelog: Changelog,
    files: Sequence[str],
    checksum: Checksum,
    to: str | None,
    dry_run: bool,
    environment: str,
    executed_by: str,
    adoption: Adoption,
    logger: logging.Logger,
) -> BaselineResult:
    """Mark the pending files (up to ``to``, inclusive) applied in one batch, unrun (§11.2)."""
    if to is not None and to not in files:
        raise MigrationFileNotFoundError(f"Migration file not found: {to}", {"to": to})
    applied = set(changelog.applied_names())
    targets = [n for n in files if n not in applied and (to is None or n <= to)]
    skipped = len(files) - len(targets)
    if not targets:
        logger.info("Nothing to baseline")
        return BaselineResult([], skipped, None, dry_run=dry_run)
    batch = changelog.max_batch() + 1
    if dry_run:
        logger.info("◎ Dry-run  Would baseline %d migration(s) as applied (batch %d)",
                    len(targets), batch)
        return BaselineResult(targets, skipped, batch, dry_run=True)
    records = [
        {**adoption.stamp(), "name": name, "batch": batch, "status": "applied",
         "checksum": checksum(name) or "", "environment": environment,
         "executedBy": executed_by, "origin": BASELINE_ORIGIN}
        for name in targets
    ]
    adoption.write(changelog, records)
    logger.info("✔ Baselined %d migration(s) as applied (batch %d)", len(targets), batch)
    return BaselineResult(targets, skipped, batch)


def validate_baseline_options(to: Any) -> None:
    """A ``to`` must be a bare, safe file name (checked before connecting)."""
    if to is not None:
        check_name(to, field="to")
