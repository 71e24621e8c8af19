"""The cluster-wide migration lock: one document ``{_id: 'migronaut_lock'}`` in the lock collection.

Invariant: at most one owner, judged in server time. Acquiring is one atomic upsert whose
pipeline replaces the document only when it is missing or, by the rule below and the server's
``$$NOW``, free; ownership is then confirmed by reading back our owner token *and* a private nonce.
Renewals and the release are scoped by owner + nonce, so a process that lost the lock can never
refresh or delete its successor's. A heartbeat thread renews every ``ttl/2``; when renewals keep
failing, a deadline declares the lock lost strictly before a peer could reclaim it.

One rule says whether a lock document is free, and every reader uses it (:func:`reclaimable`,
evaluated by the server both in the acquiring upsert and in :func:`read_lock_status`, which
``lock``, ``unlock``, ``audit`` and a refused run read through):

* a document is judged by the TTL its holder wrote (``ttlMs``), else by ours (holders before
  ``ttlMs`` existed): it expires ``ttl`` after ``lockedAt``, never earlier — a holder with a long
  TTL heartbeats at half of it, and a short-TTL peer must not take its lock meanwhile;
* a document we cannot read — ``lockedAt`` not a date, ``owner`` missing, ``ttlMs`` not a
  positive number — is held, never free, and never expires by itself: ``unlock`` removes it
  (:func:`lock_problems` names what is wrong). A ``lockedAt`` in the future holds the lock until
  that time has passed, and is reported too;
* a document with nothing but its ``_id`` holds nothing.

A forced ``unlock`` (or a reclaim) is noticed before the holder's next step, not at its next
heartbeat: the run calls :meth:`MigrationLock.confirm` before each migration and each changelog
write, which renews (and so confirms) the lock when the step just finished was slow or the last
renewal is older than a second — so a successor overlaps with at most the step in flight, while
quick migrations share one confirmation per second. Acquire, renewals and release are idempotent
and retried over transient network errors (:mod:`migronaut.core.retry`).
"""

from __future__ import annotations

import datetime as dt
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from migronaut._json import iso, naive_utc
from migronaut._redact import shown_value
from migronaut._values import is_int
from migronaut.core.results import LockInfo, LockProblem, LockState, LockStatus
from migronaut.core.retry import retry_transient
from migronaut.errors import LockAlreadyHeldError, LockReleaseFailedError, describe_exception

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = [
    "LOCK_ID",
    "MigrationLock",
    "force_release",
    "judge_lock",
    "lock_info",
    "lock_problems",
    "looks_alive",
    "pid_alive",
    "read_lock_status",
    "reclaimable",
]

LOCK_ID = "migronaut_lock"
#: The largest ``ttlMs`` we understand (2³¹−1 s): beyond it ``lockedAt − ttl`` leaves the dates
#: a server can compute with.
MAX_TTL_MS = (2**31 - 1) * 1000
#: How far ahead of the server clock a ``lockedAt`` may be before it is reported: a primary
#: whose clock runs a little ahead (after a failover) stamps fresh locks like that.
CLOCK_SKEW_MS = 5_000
_NUMBER_TYPES = ["int", "long", "double"]

#: :meth:`MigrationLock.confirm` renews when the last renewal is older than this…
CONFIRM_AFTER_S = 1.0
#: …or when the step since the previous confirmation took this long without a renewal (its
#: round trip is then at most a few per cent of the step).
SLOW_STEP_S = 0.1


def reclaimable(ttl_ms: int) -> dict[str, Any]:
    """The rule, as an aggregation expression over the lock document: true when a run may take
    the lock over. ``ttl_ms`` (ours) judges a document that carries no ``ttlMs``."""
    missing_ttl = {"$eq": [{"$type": "$ttlMs"}, "missing"]}
    readable = {"$and": [
        {"$eq": [{"$type": "$lockedAt"}, "date"]},
        {"$eq": [{"$type": "$owner"}, "string"]},
        {"$or": [missing_ttl, {"$and": [
            {"$in": [{"$type": "$ttlMs"}, _NUMBER_TYPES]},
            {"$gt": ["$ttlMs", 0]}, {"$lte": ["$ttlMs", MAX_TTL_MS]},
        ]}]},
    ]}
    ttl = {"$cond": [missing_ttl, ttl_ms, "$ttlMs"]}
    expired = {"$cond": [readable, {"$lt": ["$lockedAt", {"$subtract": ["$$NOW", ttl]}]}, False]}
    empty = {"$eq": [{"$size": {"$objectToArray": "$$ROOT"}}, 1]}
    return {"$or": [empty, expired]}


def _valid_ttl(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= MAX_TTL_MS)


