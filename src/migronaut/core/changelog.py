"""The changelog collection (``_migronaut_migrations``): one record per migration name.

Invariant: a record is never deleted (except a claim that created it and was given back
before its body started, :meth:`Changelog.give_back`); ``status`` says where a migration
stands (``applied``, ``reverted`` or ``failed``; ``running`` or ``reverting`` while a body runs
outside a transaction). Applying upserts by name, reverting flips the status, a failed attempt
leaves a trace without ever demoting an applied record.

Before a body that runs outside a transaction, its run claims the record (:func:`intent_write`):
``running`` (up) or ``reverting`` (down), with an ``intent`` sub-document naming the run (its id,
which is also its lock's owner token), host, pid, start time (server clock), direction and the
status it found (going up, the claim of the next migration travels with the final write of
the previous one: :meth:`Changelog.finish_and_claim`, one round trip per migration). The claim
only matches the status the run planned from, so of two runs that
both planned a migration (a lock lost between them) one claims it and the other refuses. The
final write matches that intent only, and clears it. A record left ``running``/``reverting`` by a
run that is gone is *in doubt* (:func:`judge_unfinished`): nothing runs it again until an
operator resolves it (:func:`resolved_write`). The Node original reads ``status: 'applied'``
only, so such a record never counts as applied there. Every timestamp except
``firstAppliedAt`` comes from the server clock. Field names are the Node original's. The writes
are idempotent, so outside a transaction they are retried over transient network errors: a
record whose reply was lost is sent again, never lost (a lost record would let a later ``up``
apply the migration again).

A record migronaut does not understand is never guessed at (:func:`check_records`): a name that
is not a string, a missing or unknown ``status``, a ``batch`` that is not a positive integer or
an ``appliedAt`` that is not a date stops every command that reads it (``STATE_INVALID``) — an
unknown status is never "pending". Two records for one name (the unique index gone) leave the
views working but stop every command that writes (:meth:`RecordCheck.require_unique`).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from migronaut._json import iso
from migronaut._redact import shown_value
from migronaut._values import is_int
from migronaut.core.retry import retry_transient
from migronaut.errors import MigrationInDoubtError, StateInvalidError

if TYPE_CHECKING:
    from pymongo.asynchronous.client_session import AsyncClientSession
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection
    from pymongo.results import UpdateResult

__all__ = [
    "INDEXES",
    "UNFINISHED",
    "Changelog",
    "ChangelogRead",
    "ChangelogWrite",
    "RecordCheck",
    "RecordProblem",
    "Unfinished",
    "applied_write",
    "check_records",
    "finished_write",
    "in_doubt_error",
    "intent_write",
    "judge_unfinished",
    "record_problems",
    "resolved_write",
    "reverted_write",
    "withdrawn_write",
]

APPLIED = "applied"
REVERTED = "reverted"
FAILED = "failed"
RUNNING = "running"
REVERTING = "reverting"
#: A body runs (or ran, and its run is gone: in doubt) outside a transaction.
UNFINISHED = (RUNNING, REVERTING)
STATUSES = (APPLIED, REVERTED, FAILED, RUNNING, REVERTING)
#: What a mutating command reads to check every record before it writes one.
_CHECKED_FIELDS = {"_id": 1, "name": 1, "status": 1, "batch": 1, "appliedAt": 1, "intent": 1}
#: How many problems an error message names (the context lists up to ``_LISTED``).
_NAMED, _LISTED = 5, 100

#: The five indexes of reference core §4.2: (name, keys, options).
INDEXES: tuple[tuple[str, list[tuple[str, int]], dict[str, Any]], ...] = (
    ("name_unique", [("name", 1)], {"unique": True}),
    ("status_batch", [("status", 1), ("batch", -1)], {}),
    ("batch", [("batch", 1)], {}),
    ("status_name", [("status", 1), ("name", 1)], {}),
    ("status_appliedAt_name", [("status", 1), ("appliedAt", -1), ("name", -1)], {}),
)

_NEWEST_FIRST = [("appliedAt", -1), ("name", -1)]


class Changelog:
    """Reads and writes of the changelog; one instance per collection."""

    def __init__(self, collection: Collection[dict[str, Any]]) -> None:
        self.collection = collection

    # -- set-up -------------------------------------------------------------------------------
    def ensure_indexes(self) -> None:
        """Create the five indexes; duplicate names that stop the unique one are named
        (``STATE_INVALID``), not a driver error."""
        from pymongo import IndexModel
        from pymongo.errors import DuplicateKeyError

        try:
            self.collection.create_indexes(
                [IndexModel(keys, name=name, **opts) for name, keys, opts in INDEXES]
            )
        except DuplicateKeyError as error:
            self.check(_CHECKED_FIELDS).require_unique(self.collection.name)
            raise StateInvalidError(
                f"The unique index on name cannot be built ({self.collection.name}): "
                f"{error.details.get('errmsg') if error.details else error}",
                {"collection": self.collection.name}, cause=error,
            ) from error

    def missing_indexes(self) -> list[str]:
        present = set(self.collection.index_information())
        return [name for name, _, _ in INDEXES if name not in present]

    # -- reads --------------------------------------------------------------------------------
    def check(self, projection: Mapping[str, Any] | None = None) -> RecordCheck:
        """Every record (name ascending, with ``_id``), checked in the same pass."""
        cursor = self.collection.find({}, dict(projection) if projection else None)
        return check_records(cursor.sort("name", 1))

    def verify(self) -> RecordCheck:
        """Before a command writes: every record understood and one per name, or
        ``STATE_INVALID`` naming them (one read of five fields per record)."""
        checked = self.check(_CHECKED_FIELDS)
        checked.require_readable(self.collection.name)
        checked.require_unique(self.collection.name)
        return checked

    def read(self) -> ChangelogRead:
        """Every record in one read, understood and one per name (else ``STATE_INVALID``): what
        a run plans from under its lock (:class:`ChangelogRead`)."""
        checked = self.check()
        checked.require_readable(self.collection.name)
        checked.require_unique(self.collection.name)
        return ChangelogRead(checked.records)

    def get(self, name: str) -> dict[str, Any] | None:
        return self.collection.find_one({"name": name}, {"_id": 0})

    def unfinished(self) -> list[dict[str, Any]]:
        """Records a body outside a transaction left ``running``/``reverting``, name
        ascending (served by the ``status_name`` index)."""
        query = {"status": {"$in": list(UNFINISHED)}}
        return list(self.collection.find(query, {"_id": 0}).sort("name", 1))

    def applied_names(self) -> list[str]:
        cursor = self.collection.find({"status": APPLIED}, {"name": 1, "_id": 0}).sort("name", 1)
        return [doc["name"] for doc in cursor]

    def applied(self) -> list[dict[str, Any]]:
        """Applied records with the fields drift checks and reverts need, name ascending."""
        projection = {"_id": 0, "name": 1, "checksum": 1, "origin": 1, "batch": 1, "kind": 1}
        return list(self.collection.find({"status": APPLIED}, projection).sort("name", 1))

    def last_applied(self, n: int) -> list[dict[str, Any]]:
        cursor = self.collection.find({"status": APPLIED}, {"_id": 0}).sort(_NEWEST_FIRST)
        return list(cursor.limit(n))

    def newest_applied(self) -> dict[str, Any] | None:
        found = self.last_applied(1)
        return found[0] if found else None

    def newest_applied_name(self) -> str | None:
        cursor = self.collection.find({"status": APPLIED}, {"name": 1, "_id": 0})
        found = list(cursor.sort("name", -1).limit(1))
        return found[0]["name"] if found else None

    def applied_later_than(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Applied records newer than ``record`` in revert order (``appliedAt`` desc, name
        desc): what an ordered single-file revert must wait for."""
        at, name = record.get("appliedAt"), record["name"]
        query = {"status": APPLIED, "name": {"$ne": name},
                 "$or": [{"appliedAt": {"$gt": at}}, {"appliedAt": at, "name": {"$gt": name}}]}
        return list(self.collection.find(query, {"_id": 0, "name": 1}).sort(_NEWEST_FIRST))

    def applied_after(self, name: str) -> list[dict[str, Any]]:
        query = {"status": APPLIED, "name": {"$gt": name}}
        return list(self.collection.find(query, {"_id": 0}).sort("name", 1))

    def last_batch(self) -> int | None:
        cursor = self.collection.find({"status": APPLIED}, {"batch": 1, "_id": 0})
        found = list(cursor.sort("batch", -1).limit(1))
        return int(found[0]["batch"]) if found and found[0].get("batch") is not None else None

    def max_batch(self, *, excluding: Iterable[str] = ()) -> int:
        """The highest batch over every record (reverted and failed too), or 0; ``excluding``
        leaves those names out (a re-import renumbers its own records the same way)."""
        names = list(excluding)
        query: dict[str, Any] = {"name": {"$nin": names}} if names else {}
        cursor = self.collection.find(query, {"batch": 1, "_id": 0}).sort("batch", -1).limit(1)
        found = list(cursor)
        return int(found[0].get("batch") or 0) if found else 0

    def is_empty(self, *, excluding: Iterable[str] = ()) -> bool:
        """No record at all (``excluding`` those names)."""
        names = list(excluding)
        query: dict[str, Any] = {"name": {"$nin": names}} if names else {}
        return self.collection.find_one(query, {"_id": 1}) is None

    def applied_without_batch(self) -> list[str]:
        """Names of applied records with no batch (missing or null): no batch revert selects
        them."""
        cursor = self.collection.find({"status": APPLIED, "batch": None}, {"name": 1, "_id": 0})
        return [str(doc.get("name")) for doc in cursor.sort("name", 1)]

    def by_batch(self, batch: int) -> list[dict[str, Any]]:
        query = {"status": APPLIED, "batch": batch}
        return list(self.collection.find(query, {"_id": 0}).sort("name", 1))

    def records_named(self, names: Iterable[str]) -> list[dict[str, Any]]:
        return list(self.collection.find({"name": {"$in": list(names)}}, {"_id": 0}))

    # -- writes -------------------------------------------------------------------------------
    def mark_applied(
        self, record: Mapping[str, Any], session: ClientSession | None = None
    ) -> None:
        """Upsert by name: never an insert, so re-applies, redo and import meet the unique index."""
        self.write(applied_write(record), session)

    def write(self, change: ChangelogWrite, session: ClientSession | None = None) -> UpdateResult:
        """Apply one write; retried outside a transaction (a transaction retries as a whole)."""
        def send() -> UpdateResult:
            return self.collection.update_one(
                change.filter, change.update, upsert=change.upsert, session=session
            )

        return send() if session is not None else retry_transient(send)

    def claim(self, change: ChangelogWrite, run_id: str) -> bool:
        """Send an :func:`intent_write`; ``False`` when another run changed the record since it
        was planned (no match, or the unique index refused a second record). A claim whose reply
        was lost and whose resend matches nothing is recognised by its run id."""
        from pymongo.errors import DuplicateKeyError

        try:
            result = self.write(change)
        except DuplicateKeyError:
            result = None
        if result is not None and (result.matched_count or result.upserted_id is not None):
            return True
        found = self.collection.find_one({"name": change.filter["name"]},
                                         {"_id": 0, "status": 1, "intent.runId": 1})
        intent = (found or {}).get("intent")
        return isinstance(intent, dict) and intent.get("runId") == run_id \
            and (found or {}).get("status") in UNFINISHED

    def finish(self, change: ChangelogWrite, status: str) -> bool:
        """Send a :func:`finished_write` or :func:`withdrawn_write`; ``False`` when the record
        is no longer this run's claim and is not ``status`` either (an operator resolved it, or
        the first send's reply was lost: then it already is ``status``)."""
        if self.write(change).matched_count:
            return True
        found = self.collection.find_one({"name": change.filter["name"]},
                                         {"_id": 0, "status": 1})
        return found is not None and found.get("status") == status

    def finish_and_claim(
        self, final: ChangelogWrite, claim: ChangelogWrite, run_id: str
    ) -> tuple[bool, bool]:
        """The final write of one migration (a :func:`finished_write` of an applied record)
        and the claim (:func:`intent_write`) of the next, as two ordered statements of ONE
        ``update`` command: one round trip per migration in steady state.

        Returns (finished, claimed). Each is read from the reply when the reply says both
        statements took effect; otherwise — a statement that matched nothing, a
        duplicate-key refusal, a resend after a lost reply — from the two records (primary
        read): finished when the first record is ``applied`` by this run, claimed when the
        second is unfinished under this run's intent. Nothing is guessed. A write error on the
        final statement, or a connection that never answers, is raised as :meth:`write`
        raises it (the caller leaves the migration in doubt).
        """
        from pymongo.errors import WriteConcernError, WriteError

        collection = self.collection
        command: dict[str, Any] = {"updates": [final.statement(), claim.statement()],
                                   "ordered": True}
        if not collection.write_concern.is_server_default:
            command["writeConcern"] = collection.write_concern.document

        def send() -> dict[str, Any]:
            return collection.database.command("update", collection.name, **command)

        reply = retry_transient(send)
        errors = reply.get("writeErrors") or []
        if errors and errors[0].get("index") == 0:
            raise WriteError(str(errors[0].get("errmsg")), errors[0].get("code"), reply)
        concern = reply.get("writeConcernError")
        if concern:
            raise WriteConcernError(str(concern.get("errmsg")), concern.get("code"), reply)
        if not errors and reply.get("n") == 2:
            return True, True
        names = [final.filter["name"], claim.filter["name"]]
        found = {doc.get("name"): doc for doc in collection.find(
            {"name": {"$in": names}}, {"_id": 0, "name": 1, "status": 1, "runId": 1,
                                      "intent.runId": 1})}
        done, next_ = found.get(names[0]) or {}, found.get(names[1]) or {}
        intent = next_.get("intent")
        return (done.get("status") == APPLIED and done.get("runId") == run_id,
                next_.get("status") in UNFINISHED and isinstance(intent, dict)
                and intent.get("runId") == run_id)

    def give_back(self, name: str, status: str, run_id: str) -> None:
        """Undo this run's claim of a migration whose body never started: the record returns
        to the status it had (``intent.previous``), or — when the claim created it — is
        removed, so nothing looks in doubt that never ran. Both match this run's claim only."""
        ours = _ours(name, status, run_id)
        restored = self.write(ChangelogWrite(
            {**ours, "intent.previous": {"$ne": None}},
            [{"$set": {"status": "$intent.previous"}}, {"$unset": "intent"}]))
        if not restored.matched_count:
            retry_transient(lambda: self.collection.delete_one({**ours, "intent.previous": None}))

    def mark_applied_bulk(self, records: Iterable[Mapping[str, Any]]) -> None:
        from pymongo import UpdateOne

        ops = [UpdateOne({"name": r["name"]}, applied_update(r), upsert=True) for r in records]
        if ops:
            self.collection.bulk_write(ops, ordered=False)

    def mark_reverted(
        self,
        name: str,
        session: ClientSession | None = None,
        *,
        requested_by: str | None = None,
        reason: str | None = None,
    ) -> UpdateResult:
        return self.write(
            reverted_write(name, requested_by=requested_by, reason=reason), session
        )

    def mark_failed(self, record: Mapping[str, Any]) -> None:
        """Best effort: record a failed attempt, never demoting an applied record."""
        from pymongo.errors import PyMongoError

        fields = {k: v for k, v in record.items() if k != "name" and v is not None}
        fields["status"] = FAILED
        def send() -> None:
            # An applied record stays as it is. Check first: without the unique index
            # (ensure_indexes = false) the upsert below would add a second, "failed" record.
            if self.collection.find_one({"name": record["name"], "status": APPLIED}, {"_id": 1}):
                return
            self.collection.update_one(
                {"name": record["name"], "status": {"$ne": APPLIED}},
                {"$set": fields, "$currentDate": {"failedAt": True}, "$unset": {"intent": ""}},
                upsert=True,
            )

        try:
            retry_transient(send)
        except PyMongoError:
            pass  # an applied record collides on the unique index: it stays applied

    def set_checksum(self, name: str, checksum: str) -> None:
        self.collection.update_one({"name": name}, {"$set": {"checksum": checksum}})


