"""``audit``: independent, read-only health checks in a fixed order (reference core §11.3).

Invariant: an audit only reads — it never takes the lock, writes, emits an event or creates an
index (connecting creates none). ``config`` and ``connection`` failures end the report early,
because no other check can run without them; every other check that cannot read what it needs
warns ("unreadable") instead of failing, so a flaky read never looks like a broken deployment.
What was read but is not understood — a lock document or changelog record migronaut did not
write — fails its check: every run would stop on it.

Checks: ``config``, ``connection``, ``transactions``, ``indexes``, ``lock``, ``changelog``,
``checksums``, ``pending``, ``ordering``, ``files``, the checks a caller adds (``background``,
added by :mod:`migronaut.commands.audit`, only when background migrations exist), ``runtime``.
This module knows nothing of background migrations: an added check reads what the core checks
read (:class:`AuditFacts`) and is guarded like them (a read error warns "unreadable").
"""

from __future__ import annotations

import datetime as dt
import importlib.machinery
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from migronaut.core.changelog import judge_unfinished
from migronaut.core.lock import read_lock_status
from migronaut.core.plan import build_status_rows
from migronaut.core.results import AuditCheck, AuditReport, StatusRow
from migronaut.errors import MigronautError, describe_exception

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.core.changelog import Changelog, RecordCheck
    from migronaut.core.config import Config
    from migronaut.core.topology import Topology

__all__ = ["AddedCheck", "AuditFacts", "Auditable", "run_audit"]


class Auditable(Protocol):
    """What an audit reads through (a :class:`~migronaut.api.Migrator` in read-only mode)."""

    @property
    def config(self) -> Config: ...

    def connect(self) -> None: ...

    @property
    def db(self) -> Database[dict[str, Any]]: ...

    @property
    def state_db(self) -> Database[dict[str, Any]]: ...

    @property
    def changelog(self) -> Changelog: ...

    def files(self) -> list[str]: ...

    def checksum(self, name: str) -> str | None: ...


@dataclass(frozen=True)
class AuditFacts:
    """What the core checks read, handed to the checks a caller adds after them."""

    config: Config
    records: list[dict[str, Any]]
    files: list[str]
    #: the server's clock when it could be read, else the client's (UTC, naive)
    now: dt.datetime


@dataclass(frozen=True)
class AddedCheck:
    """A check the layer above adds before ``runtime``: ``None`` from ``run`` leaves it out."""

    name: str
    run: Callable[[AuditFacts], AuditCheck | None]


def _read_errors() -> tuple[type[BaseException], ...]:
    from pymongo.errors import PyMongoError

    return (PyMongoError, MigronautError, OSError)


def _names(names: Sequence[str]) -> str:
    return ", ".join(names)


def run_audit(target: Auditable, *, added: Sequence[AddedCheck] = ()) -> AuditReport:
    """Run every check against ``target`` and return the report (never raises for a finding).

    ``added`` checks run in order after ``files`` and before ``runtime``.
    """
    try:
        config = target.config
    except MigronautError as error:
        return AuditReport((AuditCheck("config", "fail", error.message),))
    checks = [AuditCheck("config", "pass", f'Loaded (database "{config.db_name}")')]
    try:
        target.connect()
    except MigronautError as error:
        checks.append(AuditCheck("connection", "fail", error.message))
        return AuditReport(tuple(checks))
    injected = config.client is not None
    checks.append(AuditCheck("connection", "pass",
                         "Using the injected client" if injected else "Connected"))

    topology, transactions = _transactions(target, config)
    checks.append(transactions)
    now = (topology.server_time if topology is not None and topology.server_time
           else dt.datetime.now(dt.UTC).replace(tzinfo=None))
    checks.append(_indexes(target.changelog, config))
    lock_check, live_owner = _lock(target.state_db[config.lock_collection], config)
    checks.append(lock_check)

    records: list[dict[str, Any]] = []
    files: list[str] = []
    try:
        checked, files = target.changelog.check(), target.files()
    except _read_errors() as error:
        unreadable = f"Status unreadable: {describe_exception(error)}"
        checks += [AuditCheck(name, "warn", unreadable)
                   for name in ("changelog", "checksums", "pending", "ordering", "files")]
    else:
        records = checked.readable
        checks.append(_changelog(checked, live_owner))
        if checked.problems:
            checks += [AuditCheck(name, "warn", _NOT_CHECKED)
                       for name in ("checksums", "pending", "ordering")]
        else:
            checks += _status_checks(build_status_rows(
                records, files, checksum=target.checksum, duplicates=checked.duplicates,
                live_owner=live_owner))
        checks.append(_files(records, files))

    facts = AuditFacts(config, records, files, now)
    for check in added:
        found = _added(check, facts)
        if found is not None:
            checks.append(found)
    checks.append(_runtime(config))
    return AuditReport(tuple(checks))