def lock_problems(
    doc: Mapping[str, Any], now: dt.datetime | None = None
) -> tuple[LockProblem, ...]:
    """What migronaut cannot read in a lock document (the Python side of :func:`reclaimable`,
    plus a ``lockedAt`` in the future of ``now``, the server's clock)."""
    problems: list[LockProblem] = []
    locked_at = doc.get("lockedAt")
    if "lockedAt" not in doc:
        problems.append(LockProblem("lockedAt", "lockedAt is missing"))
    elif not isinstance(locked_at, dt.datetime):
        problems.append(LockProblem("lockedAt", f"lockedAt {shown_value(locked_at)} is not a date"))
    elif now is not None and _ahead_ms(locked_at, now) > CLOCK_SKEW_MS:
        problems.append(LockProblem(
            "lockedAt", f"lockedAt is in the future (server time): {iso(locked_at)} is after "
            f"{iso(now)}"))
    if "owner" not in doc:
        problems.append(LockProblem("owner", "owner is missing"))
    elif not isinstance(doc["owner"], str):
        problems.append(LockProblem("owner", f"owner {shown_value(doc['owner'])} is not a string"))
    if "ttlMs" in doc and not _valid_ttl(doc["ttlMs"]):
        problems.append(LockProblem(
            "ttlMs", f"ttlMs {shown_value(doc['ttlMs'])} is not a positive number of milliseconds"))
    return tuple(problems)


def _ahead_ms(locked_at: dt.datetime, now: dt.datetime) -> float:
    return (naive_utc(locked_at) - naive_utc(now)).total_seconds() * 1000


def lock_info(doc: Mapping[str, Any] | None) -> LockInfo | None:
    """The public view of a lock document (never its nonce); a field of the wrong type shows
    as unknown (``None``) — :func:`lock_problems` says what is wrong with it."""
    if not doc or set(doc) <= {"_id"}:
        return None
    pid = doc.get("pid")
    if isinstance(pid, float) and pid.is_integer():
        pid = int(pid)

    def text(key: str) -> str | None:
        value = doc.get(key)
        return value if isinstance(value, str) else None

    locked_at = doc.get("lockedAt")
    ttl = doc.get("ttlMs")
    return LockInfo(
        locked_at=locked_at if isinstance(locked_at, dt.datetime) else None,
        pid=pid if is_int(pid) else None,
        host=text("host"),
        executed_by=text("executedBy"),
        run_id=text("owner"),
        ttl_ms=int(ttl) if isinstance(ttl, (int, float)) and _valid_ttl(ttl) else None,
    )


def judge_lock(
    doc: Mapping[str, Any] | None, *, can_reclaim: bool, now: dt.datetime | None, ttl_ms: int
) -> LockStatus:
    """A lock document as :class:`LockStatus`; ``can_reclaim`` is :func:`reclaimable` as the
    server evaluated it on this very document."""
    holder = lock_info(doc)
    if doc is None or holder is None:
        return LockStatus("free", server_time=now)
    problems = lock_problems(doc, now)
    state: LockState = "invalid" if problems else "expired" if can_reclaim else "held"
    return LockStatus(state, holder, problems, ttl_ms=holder.ttl_ms or ttl_ms, server_time=now)


def _read(
    collection: Collection[dict[str, Any]], lock_id: str, ttl_ms: int
) -> tuple[dict[str, Any] | None, LockStatus]:
    """One read: the document, and the rule applied to it by the server, with its clock."""
    found = list(collection.aggregate([
        {"$match": {"_id": lock_id}},
        {"$replaceWith": {"doc": "$$ROOT", "now": "$$NOW", "reclaimable": reclaimable(ttl_ms)}},
    ]))
    if not found:
        return None, LockStatus("free")
    doc: dict[str, Any] = found[0]["doc"]
    return doc, judge_lock(doc, can_reclaim=bool(found[0]["reclaimable"]),
                           now=found[0]["now"], ttl_ms=ttl_ms)


def read_lock_status(
    collection: Collection[dict[str, Any]], *, ttl_ms: int, lock_id: str = LOCK_ID
) -> LockStatus:
    """The lock as every reader sees it (``ttl_ms``: ours, for a document without ``ttlMs``)."""
    return _read(collection, lock_id, ttl_ms)[1]