# -- checking what is stored ----------------------------------------------------------------


class ChangelogRead:
    """The changelog as one read found it (every record, checked): the reads ``up`` plans from,
    answered from memory. Taken under the lock, it stays true while the lock is held — every
    other writer of the changelog takes that lock (a run that lost it meets the claim's filter).
    """

    def __init__(self, records: Iterable[Mapping[str, Any]]) -> None:
        self._records = {str(r["name"]): {k: v for k, v in r.items() if k != "_id"}
                         for r in records}

    @property
    def empty(self) -> bool:
        return not self._records

    def get(self, name: str) -> dict[str, Any] | None:
        record = self._records.get(name)
        return dict(record) if record is not None else None

    def applied(self) -> list[dict[str, Any]]:
        return [dict(r) for name, r in sorted(self._records.items()) if r.get("status") == APPLIED]

    def applied_names(self) -> list[str]:
        return [r["name"] for r in self.applied()]

    def records_named(self, names: Iterable[str]) -> list[dict[str, Any]]:
        return [dict(self._records[name]) for name in names if name in self._records]

    def unfinished(self) -> list[dict[str, Any]]:
        return [dict(r) for name, r in sorted(self._records.items())
                if r.get("status") in UNFINISHED]

    def max_batch(self) -> int:
        """The highest batch over every record, or 0 (as :meth:`Changelog.max_batch`)."""
        return max((int(r.get("batch") or 0) for r in self._records.values()), default=0)


