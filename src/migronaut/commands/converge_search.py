"""Is Atlas Search available, and what search indexes does a collection have
(reference collections §7.4, §7.6 list)?

Invariants: the probe runs once per run and only when some definition declares
``searchIndexes``; an error recognised as "Search unavailable" makes Search unavailable (and is
never a failure), any other listing error is a ``ConvergeFailedError`` in the phase it happened,
with the server's code and a hint; a missing collection has no search indexes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo.database import Database
from pymongo.errors import OperationFailure, PyMongoError

from migronaut.declared.definition import CollectionDefinition
from migronaut.declared.search_plan import SearchAvailability
from migronaut.errors import ConvergeFailedError, describe_exception

__all__ = ["UNAVAILABLE_HINT", "is_search_unavailable", "list_search_indexes", "probe_search",
           "search_hint"]

_UNAVAILABLE_CODES = frozenset({31082, 115, 6047401, 59, 40324})
_UNAVAILABLE_TEXT = re.compile(
    r"SearchNotEnabled|requires additional configuration"
    r"|only (?:allowed|supported) (?:on|with) (?:MongoDB )?Atlas"
    r"|unrecognized pipeline stage name:? '?\$listSearchIndexes"
    r"|no such (?:command|cmd):? '?(?:createSearchIndexes|updateSearchIndex|dropSearchIndex)",
    re.IGNORECASE)
_NO_OPTION = 72
UNAVAILABLE_HINT = (
    "Atlas Search needs Atlas, an Atlas CLI local deployment (the mongodb/mongodb-atlas-local "
    "image) or MongoDB 8.3+ with mongot — or set on_search_unavailable = \"skip\" to converge "
    "everything else")
_VECTOR_UPDATE_HINT = (
    "this server cannot update a vector search index in place: declare it under a new name, "
    "converge, remove the old declaration, then converge with prune")


def is_search_unavailable(error: BaseException) -> bool:
    """The server has no Atlas Search (§7.4's recognition list)."""
    if isinstance(error, OperationFailure):
        if error.code in _UNAVAILABLE_CODES:
            return True
        details = error.details or {}
        if details.get("codeName") == "SearchNotEnabled":
            return True
    return bool(_UNAVAILABLE_TEXT.search(str(error)))


def search_hint(error: BaseException) -> str | None:
    """The advice for a failed search-index command or listing (§7.6)."""
    text = str(error)
    code = error.code if isinstance(error, OperationFailure) else None
    if is_search_unavailable(error):
        return UNAVAILABLE_HINT
    if re.search(r"mappings.*required", text, re.IGNORECASE):
        return _VECTOR_UPDATE_HINT
    if code == 13:
        return "the user needs the search-index actions (readWrite on Atlas)"
    if re.search(r"limit|maximum|quota|exceed", text, re.IGNORECASE) and "index" in text.lower():
        return ("the cluster tier's search index limit is reached (Free 3, Flex 10, search and "
                "vector together)")
    if code == 68 or re.search(r"already exists|duplicate", text, re.IGNORECASE):
        return "the index exists or is still being deleted: retry shortly"
    return None


def _listed(db: Database[Any], name: str) -> list[Mapping[str, Any]]:
    return list(db[name].aggregate([{"$listSearchIndexes": {}}]))


def list_search_indexes(db: Database[Any], name: str, *, phase: str = "plan",
                        reason: str | None = None) -> list[Mapping[str, Any]]:
    """``$listSearchIndexes`` on ``name`` (``[]`` when it is missing); any failure is a
    ``ConvergeFailedError`` in ``phase``."""
    try:
        return _listed(db, name)
    except OperationFailure as error:
        if error.code == 26:
            return []
        raise _list_failed(name, error, phase, reason) from error
    except PyMongoError as error:
        raise _list_failed(name, error, phase, reason) from error


def _list_failed(name: str, error: PyMongoError, phase: str, reason: str | None
                 ) -> ConvergeFailedError:
    cause = describe_exception(error)
    context: dict[str, Any] = {"phase": phase, "collection": name, "cause": cause}
    if reason:
        context["reason"] = reason
    if isinstance(error, OperationFailure) and error.code is not None:
        context["mongoCode"] = error.code
    hint = search_hint(error)
    if hint:
        context["hint"] = hint
    return ConvergeFailedError(f"Could not list the search indexes of {name}: {cause}",
                               context)


def _probe_collection(db: Database[Any], wanted: Sequence[CollectionDefinition]) -> str | None:
    """The first existing regular declaring collection, else the first missing one."""
    names = [d.name for d in wanted]
    infos = {info["name"]: info for info in db.list_collections(filter={"name": {"$in": names}})}
    regular = [n for n in names if n in infos and (infos[n].get("type") or "collection")
               == "collection"]
    missing = [n for n in names if n not in infos]
    first = regular or missing
    return first[0] if first else None


def probe_search(db: Database[Any], definitions: Sequence[CollectionDefinition],
                 version: tuple[int, int, int] | None, on_unavailable: str,
                 ) -> SearchAvailability | None:
    """Is Search available (§7.4)? ``None`` when nothing declares search indexes (or only
    views do: no probe)."""
    wanted = [d for d in definitions if d.search_indexes is not None]
    if not wanted:
        return None

    def verdict(available: bool, evidence: str, reason: str | None = None
                ) -> SearchAvailability:
        return SearchAvailability(available, on_unavailable, evidence, reason)

    if version is not None and version < (6, 0, 0):
        return verdict(False, "version")
    name = _probe_collection(db, wanted)
    if name is None:
        return None
    try:
        listed = _listed(db, name)
    except OperationFailure as error:
        if is_search_unavailable(error):
            return verdict(False, "error", str(error.details.get("errmsg") if error.details
                                               else error))
        if error.code != 26:
            raise _list_failed(name, error, "plan", None) from error
        listed = []
    except PyMongoError as error:
        raise _list_failed(name, error, "plan", None) from error
    if listed or (version is not None and version >= (7, 2, 1)):
        return verdict(True, "listed")
    try:
        answer = db.client.admin.command(
            {"getParameter": 1, "searchIndexManagementHostAndPort": 1})
    except OperationFailure as error:
        if error.code == _NO_OPTION or "no option found" in str(error):
            return verdict(False, "parameter")
        return verdict(True, "assumed")
    except PyMongoError:
        return verdict(True, "assumed")
    host = answer.get("searchIndexManagementHostAndPort")
    if isinstance(host, str) and host:
        return verdict(True, "parameter")
    if host is None:
        return verdict(True, "assumed")
    return verdict(False, "parameter")
