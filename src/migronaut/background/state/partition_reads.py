"""The read side of the partitions: counts by status, live leases, summaries, failed ids.

Every count a coordinator step, a status view or ``background status`` needs of the partitions is
one ``aggregate`` (or one ``find`` counted here), and a lease is judged live by its own ``ttlMs``
in server time (``$$NOW``), never the reader's clock. Nothing here writes: the writes are
:class:`~migronaut.background.state.partitions.PartitionStore`'s, which builds on this.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut.background.state.fields import COUNTERS

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = ["LEASE_AGE", "OPEN", "PartitionReads"]

#: Partition statuses a lane may still work on (and fail).
OPEN = ["pending", "running"]
#: ``[renewedAt, now − the lease's own ttlMs]``: compared ``$gte`` a lease is live, ``$lt`` stale.
LEASE_AGE = ["$lease.renewedAt", {"$subtract": ["$$NOW", "$lease.ttlMs"]}]
#: A live lease: renewed within its own TTL, judged in server time.
_LIVE_LEASE: dict[str, Any] = {"lease": {"$exists": True}, "$expr": {"$gte": LEASE_AGE}}
#: Partitions by status, with how many of each hold a lease (expired or not).
_BY_STATUS: dict[str, Any] = {"$group": {
    "_id": "$status", "n": {"$sum": 1},
    "leased": {"$sum": {"$cond": [{"$ifNull": ["$lease", False]}, 1, 0]}},
}}
#: :data:`_BY_STATUS`, with how many of each hold a live lease.
_BY_STATUS_LIVE: dict[str, Any] = {"$group": {**_BY_STATUS["$group"], "live": {"$sum": {"$cond": [
    {"$ifNull": ["$lease", False]}, {"$cond": [{"$gte": LEASE_AGE}, 1, 0]}, 0]}}}}
_STATUSES = ("pending", "running", "done", "failed", "cancelled", "superseded")


def _status_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """``{status: n, …, leased: n}`` from :data:`_BY_STATUS` rows (every status present)."""
    counts = dict.fromkeys(_STATUSES, 0)
    leased = 0
    for row in rows:
        counts[row["_id"]] = row["n"]
        leased += row["leased"]
    counts["leased"] = leased
    return counts


class PartitionReads:
    """The read-side aggregates over the partition collection of one database."""

    partitions: Collection[dict[str, Any]]

    def count_by_status(self, name: str, generation: int, token: str) -> dict[str, int]:
        pipeline: list[dict[str, Any]] = [
            {"$match": {"background": name, "generation": generation, "plan": token}},
            _BY_STATUS,
        ]
        return _status_counts(self.partitions.aggregate(pipeline))

    def open_counts(self, name: str, generation: int, token: str) -> tuple[dict[str, int], int]:
        """:meth:`count_by_status`, and how many *open* partitions of the plan hold a live
        lease — whether lanes are at work on it, in one ``aggregate``."""
        rows = list(self.partitions.aggregate([
            {"$match": {"background": name, "generation": generation, "plan": token}},
            _BY_STATUS_LIVE,
        ]))
        return _status_counts(rows), sum(int(row.get("live") or 0) for row in rows
                                         if row["_id"] in OPEN)

    @staticmethod
    def counted(partitions: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """:meth:`count_by_status` of partitions already read (the same statuses and
        ``leased``: a lease that is set, expired or not)."""
        rows: dict[Any, dict[str, Any]] = {}
        for partition in partitions:
            row = rows.setdefault(partition.get("status"), {"_id": partition.get("status"),
                                                            "n": 0, "leased": 0})
            row["n"] += 1
            if partition.get("lease") is not None:
                row["leased"] += 1
        return _status_counts(rows.values())

    def generation_partitions(self, name: str, generation: int) -> list[dict[str, Any]]:
        """Every partition of ``generation`` (all plans), as stored."""
        return list(self.partitions.find({"background": name, "generation": generation}))

    def counts_and_live_leases(
        self, name: str, generation: int, token: str
    ) -> tuple[dict[str, int], int]:
        """:meth:`count_by_status` and :meth:`live_leases` in one ``aggregate`` (a status view
        needs both: one round trip instead of two, the same two matches under a ``$facet``)."""
        pipeline: list[dict[str, Any]] = [
            {"$match": {"background": name}},
            {"$facet": {
                "counts": [{"$match": {"generation": generation, "plan": token}}, _BY_STATUS],
                "live": [{"$match": _LIVE_LEASE}, {"$count": "n"}],
            }},
        ]
        row = next(iter(self.partitions.aggregate(pipeline)), None) or {}
        live = row.get("live") or [{}]
        return _status_counts(row.get("counts") or []), int(live[0].get("n", 0))

    def summary(self, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Per migration of ``names``, one row per ``(generation, plan, status)`` of its
        partitions: ``n``, ``leased``, ``live`` (leases renewed within their own TTL, server
        time) and the summed counters — what :meth:`count_by_status`, :meth:`live_leases` and
        the live totals read, for every migration in one aggregate (``background status``)."""
        group: dict[str, Any] = {
            "_id": {"background": "$background", "generation": "$generation", "plan": "$plan",
                    "status": "$status"},
            "n": {"$sum": 1},
            "leased": _BY_STATUS["$group"]["leased"],
            "live": {"$sum": {"$cond": [{"$ifNull": ["$lease", False]},
                                        {"$cond": [{"$gte": LEASE_AGE}, 1, 0]}, 0]}},
        }
        for key in COUNTERS:
            group[key] = {"$sum": {"$ifNull": [f"$counters.{key}", 0]}}
        out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for row in self.partitions.aggregate([
            {"$match": {"background": {"$in": list(names)}}}, {"$group": group},
        ]):
            ident = row.pop("_id")
            out.setdefault(ident["background"], []).append({**ident, **row})
        return out

    @staticmethod
    def summary_counts(rows: Iterable[Mapping[str, Any]], generation: int,
                       token: str) -> dict[str, int]:
        """:meth:`count_by_status` from one migration's :meth:`summary` rows."""
        return _status_counts(
            {"_id": row["status"], "n": row["n"], "leased": row["leased"]} for row in rows
            if row.get("generation") == generation and row.get("plan") == token)

    def list_partitions(self, name: str) -> list[dict[str, Any]]:
        cursor = self.partitions.find({"background": name})
        return list(cursor.sort([("generation", -1), ("seq", 1)]))

    def live_leases(self, name: str) -> int:
        """Leases renewed within their own TTL, judged in server time."""
        return self.partitions.count_documents({"background": name, **_LIVE_LEASE})

    def count_bad_ids(self, name: str, generation: int, state_bad_ids: Sequence[Any]) -> int:
        """Distinct failed ``_id``s: the state's (earlier generations) plus this generation's."""
        pipeline: list[dict[str, Any]] = [
            {"$match": {"background": name, "generation": generation}},
            {"$unwind": "$badIds"},
            {"$group": {"_id": None, "ids": {"$addToSet": "$badIds"}}},
        ]
        ids: list[Any] = []
        for row in self.partitions.aggregate(pipeline):
            ids = row["ids"]
        seen = {_canonical(i) for i in state_bad_ids}
        seen.update(_canonical(i) for i in ids)
        return len(seen)


def _canonical(value: Any) -> str:
    """A type-tagged key, so a string never stands in for an ObjectId with the same hex."""
    return f"{type(value).__name__}:{value!r}"