@dataclass(frozen=True)
class RecordProblem:
    """One field of one changelog record migronaut does not understand."""

    record: str
    field: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"record": self.record, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        return f"{self.record}: {self.message}"


def _positive_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return value.is_integer() and value >= 1
    return isinstance(value, int) and value >= 1


def record_problems(doc: Mapping[str, Any]) -> list[RecordProblem]:
    """What is wrong with one record (empty: migronaut understands it)."""
    name = doc.get("name")
    label = name if isinstance(name, str) and name else f"_id {doc.get('_id')}"
    problems: list[RecordProblem] = []

    def problem(field: str, message: str) -> None:
        problems.append(RecordProblem(label, field, message))

    if "name" not in doc:
        problem("name", "has no name")
    elif not isinstance(name, str) or not name:
        problem("name", f"name {shown_value(name)} is not a string")
    status = doc.get("status")
    if "status" not in doc:
        problem("status", "has no status")
    elif not isinstance(status, str) or status not in STATUSES:
        problem("status", f"status {shown_value(status)} is not one of {', '.join(STATUSES)}")
    elif status in UNFINISHED:
        intent = doc.get("intent")
        if not isinstance(intent, Mapping) or not isinstance(intent.get("runId"), str):
            problem("intent", f"is {status} but has no intent naming its run")
    batch = doc.get("batch")
    if batch is not None and not _positive_int(batch):
        problem("batch", f"batch {shown_value(batch)} is not a positive integer")
    applied_at = doc.get("appliedAt")
    if applied_at is not None and not isinstance(applied_at, dt.datetime):
        problem("appliedAt", f"appliedAt {shown_value(applied_at)} is not a date")
    elif applied_at is None and status == APPLIED:
        problem("appliedAt", "is applied but has no appliedAt")
    return problems


