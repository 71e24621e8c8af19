"""Carrying out one planned step against the server (collections.md §2.5).

Invariants: a batched ``createIndexes`` is all-or-nothing for its rows; a rebuild records the
full spec of what it drops before its first drop (:mod:`.converge_rebuilds`: the next converge
restores it, whatever happens to this process), drops and, when a drop or a create fails,
restores every dropped index it did not re-create — unless the connection was in trouble, when
the server may still be building and nothing is touched (``uncertain``); a
unique conversion that meets duplicates goes back to exactly the old index and names the
duplicate groups the server reported (``violations``); "index not found" on a drop is success;
a drop refused because the index backs a shard key turns the row into ``keep``. Every failure
leaves as :class:`StepFailed` carrying the context of ``ConvergeFailedError`` (``phase: apply``),
which the caller completes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pymongo.database import Database
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    NetworkTimeout,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from migronaut._redact import redact
from migronaut.declared.plan import (
    CollModIndex,
    CollModValidator,
    ConvertUnique,
    CreateCollection,
    CreateIndexes,
    CreateSearchIndexes,
    DropIndex,
    DropSearchIndex,
    Rebuild,
    Step,
    UpdateSearchIndex,
)
from migronaut.errors import describe_exception, server_message


class RebuildJournal(Protocol):
    """Where a rebuild records what it drops before dropping it
    (:class:`.converge_rebuilds.RebuildJournal`; a protocol so this module does not import
    the one that imports it)."""

    def begin(self, collection: str, step: Rebuild,
              drops: Sequence[Mapping[str, Any]]) -> Any: ...

    def settle(self, entry_id: Any) -> bool: ...

__all__ = ["CONNECTION_TROUBLE_CODES", "StepFailed", "StepOutcome", "apply_step",
           "create_index_specs", "describe", "explain"]

#: Server codes that mean "the connection, not the command, failed" (nothing restored).
CONNECTION_TROUBLE_CODES = frozenset({50, 89, 91, 189, 10107, 11600, 11602, 13435})
_NAMESPACE_EXISTS = 48
_INDEX_NOT_FOUND = 27
_HINTS = {
    11000: "existing documents have duplicate values for the unique index; deduplicate them "
           "in a migration first",
    13: "not authorized; collMod and creating a collection with a validator need dbAdmin",
    85: "an equivalent index exists under another name; declare it under that name or "
        "converge with prune",
    86: "an index with this name exists with a different key or options",
    359: "existing documents have duplicates for this key; the index was left unchanged",
}
_VERBS = {"create": "create", "modify": "modify", "recreate": "rebuild", "drop": "drop"}


class StepFailed(Exception):
    """A step failed; ``context`` is the ``ConvergeFailedError`` context (without the
    collection-level keys the caller adds) and ``message`` the reference's wording."""

    def __init__(self, message: str, context: dict[str, Any], cause: BaseException) -> None:
        super().__init__(message)
        self.message = message
        self.context = context
        self.cause = cause


@dataclass
class StepOutcome:
    """What happened besides success: rows that became ``keep`` (shard-key drops)."""

    kept: list[tuple[str, str]] = field(default_factory=list)


def connection_trouble(error: BaseException) -> bool:
    if isinstance(error, (ConnectionFailure, AutoReconnect, NetworkTimeout,
                          ServerSelectionTimeoutError)):
        return True
    return isinstance(error, OperationFailure) and error.code in CONNECTION_TROUBLE_CODES


def describe(step: Step) -> tuple[str, str]:
    """``(target, label)`` for messages: ``index "x"``, ``indexes "a", "b"``, …"""
    if isinstance(step, CreateCollection):
        return "collection", "the collection"
    if isinstance(step, CollModValidator):
        return "validator", "the validator"
    if isinstance(step, (CreateSearchIndexes, UpdateSearchIndex, DropSearchIndex)):
        names = [name for _, name in step.rows]
        return "searchIndex", ", ".join(f'search index "{name}"' for name in names)
    names = [name for _, name in step.rows]
    label = (f'index "{names[0]}"' if len(names) == 1
             else "indexes " + ", ".join(f'"{name}"' for name in names))
    return "index", label


def _spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in spec.items()
            if key not in ("v", "ns", "background", "clustered")}


def create_index_specs(db: Database[Any], collection: str, specs: Any) -> None:
    """One ``createIndexes`` for ``specs`` (listed or declared), minus what is never sent."""
    db.command({"createIndexes": collection, "indexes": [_spec(spec) for spec in specs]})


def _drop_index(db: Database[Any], collection: str, name: str) -> None:
    try:
        db.command({"dropIndexes": collection, "index": name})
    except OperationFailure as error:
        if error.code != _INDEX_NOT_FOUND:
            raise


def _coll_mod_index(db: Database[Any], collection: str, name: str,
                    changes: Mapping[str, Any]) -> None:
    db.command({"collMod": collection, "index": {"name": name, **changes}})