def _transactions(target: Auditable, config: Config) -> tuple[Topology | None, AuditCheck]:
    from migronaut.core.topology import read_topology

    try:
        topology = read_topology(target.db.client, target.changelog.collection)
    except _read_errors() as error:
        return None, AuditCheck("transactions", "warn",
                            f"Topology unknown ({describe_exception(error)})")
    if topology.kind == "replica-set":
        return topology, AuditCheck("transactions", "pass", f'Replica set "{topology.set_name}"')
    if topology.kind == "sharded":
        return topology, AuditCheck("transactions", "pass", "Sharded")
    if topology.transactions is None:
        return topology, AuditCheck("transactions", "warn",
                                f"Topology unknown ({topology.probe_error})")
    if topology.transactions:
        return topology, AuditCheck("transactions", "pass",
                                "No replica set reported, but transactions work (the dev server?)")
    if config.use_transaction:
        return topology, AuditCheck(
            "transactions", "fail",
            "Standalone server with use_transaction on — transactions need a replica set or a "
            "sharded cluster",
        )
    return topology, AuditCheck(
        "transactions", "warn",
        "Standalone server — no transactions (a migration with use_transaction = True fails)",
    )


def _indexes(changelog: Changelog, config: Config) -> AuditCheck:
    try:
        missing = changelog.missing_indexes()
    except _read_errors() as error:
        return AuditCheck("indexes", "warn", f"Unreadable: {describe_exception(error)}")
    if not missing:
        return AuditCheck("indexes", "pass", "All 5 changelog indexes present")
    remedy = ("created by the next command that writes the changelog" if config.ensure_indexes
              else "ensure_indexes is off: create them")
    return AuditCheck("indexes", "warn", f"Missing: {_names(missing)} ({remedy})")


def _lock(
    collection: Collection[dict[str, Any]], config: Config
) -> tuple[AuditCheck, str | None]:
    """The lock as ``up`` judges it (one rule, :mod:`migronaut.core.lock`), and the owner of a
    lock held within its TTL (whose ``running`` records are not in doubt)."""
    try:
        status = read_lock_status(collection, ttl_ms=config.lock_ttl_seconds * 1000)
    except _read_errors() as error:
        return AuditCheck("lock", "warn", f"Unreadable: {describe_exception(error)}"), None
    holder = status.holder
    if holder is None:
        return AuditCheck("lock", "pass", "Not held"), None
    if status.state == "invalid":
        return AuditCheck("lock", "fail", f"The lock document cannot be read: "
                          f"{status.describe_problems()}; runs treat it as held until it is "
                          "removed (migronaut unlock)"), None
    who = f"pid {holder.pid} on {holder.host}"
    held = f"Held by {who} for {status.held_for_s}s"
    if status.state == "held":
        return AuditCheck("lock", "pass", held), holder.run_id
    ttl_s = (status.ttl_ms or config.lock_ttl_seconds * 1000) / 1000
    return AuditCheck("lock", "warn", f"{held} — past its TTL of {ttl_s:g}s, likely from a "
                                      "crashed run (migronaut unlock)"), None


