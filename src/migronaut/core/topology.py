"""What kind of deployment the server is (from ``hello``) and whether it runs transactions.

Invariant: a missing replica-set name alone never decides that transactions are unavailable —
the dev server reports none yet runs them — so a server that is neither a replica-set member nor
a mongos is asked directly, with a read inside a transaction that is never committed (nothing is
written). Only a refusal with code 20 (``IllegalOperation``: "Transaction numbers are only allowed
on a replica set member or mongos") means "a standalone".
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from pymongo import MongoClient
    from pymongo.collection import Collection

__all__ = ["Topology", "is_mongos", "read_topology", "refuses_transactions"]

#: Server replies that mean "this deployment cannot run transactions" (a standalone mongod).
_NO_TRANSACTION_CODES = frozenset({20})
_NO_TRANSACTION_TEXT = ("Transaction numbers are only allowed", "transactions are not supported")


def refuses_transactions(error: BaseException) -> bool:
    """Whether ``error`` (or an error it wraps) is a server refusing transactions altogether."""
    from pymongo.errors import OperationFailure

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OperationFailure) and seen.code in _NO_TRANSACTION_CODES:
            return True
        if any(text.lower() in str(seen).lower() for text in _NO_TRANSACTION_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True)
class Topology:
    """``transactions`` is ``None`` when the probe failed for another reason than a refusal."""

    kind: Literal["replica-set", "sharded", "standalone"]
    set_name: str | None
    transactions: bool | None
    #: The server's clock (naive UTC) from ``hello``, when it reports one.
    server_time: dt.datetime | None = None
    probe_error: str | None = None


def _answers_as_mongos(hello: Any) -> bool:
    return bool(hello.get("msg") == "isdbgrid")


def is_mongos(client: MongoClient[dict[str, Any]]) -> bool:
    """Whether ``client`` talks to a mongos.

    The driver's own view of the servers it is connected to answers without a round trip (its
    monitor read their ``hello``); before it knows any, a ``hello`` is sent (a failing one
    raises the driver's error).
    """
    from pymongo.server_type import SERVER_TYPE

    known = client.topology_description.known_servers
    if known:
        return all(server.server_type == SERVER_TYPE.Mongos for server in known)
    return _answers_as_mongos(client.admin.command("hello"))


def read_topology(
    client: MongoClient[dict[str, Any]], probe: Collection[dict[str, Any]]
) -> Topology:
    """``hello``, then (for a server that is neither) a transaction probe reading ``probe``.

    A failing ``hello`` raises the driver's error (the caller decides what "unknown" means).
    """
    from pymongo.errors import PyMongoError

    from migronaut.errors import describe_exception

    hello = client.admin.command("hello")
    server_time = hello.get("localTime")
    if isinstance(server_time, dt.datetime) and server_time.tzinfo is not None:
        server_time = server_time.astimezone(dt.UTC).replace(tzinfo=None)
    if not isinstance(server_time, dt.datetime):
        server_time = None
    if hello.get("setName"):
        return Topology("replica-set", str(hello["setName"]), True, server_time)
    if _answers_as_mongos(hello):
        return Topology("sharded", None, True, server_time)
    try:
        with client.start_session() as session, session.start_transaction():
            probe.find_one({"_id": "__migronaut_probe__"}, {"_id": 1}, session=session)
    except PyMongoError as error:
        if refuses_transactions(error):
            return Topology("standalone", None, False, server_time)
        return Topology("standalone", None, None, server_time, describe_exception(error))
    return Topology("standalone", None, True, server_time)
