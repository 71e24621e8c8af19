"""The cluster-wide migration lock: one document ``{_id: 'migronaut_lock'}`` in the lock collection.

Invariant: at most one owner, judged in server time. Acquiring is one atomic upsert whose
pipeline replaces the document only when it is missing or older than the TTL by the server's
``$$NOW``; ownership is then confirmed by reading back our owner token *and* a private nonce.
Renewals and the release are scoped by owner + nonce, so a process that lost the lock can never
refresh or delete its successor's. A heartbeat thread renews every ``ttl/2``; when renewals keep
failing, a deadline declares the lock lost strictly before a peer could reclaim it.
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
from migronaut.errors import LockAlreadyHeldError, LockReleaseFailedError, describe_exception

if TYPE_CHECKING:
    from pymongo.collection import Collection

__all__ = ["LOCK_ID", "MigrationLock", "force_release", "lock_info", "read_lock"]

LOCK_ID = "migronaut_lock"
_EPOCH = dt.datetime(1970, 1, 1)


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
        self._last_renewal = 0.0

    @property
    def interval_s(self) -> float:
        return max(1, self.ttl_ms // 2) / 1000

    @property
    def deadline_s(self) -> float:
        """Failed renewals are tolerated this long after the last success."""
        margin = min((self.ttl_ms // 2) // 2, 5000)
        return (self.ttl_ms - margin) / 1000

    def acquire(self) -> None:
        from pymongo.errors import DuplicateKeyError

        started = time.monotonic()
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
        except DuplicateKeyError as error:
            raise self._refused() from error
        if result.upserted_id is None:
            doc = self.collection.find_one({"_id": self.lock_id})
            if not doc or doc.get("owner") != self.owner or doc.get("nonce") != self.nonce:
                raise self._refused(doc)
        self.acquire_ms = int((time.monotonic() - started) * 1000)
        self.held = True
        self._last_renewal = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"migronaut-lock-{self.owner[:8]}", daemon=True
        )
        self._thread.start()

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
        """Refresh ``lockedAt`` in server time; ``False`` when another run owns the lock now."""
        with self._renew_lock:
            result = self.collection.update_one(
                {"_id": self.lock_id, "owner": self.owner, "nonce": self.nonce},
                [{"$set": {"lockedAt": "$$NOW"}}],
            )
            return result.matched_count == 1

    def _heartbeat(self) -> None:
        failures = 0
        while not self._stop.wait(self._next_wait()):
            if time.monotonic() - self._last_renewal >= self.deadline_s:
                self._lose("no successful renewal within the TTL")
                return
            try:
                still_held = self.renew()
            except Exception as error:  # a driver error: tolerated until the deadline
                failures += 1
                if self._on_renew_failed:
                    self._on_renew_failed(failures, error)
                continue
            if not still_held:
                self._lose("another run reclaimed it")
                return
            failures = 0
            self._last_renewal = time.monotonic()

    def _next_wait(self) -> float:
        until_deadline = self._last_renewal + self.deadline_s - time.monotonic()
        return max(0.0, min(self.interval_s, until_deadline))

    def poll_lost(self) -> str | None:
        """Why the lock is lost, checking the renewal deadline now (not only in the heartbeat)."""
        overdue = time.monotonic() - self._last_renewal >= self.deadline_s
        if self.lost_reason is None and self.held and overdue:
            self._lose("no successful renewal within the TTL")
        return self.lost_reason

    def _lose(self, reason: str) -> None:
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

        Returns a warning text when the release failed after a failed run; raises
        ``LOCK_RELEASE_FAILED`` when it failed after a successful one.
        """
        self.stop_heartbeat()
        if self.lost_reason is not None:
            return None
        try:
            with self._renew_lock:
                self.collection.delete_one(
                    {"_id": self.lock_id, "owner": self.owner, "nonce": self.nonce}
                )
        except Exception as error:
            if run_failed:
                return f"Failed to release the migration lock: {describe_exception(error)}"
            raise LockReleaseFailedError(
                "Failed to release migration lock", {"error": describe_exception(error)},
                cause=error,
            ) from error
        finally:
            self.held = False
        return None