def _rebuild(db: Database[Any], collection: str, step: Rebuild,
             journal: RebuildJournal) -> None:
    """Records the indexes it drops (:mod:`.converge_rebuilds`), drops, then creates; a failure
    raises :class:`_Restored` with the restore facts for the error."""
    drops = [_spec(spec) for spec in step.drops]
    entry = journal.begin(collection, step, drops)
    dropped: list[str] = []
    for spec in drops:
        try:
            _drop_index(db, collection, str(spec["name"]))
        except PyMongoError as error:
            if connection_trouble(error):  # the drop may have happened
                raise _Restored(error, {"restored": False, "uncertain": True,
                                        "dropped": [*dropped, str(spec["name"])]}) from error
            if not dropped:  # nothing dropped, nothing to restore
                journal.settle(entry)
                raise
            _restore(db, collection, drops, dropped, [], error, journal, entry)
        dropped.append(str(spec["name"]))
    created: list[str] = []
    for new in step.creates:
        try:
            create_index_specs(db, collection, [new])
        except PyMongoError as error:
            if connection_trouble(error):
                raise _Restored(error, {"restored": False, "uncertain": True,
                                        "dropped": dropped}) from error
            _restore(db, collection, drops, dropped, created, error, journal, entry)
        created.append(str(new["name"]))
    journal.settle(entry)


def _restore(db: Database[Any], collection: str, drops: list[dict[str, Any]],
             dropped: list[str], created: list[str], error: PyMongoError,
             journal: RebuildJournal, entry: Any) -> None:
    """Put back every dropped index not re-created, then raise :class:`_Restored`; the
    journal entry is settled only when all of them are back."""
    problems, lost = [], []
    for old in drops:
        if old["name"] not in dropped or old["name"] in created:
            continue
        try:
            create_index_specs(db, collection, [old])
        except PyMongoError as again:
            problems.append(f"{old['name']}: {_cause(again)}")
            lost.append(str(old["name"]))
    facts: dict[str, Any] = {"restored": not problems, "dropped": dropped}
    if problems:
        facts["restoreError"] = "; ".join(problems)
    else:
        journal.settle(entry)
    raise _Restored(error, facts, lost) from error