@dataclass(frozen=True)
class RecordCheck:
    """One read of the changelog, checked in one pass: the records, those it understands, what
    it does not understand, names recorded more than once, and applied records with no batch."""

    records: list[dict[str, Any]]
    readable: list[dict[str, Any]]
    problems: tuple[RecordProblem, ...]
    duplicates: dict[str, int]
    unbatched: tuple[str, ...]

    @property
    def unreadable_count(self) -> int:
        """How many records have a problem."""
        return len({problem.record for problem in self.problems})

    def describe_problems(self) -> str:
        """``a.py: status 'x' is not …; b.py: …`` — the first five, then how many more."""
        named = "; ".join(str(problem) for problem in self.problems[:_NAMED])
        more = len(self.problems) - _NAMED
        return named + (f" (and {more} more)" if more > 0 else "")

    def describe_duplicates(self) -> str:
        """``a.py (2), b.py (3)``: each name recorded more than once, and how often."""
        return ", ".join(f"{name} ({count})" for name, count in self.duplicates.items())

    def require_readable(self, collection: str) -> None:
        """``STATE_INVALID`` naming the records and fields migronaut does not understand."""
        if not self.problems:
            return
        context = {"collection": collection, "problemCount": len(self.problems),
                   "problems": [problem.to_dict() for problem in self.problems[:_LISTED]]}
        if self.unreadable_count == 1:
            detail = "; ".join(problem.message for problem in self.problems)
            raise StateInvalidError(
                f"Changelog record {self.problems[0].record} ({collection}): {detail} — fix or "
                "remove it; migronaut does not guess what it means", context)
        raise StateInvalidError(
            f"{self.unreadable_count} changelog records ({collection}) migronaut cannot read: "
            f"{self.describe_problems()} — fix or remove them; migronaut does not guess what "
            "they mean", context)

    def require_unique(self, collection: str) -> None:
        """``STATE_INVALID`` naming the names recorded more than once."""
        if self.duplicates:
            raise StateInvalidError(
                f"{self.duplicates_text(collection)}; remove the extra records, then run again",
                {"collection": collection, "duplicates": self.duplicates})

    def duplicates_text(self, collection: str) -> str:
        """``Several changelog records for one migration (<collection>): a.py (2) — …``."""
        return (f"Several changelog records for one migration ({collection}): "
                f"{self.describe_duplicates()} — the unique index on name is missing")