_NOT_CHECKED = "Not checked: the changelog has records migronaut cannot read"


def _changelog(checked: RecordCheck, live_owner: str | None) -> AuditCheck:
    """Every record understood, one per migration, every applied one in a batch, and none in
    doubt (left ``running``/``reverting`` by a run that no longer holds the lock)."""
    findings: list[str] = []
    doubt = [u for u in judge_unfinished(checked.readable, live_owner=live_owner)
             if not u.alive]
    if doubt:
        findings.append("In doubt (a run ended without recording the outcome; migronaut "
                        "resolve FILE --applied or --pending): "
                        + "; ".join(u.describe() for u in doubt[:5])
                        + (f" (and {len(doubt) - 5} more)" if len(doubt) > 5 else ""))
    if checked.problems:
        findings.append(f"{checked.unreadable_count} record(s) migronaut cannot read: "
                        f"{checked.describe_problems()}")
    if checked.duplicates:
        findings.append("Several records for one migration (the unique index on name is "
                        f"missing): {checked.describe_duplicates()}")
    if checked.unbatched:
        findings.append("Applied without a batch (down cannot revert them by batch): "
                        + _names(checked.unbatched))
    if findings:
        return AuditCheck("changelog", "fail", "; ".join(findings))
    return AuditCheck("changelog", "pass",
                      f"{len(checked.records)} record(s), all understood, one per migration")


def _files(records: Sequence[dict[str, Any]], files: Sequence[str]) -> AuditCheck:
    """Applied records whose file is gone: ``down`` cannot revert them (imported records may
    never have had one, hence a warning)."""
    on_disk = set(files)
    missing = [r["name"] for r in records
               if r.get("status") == "applied" and r["name"] not in on_disk]
    if missing:
        return AuditCheck("files", "warn",
                          f"Applied but not on disk (down cannot revert them): {_names(missing)}")
    return AuditCheck("files", "pass", "Every applied migration has its file")


def _status_checks(rows: Sequence[StatusRow]) -> list[AuditCheck]:
    drifted = [r.file for r in rows if r.checksum_ok is False and not r.invalid]
    outstanding = [r for r in rows if r.status in ("pending", "failed")]
    failed = sum(1 for r in outstanding if r.status == "failed")
    late = [r.file for r in rows if r.out_of_order]
    checks = [
        AuditCheck("checksums", "fail", f"Edited after being applied: {_names(drifted)}") if drifted
        else AuditCheck("checksums", "pass", "No applied file changed on disk"),
    ]
    if outstanding:
        detail = f"{len(outstanding)} pending migration(s)"
        checks.append(AuditCheck("pending", "warn",
                             detail + (f" ({failed} failed)" if failed else "")))
    else:
        checks.append(AuditCheck("pending", "pass", "No pending migrations"))
    checks.append(
        AuditCheck("ordering", "warn",
               f"Pending but older than the newest applied migration: {_names(late)}") if late
        else AuditCheck("ordering", "pass", "No pending migration sorts before an applied one")
    )
    return checks


def _added(check: AddedCheck, facts: AuditFacts) -> AuditCheck | None:
    try:
        return check.run(facts)
    except _read_errors() as error:
        return AuditCheck(check.name, "warn", f"Unreadable: {describe_exception(error)}")


def _runtime(config: Config) -> AuditCheck:
    import pymongo

    versions = f"Python {platform.python_version()}, pymongo {pymongo.version}"
    loadable = tuple(importlib.machinery.SOURCE_SUFFIXES)
    unloadable = [ext for ext in config.file_extensions if ext not in loadable]
    if unloadable:
        return AuditCheck("runtime", "warn",
                      f"{versions} cannot load migration files ending in {_names(unloadable)} "
                      "(file_extensions)")
    return AuditCheck("runtime", "pass", versions)