class _Restored(Exception):
    """A rebuild's create failed: the restore facts of the error, and the dropped indexes that
    could not be put back (``lost``)."""

    def __init__(self, cause: PyMongoError, facts: dict[str, Any],
                 lost: list[str] | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.facts = facts
        self.lost = lost or []


def _convert_unique(db: Database[Any], collection: str, step: ConvertUnique) -> None:
    _coll_mod_index(db, collection, step.name, {"prepareUnique": True})
    try:
        _coll_mod_index(db, collection, step.name, {"unique": True})
    except PyMongoError:
        try:
            _coll_mod_index(db, collection, step.name, {"prepareUnique": False})
        except PyMongoError:
            pass  # best effort: the original error is what matters
        raise
    if step.changes:
        _coll_mod_index(db, collection, step.name, step.changes)


def _create_collection(db: Database[Any], collection: str, step: CreateCollection) -> None:
    try:
        db.command({"create": collection, **step.options})
    except OperationFailure as error:
        if error.code != _NAMESPACE_EXISTS:
            raise
        if step.options:  # created meanwhile: apply the validator in place
            db.command({"collMod": collection, **step.options})


def _update_search_index(db: Database[Any], collection: str, step: UpdateSearchIndex) -> None:
    """Sent without ``type``; a self-managed mongot that wants ``mappings`` for a vector index
    gets one retry with ``type`` — whose "unknown field" (40415) means the first error stands."""
    command = {"updateSearchIndex": collection, "name": step.name,
               "definition": dict(step.definition)}
    try:
        db.command(command)
    except OperationFailure as error:
        if step.type != "vectorSearch" or not re.search(r"mappings.*required", str(error),
                                                        re.IGNORECASE):
            raise
        try:
            db.command({**command, "type": step.type})
        except OperationFailure as retry:
            if retry.code == 40415:
                raise error from None
            raise


def _drop_search_index(db: Database[Any], collection: str, name: str) -> None:
    """Already gone (namespace or index not found) is success."""
    try:
        db.command({"dropSearchIndex": collection, "name": name})
    except OperationFailure as error:
        if error.code in (26, 27) or re.search(r"not found|does not exist", str(error),
                                               re.IGNORECASE):
            return
        raise


def _run(db: Database[Any], collection: str, step: Step, outcome: StepOutcome,
         journal: RebuildJournal) -> None:
    if isinstance(step, CreateCollection):
        _create_collection(db, collection, step)
    elif isinstance(step, CollModValidator):
        db.command({"collMod": collection, **step.fields})
    elif isinstance(step, CreateIndexes):
        create_index_specs(db, collection, step.specs)
    elif isinstance(step, CollModIndex):
        _coll_mod_index(db, collection, step.name, step.changes)
    elif isinstance(step, ConvertUnique):
        _convert_unique(db, collection, step)
    elif isinstance(step, Rebuild):
        _rebuild(db, collection, step, journal)
    elif isinstance(step, DropIndex):
        try:
            _drop_index(db, collection, step.name)
        except OperationFailure as error:
            if "shard key" not in str(error):
                raise
            outcome.kept.extend(step.rows)
    elif isinstance(step, CreateSearchIndexes):
        db.command({"createSearchIndexes": collection, "indexes": [
            dict(index) for index in step.indexes]})
    elif isinstance(step, UpdateSearchIndex):
        _update_search_index(db, collection, step)
    elif isinstance(step, DropSearchIndex):
        _drop_search_index(db, collection, step.name)


def apply_step(db: Database[Any], collection: str, step: Step, action: str,
               journal: RebuildJournal) -> StepOutcome:
    """Run ``step`` on ``collection``; ``action`` is its first row's (for the verb). A rebuild
    records what it drops in ``journal`` first."""
    outcome = StepOutcome()
    try:
        _run(db, collection, step, outcome, journal)
    except (PyMongoError, _Restored) as caught:
        facts: dict[str, Any] = {}
        error: BaseException = caught
        lost: list[str] = []
        if isinstance(caught, _Restored):
            facts, error, lost = caught.facts, caught.cause, caught.lost
        raise _failure(collection, step, action, error, facts, lost) from error
    return outcome


def _failure(collection: str, step: Step, action: str, error: BaseException,
             facts: dict[str, Any], lost: list[str] | None = None) -> StepFailed:
    target, label = describe(step)
    cause, code, hint = explain(error, search=target == "searchIndex")
    message = f"Could not {_VERBS.get(action, action)} {label} on {collection}: {cause}"
    if hint:
        message += f" — {hint}"
    if facts.get("uncertain"):
        dropped = ", ".join(f'"{name}"' for name in facts.get("dropped") or ())
        message += (f" — the connection failed mid-build, after dropping {dropped}; nothing was "
                    "restored (the server may still be building): converge again once it "
                    "answers — it restores what the rebuild dropped unless the new index was "
                    "built")
    elif "restored" in facts:
        missing = ", ".join(f'"{name}"' for name in lost or ())
        message += (" — the dropped index was restored" if facts["restored"]
                    else f" — restoring the dropped index failed ({facts.get('restoreError')}):"
                    f" {collection} has no index {missing} now; fix the cause and converge "
                    "again, or create it by hand")
    context: dict[str, Any] = {"phase": "apply", "collection": collection, "target": target,
                               "name": step.rows[0][1] if step.rows else collection,
                               "action": action, "cause": cause, **facts}
    if code is not None:
        context["mongoCode"] = code
    violations, truncated = _violations(error)
    if violations:
        context["violations"] = violations
    if truncated:
        context["violationsTruncated"] = True
    if hint:
        context["hint"] = hint
    return StepFailed(message, context, error)


def explain(error: BaseException, *, search: bool = False) -> tuple[str, int | None,
                                                                    str | None]:
    """``(cause, mongoCode, hint)`` of a failed command, for an error's message and context."""
    code = error.code if isinstance(error, OperationFailure) else None
    if search:
        from migronaut.commands.converge_search import search_hint

        hint = search_hint(error)
    else:
        hint = _HINTS.get(code) if code is not None else None
    return _cause(error), code, hint


def _cause(error: BaseException) -> str:
    """``context.cause``: a server error by its own message (pymongo's ``full error`` suffix
    would repeat the reply — every duplicate id of a 359 — inside the error's message)."""
    if isinstance(error, OperationFailure):
        return redact(f"{type(error).__name__}: {server_message(error)}")
    return redact(describe_exception(error))


#: How much of a 359's ``violations`` an error carries: enough to find the duplicates, not a
#: collection's worth of ``_id``s in a JSON error document (``violationsTruncated`` says so).
MAX_VIOLATION_GROUPS = 50
MAX_VIOLATION_IDS = 20


def _violations(error: BaseException) -> tuple[list[dict[str, Any]], bool]:
    """The duplicate groups a unique conversion met (359's ``violations``: ``[{ids}]``), so the
    error names the documents to deduplicate — at most :data:`MAX_VIOLATION_GROUPS` groups of
    :data:`MAX_VIOLATION_IDS` ids, and whether more were cut."""
    details = error.details if isinstance(error, OperationFailure) else None
    found = (details or {}).get("violations")
    if not isinstance(found, list):
        return [], False
    groups = [list(group["ids"]) for group in found
              if isinstance(group, Mapping) and isinstance(group.get("ids"), list)]
    truncated = len(groups) > MAX_VIOLATION_GROUPS or any(
        len(ids) > MAX_VIOLATION_IDS for ids in groups)
    return [{"ids": ids[:MAX_VIOLATION_IDS]} for ids in groups[:MAX_VIOLATION_GROUPS]], truncated