def check_records(docs: Iterable[dict[str, Any]]) -> RecordCheck:
    """Check every record once (linear in the number of records)."""
    records: list[dict[str, Any]] = []
    readable: list[dict[str, Any]] = []
    problems: list[RecordProblem] = []
    names: Counter[str] = Counter()
    unbatched: list[str] = []
    for doc in docs:
        records.append(doc)
        found = record_problems(doc)
        if found:
            problems += found
            continue
        readable.append(doc)
        names[doc["name"]] += 1
        if doc.get("status") == APPLIED and doc.get("batch") is None:
            unbatched.append(doc["name"])
    duplicates = {name: count for name, count in sorted(names.items()) if count > 1}
    return RecordCheck(records, readable, tuple(problems), duplicates, tuple(unbatched))


_ACTOR_FIELDS = ("requestedBy", "reason")


def applied_update(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The update pipeline of ``mark_applied`` (reference core §4.3).

    A pipeline, so ``firstAppliedAt`` is kept when present and set when missing — also on a
    record that a failed attempt created — and ``appliedAt`` is server time (``$$NOW``) unless
    the record carries a historical one (import). Every value is ``$literal``: a string starting
    with ``$`` is data, never a field path.
    """
    fields: dict[str, Any] = {
        k: {"$literal": v}
        for k, v in record.items()
        if k not in ("name", "appliedAt") and v is not None
    }
    fields["status"] = {"$literal": APPLIED}
    applied_at = record.get("appliedAt")
    fields["appliedAt"] = "$$NOW" if applied_at is None else {"$literal": applied_at}
    first = dt.datetime.now(dt.UTC) if applied_at is None else applied_at
    fields["firstAppliedAt"] = {"$ifNull": ["$firstAppliedAt", {"$literal": first}]}
    unset = ["revertedAt", "failedAt", "error", "intent"]
    unset += [key for key in _ACTOR_FIELDS if record.get(key) is None]
    return [{"$set": fields}, {"$unset": unset}]


@dataclass(frozen=True)
class ChangelogWrite:
    """One changelog update, described, so a sync and an async transaction apply the same one."""

    filter: dict[str, Any]
    update: Any
    upsert: bool = False

    def statement(self) -> dict[str, Any]:
        """This write as one statement of an ``update`` command."""
        return {"q": self.filter, "u": self.update, "upsert": self.upsert, "multi": False}

    async def apply_async(
        self, collection: AsyncCollection[dict[str, Any]], session: AsyncClientSession
    ) -> UpdateResult:
        """Apply it inside an async body's transaction (``AsyncClientSession``)."""
        return await collection.update_one(
            self.filter, self.update, upsert=self.upsert, session=session
        )


def applied_write(record: Mapping[str, Any]) -> ChangelogWrite:
    """``mark_applied`` as data: upsert by name."""
    return ChangelogWrite({"name": record["name"]}, applied_update(record), upsert=True)


def reverted_write(
    name: str, *, requested_by: str | None = None, reason: str | None = None
) -> ChangelogWrite:
    """``mark_reverted`` as data: flip an applied record to reverted, with the actor fields."""
    fields: dict[str, Any] = {"status": REVERTED}
    unset: dict[str, str] = {}
    for key, value in (("revertRequestedBy", requested_by), ("revertReason", reason)):
        if value is not None:
            fields[key] = value
        else:
            unset[key] = ""
    update: dict[str, Any] = {"$set": fields, "$currentDate": {"revertedAt": True}}
    if unset:
        update["$unset"] = unset
    return ChangelogWrite({"name": name, "status": APPLIED}, update)


# -- intents: a body outside a transaction, and what its run left behind ------------------------

#: The fields of an ``applied`` record an intent keeps (``intent.record``), so ``resolve
#: --applied`` records the migration as its run would have.
_INTENT_RECORD_FIELDS = ("batch", "checksum", "environment", "executedBy", "description", "kind",
                         "requestedBy", "reason")


def intent_write(
    name: str, *, direction: str, planned: str | None, intent: Mapping[str, Any],
    record: Mapping[str, Any] | None = None,
) -> ChangelogWrite:
    """Claim the record before a body that runs outside a transaction: ``running`` (up) or
    ``reverting`` (down), with ``intent`` (run id, lock owner, host, pid, direction; the server
    stamps ``startedAt`` and keeps the status it replaced as ``previous``).

    The filter is the status the run planned from (``planned``: ``applied`` for a revert or a
    forced re-run, else anything but applied and unfinished), so the claim matches nothing — or
    collides on the unique index — when another run changed the record since: the caller then
    refuses instead of running the body a second time.
    """
    fields: dict[str, Any] = {key: {"$literal": value} for key, value in intent.items()}
    fields["startedAt"] = "$$NOW"
    fields["previous"] = {"$ifNull": ["$status", None]}
    if record is not None:
        kept = {k: record[k] for k in _INTENT_RECORD_FIELDS if record.get(k) is not None}
        fields["record"] = {"$literal": kept}
    status = RUNNING if direction == "up" else REVERTING
    update = [{"$set": {"status": {"$literal": status}, "intent": fields}}]
    if planned == APPLIED:
        return ChangelogWrite({"name": name, "status": APPLIED}, update)
    query = {"name": name, "status": {"$nin": [APPLIED, *UNFINISHED]}}
    return ChangelogWrite(query, update, upsert=True)


def _ours(name: str, status: str, run_id: str) -> dict[str, Any]:
    return {"name": name, "status": status, "intent.runId": run_id}


def finished_write(change: ChangelogWrite, run_id: str) -> ChangelogWrite:
    """The final write of a body outside a transaction: ``change`` (applied or reverted),
    matching only the record this run claimed (it clears the intent)."""
    name = change.filter["name"]
    if change.upsert:  # applied: the pipeline already unsets the intent
        return ChangelogWrite(_ours(name, RUNNING, run_id), change.update)
    update = dict(change.update)
    update["$unset"] = {**update.get("$unset", {}), "intent": ""}
    return ChangelogWrite(_ours(name, REVERTING, run_id), update)


def withdrawn_write(name: str, status: str, run_id: str) -> ChangelogWrite:
    """Give a claim back after a body that failed, when the record was ``applied`` before it
    (a revert, a forced re-run): it stays applied, as it was."""
    return ChangelogWrite(_ours(name, status, run_id),
                          {"$set": {"status": APPLIED}, "$unset": {"intent": ""}})


def resolved_write(
    record: Mapping[str, Any], *, applied: bool, resolution: Mapping[str, Any]
) -> ChangelogWrite:
    """The operator's decision on an in-doubt record (``migronaut resolve``).

    ``applied``: the body finished — a ``running`` record becomes applied with the fields its
    run meant to write (``intent.record``), a ``reverting`` one stays applied. Not applied: a
    ``running`` record becomes ``failed`` (the next ``up`` runs it), a ``reverting`` one
    ``reverted``. The decision, who took it, why, and the intent it replaced are kept in
    ``resolution``.
    """
    name, status = record["name"], record["status"]
    intent = dict(record.get("intent") or {})
    kept = {"$literal": {**resolution, "intent": intent}}
    fields: dict[str, Any] = {"resolution": {"$mergeObjects": [kept, {"at": "$$NOW"}]}}
    unset = ["intent"]
    if applied:
        fields["status"] = {"$literal": APPLIED}
        if status == RUNNING:
            for key, value in dict(intent.get("record") or {}).items():
                if key in _INTENT_RECORD_FIELDS:
                    fields[key] = {"$literal": value}
            fields["appliedAt"] = "$$NOW"
            fields["firstAppliedAt"] = {"$ifNull": ["$firstAppliedAt", "$$NOW"]}
            unset += ["revertedAt", "failedAt", "error"]
    elif status == RUNNING:
        fields["status"] = {"$literal": FAILED}
        fields["failedAt"] = "$$NOW"
        fields["error"] = {"$literal": (
            f"In doubt (run {intent.get('runId')} did not record its outcome); resolved as "
            f"not applied: {resolution.get('reason')}")}
    else:
        fields["status"] = {"$literal": REVERTED}
        fields["revertedAt"] = "$$NOW"
    update = [{"$set": fields}, {"$unset": unset}]
    return ChangelogWrite(_ours(name, status, str(intent.get("runId"))), update)


@dataclass(frozen=True)
class Unfinished:
    """A record left ``running``/``reverting``: in doubt unless its run still holds the lock."""

    name: str
    status: str
    run_id: str
    host: str | None
    pid: int | None
    started_at: dt.datetime | None
    alive: bool

    @property
    def direction(self) -> str:
        return "up" if self.status == RUNNING else "down"

    def describe(self) -> str:
        when = iso(self.started_at) or "an unknown time"
        where = f" on {self.host}" if self.host else ""
        pid = f" (pid {self.pid})" if self.pid is not None else ""
        verb = "applying" if self.status == RUNNING else "reverting"
        return f"{self.name}: run {self.run_id}{where}{pid} started {verb} it at {when}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "direction": self.direction,
                "runId": self.run_id, "host": self.host, "pid": self.pid,
                "startedAt": iso(self.started_at),
                "alive": self.alive}


