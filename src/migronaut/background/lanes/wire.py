"""The lanes' two per-batch data commands, sent at the lowest client cost pymongo allows publicly.

A lane reads a batch and writes it back once per batch, so what the driver does per *document*
on those two commands is most of the engine's client CPU. Both are sent as the plain commands the
driver itself would send, through :meth:`~pymongo.database.Database.command`, whose reply is
decoded in one C call. Measured in a lane on the dev server (batches of 500 small documents,
thread CPU): the read ≈ 3.4 µs a document against ≈ 3.8 µs for ``list(find(...))`` (no
per-document cursor step) and ≈ 4.6 µs for ``find_raw_batches`` + ``decode_all`` (its reply is
re-framed in Python); the write ≈ 5 µs a document against ≈ 9 µs for ``bulk_write`` of
``UpdateOne`` requests (no request objects, no per-request validation — the statements come from
the stamped diff, which already guarantees an operator update).

What ``find`` gave that a plain command does not is kept: a batch larger than one reply (16 MiB)
is completed by ``getMore`` in the same session (a session of its own when the caller has none),
and a cursor left open by an error is killed.

What ``bulk_write`` gave that a plain command does not is kept:

* **Retry once** on a network error or a primary step-down, outside transactions (a retryable
  write's one retry). The server cannot deduplicate the replay (no transaction number), and it
  does not need to: every statement is guarded by version and revision, so a statement that
  already applied matches nothing the second time, and the caller classifies unmatched ones by
  re-reading them (a write whose reply was lost is counted once, as landed). The caller may ask
  to ``confirm`` something first — a lane confirms it still holds its lease, so a retry never
  lands after another lane took the partition over.
* **Size limits.** A command larger than the server's BSON limit is split in halves until each
  part fits, as ``bulk_write`` splits batches (per-statement error indexes are kept).
* **Write concern** of the collection, omitted inside a transaction (the transaction's applies),
  and a ``writeConcernError`` is raised as :class:`~pymongo.errors.WriteConcernError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from pymongo.client_session import ClientSession
    from pymongo.collection import Collection

__all__ = ["UpdateOutcome", "guarded_updates", "read_batch"]

_D = TypeVar("_D", bound=Mapping[str, Any])
_BY_ID: Final = (("_id", 1),)
def read_batch(
    coll: Collection[_D],
    query: Mapping[str, Any],
    limit: int,
    *,
    hint: str | Sequence[tuple[str, Any]] | None = None,
    sort: Sequence[tuple[str, int]] | None = _BY_ID,
    bounds: tuple[Sequence[tuple[str, Any]], Sequence[tuple[str, Any]]] | None = None,
    session: ClientSession | None = None,
    max_time_ms: int | None = None,
    first_batch: int | None = None,
) -> list[_D]:
    """``limit`` documents matching ``query`` in ``sort`` order, decoded with ``coll``'s codec.

    ``sort`` is ascending ``_id`` unless given, ``None`` reads in natural order; ``bounds`` are
    the hinted index's ``min``/``max`` key tuples (key-range partitions on sharded collections).
    One round trip when the batch fits the server's reply (16 MiB) and ``first_batch`` (default:
    ``limit``); ``getMore`` s in the same session otherwise (a session of its own when none is
    given: a cursor belongs to one).
    """
    command: dict[str, Any] = {"find": coll.name, "filter": query, "limit": limit,
                               "batchSize": first_batch or limit}
    if sort is not None:
        command["sort"] = dict(sort)
    if hint is not None:
        command["hint"] = hint if isinstance(hint, str) else dict(hint)
    if bounds is not None:
        command["min"], command["max"] = dict(bounds[0]), dict(bounds[1])
    if max_time_ms is not None:
        command["maxTimeMS"] = max_time_ms
    if session is not None:
        return _find(coll, command, limit, session)
    with coll.database.client.start_session(causal_consistency=False) as own:
        return _find(coll, command, limit, own)


def _find(
    coll: Collection[_D], command: dict[str, Any], limit: int, session: ClientSession
) -> list[_D]:
    db, options = coll.database, coll.codec_options
    cursor = db.command(command, session=session, codec_options=options)["cursor"]
    out: list[_D] = list(cursor["firstBatch"])
    cursor_id = cursor["id"]
    try:
        while cursor_id and len(out) < limit:  # the first reply was cut at 16 MiB
            cursor = db.command(
                {"getMore": cursor_id, "collection": coll.name, "batchSize": limit - len(out)},
                session=session, codec_options=options)["cursor"]
            out.extend(cursor["nextBatch"])
            cursor_id = cursor["id"]
    finally:
        if cursor_id:  # an error, or the limit reached on an open cursor: close it
            _kill(coll, cursor_id, session)
    return out


def _kill(coll: Collection[Any], cursor_id: Any, session: ClientSession) -> None:
    from pymongo.errors import PyMongoError

    try:
        coll.database.command({"killCursors": coll.name, "cursors": [cursor_id]},
                              session=session)
    except PyMongoError:
        pass  # the server closes an idle cursor by itself (10 minutes)


@dataclass
class UpdateOutcome:
    """What an ``update`` command did: statements matched, and per-statement write errors.

    Each write error is the server's ``{index, code, errmsg}``, ``index`` into the statements given.
    """

    matched: int = 0
    write_errors: list[dict[str, Any]] = field(default_factory=list)


def guarded_updates(
    coll: Collection[Any],
    statements: Sequence[Mapping[str, Any]],
    *,
    session: ClientSession | None = None,
    confirm: Callable[[], None] | None = None,
) -> UpdateOutcome:
    """Send ``statements`` (``{q, u}`` update statements) as one unordered ``update`` command.

    ``confirm`` runs before the one retry (it raises to prevent it).
    """
    from pymongo.errors import AutoReconnect, ServerSelectionTimeoutError

    in_transaction = session is not None and session.in_transaction
    try:
        return _send(coll, statements, session, in_transaction)
    except ServerSelectionTimeoutError:
        raise  # no server to retry on: waiting again would only double the wait
    except AutoReconnect:  # network error, not-primary, step-down
        if in_transaction:
            raise
        if confirm is not None:
            confirm()
        return _send(coll, statements, session, in_transaction)


def _send(
    coll: Collection[Any],
    statements: Sequence[Mapping[str, Any]],
    session: ClientSession | None,
    in_transaction: bool,
) -> UpdateOutcome:
    from pymongo.errors import DocumentTooLarge, WriteConcernError

    command: dict[str, Any] = {"update": coll.name, "updates": statements, "ordered": False}
    concern = coll.write_concern
    if not in_transaction and not concern.is_server_default:
        command["writeConcern"] = concern.document
    try:
        reply = coll.database.command(command, session=session, codec_options=coll.codec_options)
    except DocumentTooLarge:
        if len(statements) < 2:
            raise
        middle = len(statements) // 2
        first = _send(coll, statements[:middle], session, in_transaction)
        second = _send(coll, statements[middle:], session, in_transaction)
        first.matched += second.matched
        first.write_errors.extend(
            {**error, "index": int(error["index"]) + middle} for error in second.write_errors)
        return first
    problem = reply.get("writeConcernError")
    if problem:
        raise WriteConcernError(str(problem.get("errmsg", "write concern error")),
                                problem.get("code"), dict(problem))
    return UpdateOutcome(int(reply.get("n", 0)), list(reply.get("writeErrors", ())))
