"""The cluster-wide migration lock: one document ``{_id: 'migronaut_lock'}`` in the lock collection.

Invariant: at most one owner, judged in server time. Acquiring is one atomic upsert whose
pipeline replaces the document only when it is missing or older than the TTL by the server's
``$$NOW``; ownership is then confirmed by reading back our owner token *and* a private nonce.
Renewals and the release are scoped by owner + nonce, so a process that lost the lock can never
refresh or delete its successor's. A heartbeat thread renews every ``ttl/2``; when renewals keep
failing, a deadline declares the lock lost strictly before a peer could reclaim it.

A forced ``unlock`` (or a reclaim) is noticed before the holder's next step, not at its next
heartbeat: the run calls :meth:`MigrationLock.confirm` before each migration and each changelog
write, which renews (and so confirms) the lock when the step just finished was slow or the last
renewal is older than a second — so a successor overlaps with at most the step in flight, while
quick migrations share one confirmation per second. Acquire, renewals and release are idempotent
and retried over transient network errors (:mod:`migronaut.core.retry`).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from migronaut.core.results import LockInfo
from migronaut.core.retry import retry_transient
from migronaut.errors import LockAlreadyHeldError, LockReleaseFailedError, describe_exception

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = ["LOCK_ID", "MigrationLock", "force_release", "lock_info", "read_lock"]

LOCK_ID = "migronaut_lock"
_EPOCH = dt.datetime(1970, 1, 1)

#: :meth:`MigrationLock.confirm` renews when the last renewal is older than this…
CONFIRM_AFTER_S = 1.0
#: …or when the step since the previous confirmation took this long without a renewal (its
#: round trip is then at most a few per cent of the step).
SLOW_STEP_S = 0.1


def lock_info(doc: dict[str, Any] | None) -> LockInfo | None:
    if not doc:
        return None
    return LockInfo(
        locked_at=doc.get("lockedAt"),
        pid=doc.get("pid"),
        host=doc.get("host"),
        executed_by=doc.get("executedBy"),
        run_id=doc.get("owner"),
        ttl_ms=doc.get("ttlMs"),
    )


def read_lock(collection: Collection[dict[str, Any]], lock_id: str = LOCK_ID) -> LockInfo | None:
    return lock_info(collection.find_one({"_id": lock_id}))


def force_release(
    collection: Collection[dict[str, Any]], lock_id: str = LOCK_ID
) -> LockInfo | None:
    """Delete the lock whoever holds it; returns the removed holder."""
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
        stale = {"$lt": [{"$ifNull": ["$lockedAt", _EPOCH]}, {"$subtract": ["$$NOW", self.ttl_ms]}]}
        try:
            result = self.collection.update_one(
                {"_id": self.lock_id},
                [{"$replaceWith": {"$cond": [stale, holder, "$$ROOT"]}}],
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

    def _refused(self, doc: dict[str, Any] | None = None) -> LockAlreadyHeldError:
        if doc is None:
            doc = self.collection.find_one({"_id": self.lock_id})
        info = lock_info(doc)
        detail = f" by {info.describe()}" if info else ""
        return LockAlreadyHeldError(
            f"Migration lock is already held{detail}",
            {"holder": info.to_dict() if info else None},
        )

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
        if self._due():
            self._renew_checked()
        self._last_confirmed = time.monotonic()
        return self.poll_lost()

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

    def _due(self) -> bool:
        now = time.monotonic()
        age, step = now - self._last_renewal, now - self._last_confirmed
        return self.held and self.lost_reason is None and (
            age >= CONFIRM_AFTER_S or (step >= SLOW_STEP_S and age >= step)
        )

    def poll_lost(self) -> str | None:
        """Why the lock is lost, checking the renewal deadline now (not only in the heartbeat)."""
        overdue = time.monotonic() - self._last_renewal >= self.deadline_s
        if self.lost_reason is None and self.held and overdue:
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