def looks_alive(status: LockStatus) -> str | None:
    """Why the holder of the lock looks alive (a forced ``unlock`` would let a second run in
    beside it), or ``None``: its heartbeat is younger than its TTL (server time), or it runs on
    this host under a pid that is still alive."""
    holder = status.holder
    if holder is None or status.state == "invalid":
        return None
    if status.state == "held":
        return "its heartbeat is younger than its TTL"
    if holder.host == socket.gethostname() and holder.pid is not None and pid_alive(holder.pid):
        return f"pid {holder.pid} is alive on this host"
    return None


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with that pid exists (unknown: assumed alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # it exists (owned by someone else), or we cannot tell: assume alive
    return True


def force_release(
    collection: Collection[dict[str, Any]], lock_id: str = LOCK_ID
) -> LockInfo | None:
    """Delete the lock whoever holds it, readable or not; returns the removed holder."""
    doc = collection.find_one_and_delete({"_id": lock_id})
    return lock_info(doc)


class MigrationLock:
    """One acquisition of the lock by one run: acquire, heartbeat, release.

    ``on_lost(reason)`` is called once, from the heartbeat thread, when the lock is lost;
    ``on_renew_failed(count, error)`` on every failed renewal that is still tolerated.
    """

    def __init__(
        self,
        collection: Collection[dict[str, Any]],
        *,
        owner: str,
        ttl_ms: int,
        executed_by: str,
        lock_id: str = LOCK_ID,
        on_lost: Callable[[str], None] | None = None,
        on_renew_failed: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        self.collection = collection
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.lock_id = lock_id
        self.executed_by = executed_by
        self.nonce = str(uuid.uuid4())
        self.held = False
        self.lost_reason: str | None = None
        self.acquire_ms = 0
        self._on_lost = on_lost
        self._on_renew_failed = on_renew_failed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew_lock = threading.Lock()
        self._lost_lock = threading.Lock()
        self._last_renewal = 0.0
        self._last_confirmed = 0.0
        self._failures = 0

    @property
    def interval_s(self) -> float:
        return max(1, self.ttl_ms // 2) / 1000

    @property
    def deadline_s(self) -> float:
        """Failed renewals are tolerated this long after the last success."""
        margin = min((self.ttl_ms // 2) // 2, 5000)
        return (self.ttl_ms - margin) / 1000

    def acquire(self) -> None:
        """Take the lock or raise ``LOCK_ALREADY_HELD``; retried over transient errors (the
        attempt is judged by owner + nonce, so a lost reply of a won attempt is still a win)."""
        started = time.monotonic()
        try:
            owned = retry_transient(self._try_acquire)
        except Exception:
            self._forget()  # a won attempt whose reply was lost must not stay until its TTL
            raise
        if not owned:
            raise self._refused()
        self.acquire_ms = int((time.monotonic() - started) * 1000)
        self.held = True
        self._last_renewal = self._last_confirmed = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"migronaut-lock-{self.owner[:8]}", daemon=True
        )
        self._thread.start()

    def _try_acquire(self) -> bool:
        from pymongo.errors import DuplicateKeyError

        holder = {
            "_id": {"$literal": self.lock_id},
            "lockedAt": "$$NOW",
            "pid": {"$literal": os.getpid()},
            "host": {"$literal": socket.gethostname()},
            "executedBy": {"$literal": self.executed_by},
            "owner": {"$literal": self.owner},
            "nonce": {"$literal": self.nonce},
            "ttlMs": {"$literal": self.ttl_ms},
        }
        try:
            result = self.collection.update_one(
                {"_id": self.lock_id},
                [{"$replaceWith": {"$cond": [reclaimable(self.ttl_ms), holder, "$$ROOT"]}}],
                upsert=True,
            )
        except DuplicateKeyError:
            return False
        if result.upserted_id is not None:
            return True
        doc = self.collection.find_one({"_id": self.lock_id})
        return doc is not None and doc.get("owner") == self.owner \
            and doc.get("nonce") == self.nonce

    def _forget(self) -> None:
        """Best effort: delete our lock after an acquire that failed on the network."""
        try:
            retry_transient(lambda: self.collection.delete_one(self._ours()))
        except Exception:
            pass

    def _ours(self) -> dict[str, Any]:
        return {"_id": self.lock_id, "owner": self.owner, "nonce": self.nonce}

    def _refused(self, status: LockStatus | None = None) -> LockAlreadyHeldError:
        if status is None:
            status = read_lock_status(self.collection, ttl_ms=self.ttl_ms, lock_id=self.lock_id)
        holder = status.holder
        context: dict[str, Any] = {"holder": holder.to_dict() if holder else None}
        if status.problems:
            context["problems"] = [problem.to_dict() for problem in status.problems]
            return LockAlreadyHeldError(
                f"Migration lock is held by a lock document migronaut cannot read "
                f"({status.describe_problems()}) — runs treat it as held until it is removed: "
                "migronaut unlock", context)
        detail = f" by {holder.describe()}" if holder else ""
        return LockAlreadyHeldError(f"Migration lock is already held{detail}", context)

    def renew(self) -> bool:
        """Refresh ``lockedAt`` in server time; ``False`` when another run owns the lock now.

        Retried over transient errors: a renewal whose reply was lost matches again.
        """
        with self._renew_lock:
            result = retry_transient(lambda: self.collection.update_one(
                self._ours(), [{"$set": {"lockedAt": "$$NOW"}}]
            ))
            return result.matched_count == 1

    def _renew_checked(self) -> None:
        """One renewal: success re-arms the deadline, no match loses the lock, an error is
        tolerated (and reported) until the deadline."""
        try:
            still_held = self.renew()
        except Exception as error:  # a driver error: tolerated until the deadline
            self._failures += 1
            if self._on_renew_failed:
                self._on_renew_failed(self._failures, error)
            return
        if not still_held:
            self._lose("another run reclaimed it")
            return
        self._failures = 0
        self._last_renewal = time.monotonic()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self._next_wait()):
            if self.poll_lost() is not None:
                return
            self._renew_checked()
            if self.lost_reason is not None:
                return

    def _next_wait(self) -> float:
        until_deadline = self._last_renewal + self.deadline_s - time.monotonic()
        return max(0.0, min(self.interval_s, until_deadline))

    def confirm(self) -> str | None:
        """Before a step (a migration's start, a changelog write): why the lock is lost, or
        ``None`` while it is still ours.

        Renews — a round trip that proves owner + nonce still match — when a confirmation is
        due: the step since the previous confirmation took :data:`SLOW_STEP_S` or more with no
        renewal during it, or the last renewal is older than :data:`CONFIRM_AFTER_S`; otherwise
        the recent renewal stands for it (quick migrations share one round trip per second).
        """
        now = time.monotonic()
        if self._due(now):
            self._renew_checked()
            now = time.monotonic()
        self._last_confirmed = now
        return self.poll_lost(now)

    def fence(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The renewal (filter, update) to send *inside* a transaction before its changelog
        write when a confirmation is due, else ``None`` — report its outcome to
        :meth:`fenced`. Written in the transaction, the renewal makes the commit itself prove
        the lock is ours: a lock already gone matches nothing (the caller aborts), and an unlock
        or reclaim racing the transaction conflicts with it (the driver runs it again). A renewal
        outside the transaction would also make the dev server, which detects write conflicts
        per database, refuse the commit.
        """
        if self._due():
            return self._ours(), [{"$set": {"lockedAt": "$$NOW"}}]
        self._last_confirmed = time.monotonic()
        return None

    def fenced(self, matched: bool) -> str | None:
        """The outcome of :meth:`fence`'s renewal: why the lock is lost, or ``None``."""
        if matched:
            self._failures = 0
            self._last_renewal = time.monotonic()
        else:
            self._lose("another run reclaimed it")
        self._last_confirmed = time.monotonic()
        return self.poll_lost()

    def _due(self, now: float | None = None) -> bool:
        if now is None:
            now = time.monotonic()
        age, step = now - self._last_renewal, now - self._last_confirmed
        return self.held and self.lost_reason is None and (
            age >= CONFIRM_AFTER_S or (step >= SLOW_STEP_S and age >= step)
        )

    def poll_lost(self, now: float | None = None) -> str | None:
        """Why the lock is lost, checking the renewal deadline now (not only in the heartbeat);
        ``now``: ``time.monotonic()`` when the caller has just read it."""
        if self.lost_reason is None and self.held and (
            (time.monotonic() if now is None else now) - self._last_renewal >= self.deadline_s
        ):
            self._lose("no successful renewal within the TTL")
        return self.lost_reason

    def _lose(self, reason: str) -> None:
        with self._lost_lock:
            if self.lost_reason is not None:
                return
            self.lost_reason = reason
            self.held = False
        if self._on_lost:
            self._on_lost(reason)

    def stop_heartbeat(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def release(self, *, run_failed: bool = False) -> str | None:
        """Stop the heartbeat (waiting for a renewal in flight) and delete our own lock.

        The delete is retried over transient errors. Finding no lock of ours to delete means it
        was lost (force-released or reclaimed) before the run ended: the lock is declared lost.
        Returns a warning text when the release failed after a failed run; raises
        ``LOCK_RELEASE_FAILED`` when it failed after a successful one.
        """
        self.stop_heartbeat()
        if self.lost_reason is not None:
            return None
        sent = 0

        def delete() -> int:
            nonlocal sent
            sent += 1
            return self.collection.delete_one(self._ours()).deleted_count

        try:
            with self._renew_lock:
                deleted = retry_transient(delete)
        except Exception as error:
            self.held = False
            if run_failed:
                return f"Failed to release the migration lock: {describe_exception(error)}"
            raise LockReleaseFailedError(
                "Failed to release migration lock", {"error": describe_exception(error)},
                cause=error,
            ) from error
        if deleted == 0 and sent == 1:  # (after a lost reply, a resent delete finds nothing)
            self._lose("it was gone at release: force-released or reclaimed")
        self.held = False
        return None