def judge_unfinished(
    records: Iterable[Mapping[str, Any]], *, live_owner: str | None
) -> list[Unfinished]:
    """The ``running``/``reverting`` records among ``records``; ``live_owner`` is the owner of
    the lock when it is held (within its TTL), else ``None``: a record whose run is not that
    owner is in doubt (its run is gone, or lost its lock)."""
    found: list[Unfinished] = []
    for record in records:
        if record.get("status") not in UNFINISHED:
            continue
        intent = record.get("intent")
        intent = intent if isinstance(intent, Mapping) else {}
        pid = intent.get("pid")
        started = intent.get("startedAt")
        owner = intent.get("lockOwner")
        found.append(Unfinished(
            name=str(record.get("name")), status=str(record.get("status")),
            run_id=str(intent.get("runId")),
            host=intent.get("host") if isinstance(intent.get("host"), str) else None,
            pid=pid if is_int(pid) else None,
            started_at=started if isinstance(started, dt.datetime) else None,
            alive=live_owner is not None and owner == live_owner,
        ))
    return found


def in_doubt_error(unfinished: list[Unfinished]) -> MigrationInDoubtError:
    """``MIGRATION_IN_DOUBT`` naming the first unfinished record and listing all of them."""
    first = unfinished[0]
    more = f" (and {len(unfinished) - 1} more)" if len(unfinished) > 1 else ""
    if first.alive:
        state = "is still running under the lock its run holds"
        advice = "wait for that run to finish"
    else:
        state = "did not record whether it finished (that run is gone or lost its lock)"
        advice = (f"check its data, then record the outcome: migronaut resolve {first.name} "
                  "--applied (or --pending)")
    return MigrationInDoubtError(
        f"Migration in doubt: {first.describe()} and {state}{more}; migronaut never runs it "
        f"again on its own — {advice}",
        {**first.to_dict(), "inDoubt": [u.to_dict() for u in unfinished[:_LISTED]]},
    )
