"""What ``converge --check`` (a dry run) sends over 50 declared collections.

One ``listCollections``, one ``listIndexes`` per existing collection with at most
:data:`MAX_IN_FLIGHT` of them in flight, and besides them only the connection's ``ping`` and the
server info of collections.md §2.3 step 4 (``hello`` and ``buildInfo``, once each). Counted with
a command listener on the migrator's own client; timings are measured in ``bench/``, not here.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from pymongo import monitoring

from helpers.engine import make_migrator
from helpers.wire_audit import AUDIT, OWN_PREFIX, Sent
from migronaut.commands.converge_read import MAX_IN_FLIGHT

DECLARED = 50
EXISTING = 40  # the other 10 are missing: no listIndexes for them
HOLD = 0.02


class InFlight(monitoring.CommandListener):
    """Every command started (by name, with its target), and the most ``listIndexes`` ever
    started and not yet finished at once (the pool's actual concurrency).

    Each ``listIndexes`` is held back :data:`HOLD` seconds in its own thread before it is sent,
    so concurrent reads overlap even on a fast server: an unbounded pool would show more than
    :data:`MAX_IN_FLIGHT` at once, not just happen to finish them in time.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started_commands: list[tuple[str, Any]] = []
        self.running: set[int] = set()
        self.peak = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        with self.lock:
            self.started_commands.append(
                (event.command_name, event.command.get(event.command_name)))
            if event.command_name != "listIndexes":
                return
            self.running.add(event.request_id)
            self.peak = max(self.peak, len(self.running))
        time.sleep(HOLD)

    def _finished(self, event: Any) -> None:
        with self.lock:
            self.running.discard(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._finished(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._finished(event)


def declared() -> list[dict[str, Any]]:
    return [{"name": f"c{i:02d}", "indexes": [{"key": {"a": 1}}, {"key": {"b": 1, "c": -1}},
                                               {"key": {"d": 1}, "unique": True}]}
            for i in range(DECLARED)]


def check(project: Any) -> tuple[Any, InFlight]:
    """A dry run on a fresh migrator; the listener holds what ``converge`` sent (closing the
    client sends pymongo's ``endSessions``, asserted here and kept out of the listener)."""
    listener = InFlight()
    with make_migrator(project, collections=declared(),
                       client_options={"event_listeners": [listener]}) as migrator:
        result = migrator.converge(dry_run=True)
        sent = len(listener.started_commands)
    assert [name for name, _ in listener.started_commands[sent:]] == ["endSessions"]
    del listener.started_commands[sent:]
    return result, listener


def test_check_over_50_collections_sends_one_list_per_collection(project: Any, db: Any) -> None:
    existing = [f"c{i:02d}" for i in range(EXISTING)]
    for name in existing:
        db.create_collection(name)

    result, listener = check(project)
    assert not result.in_sync and len(result.collections) == DECLARED

    names = collections.Counter(name for name, _ in listener.started_commands)
    assert names == {"ping": 1, "hello": 1, "buildInfo": 1, "listCollections": 1,
                     "listIndexes": EXISTING}
    listed = sorted(target for name, target in listener.started_commands
                    if name == "listIndexes")
    assert listed == existing  # each existing collection once, never a missing one
    assert 1 < listener.peak <= MAX_IN_FLIGHT == 8  # concurrent, and never more
    assert not listener.running  # every listIndexes finished


def test_in_sync_check_sends_the_same_and_nothing_more(project: Any, db: Any) -> None:
    with make_migrator(project, collections=declared()) as migrator:
        assert migrator.converge().changed > 0  # every collection and index created
    result, listener = check(project)
    assert result.in_sync and result.changed == 0

    names = collections.Counter(name for name, _ in listener.started_commands)
    assert names == {"ping": 1, "hello": 1, "buildInfo": 1, "listCollections": 1,
                     "listIndexes": DECLARED}
    assert len({target for name, target in listener.started_commands
                if name == "listIndexes"}) == DECLARED
    assert 1 < listener.peak <= MAX_IN_FLIGHT


def _declared_reads(sent: list[Sent]) -> collections.Counter[tuple[str, str]]:
    """What was sent about the user's collections: everything but the handshake, the server
    info and migronaut's own state (the lock, the run record — ``_migronaut*``)."""
    return collections.Counter(
        (s.command, s.target) for s in sent
        if s.command not in ("ping", "hello", "buildInfo", "endSessions")
        and not s.target.startswith(OWN_PREFIX))


def test_an_in_sync_converge_reads_exactly_what_check_reads(project: Any, db: Any) -> None:
    """A real converge with nothing to do re-reads no collection (§2.3 step 8 re-plans before
    work, and there is none): one ``listCollections`` and one ``listIndexes`` per collection,
    the same commands as ``converge --check``."""
    with make_migrator(project, collections=declared()) as migrator:
        assert migrator.converge().changed > 0
        with AUDIT.recording() as checked:
            assert migrator.converge(dry_run=True).in_sync
        with AUDIT.recording() as converged:
            result = migrator.converge()
    assert result.in_sync and result.changed == 0

    expected = collections.Counter({("listCollections", "1"): 1, **{
        ("listIndexes", f"c{i:02d}"): 1 for i in range(DECLARED)}})
    assert _declared_reads(checked) == expected
    assert _declared_reads(converged) == expected
    assert any(s.target == "_migronaut_locks" for s in converged)  # a real, locked run


def test_a_converge_with_work_still_re_reads_each_collection_before_its_turn(
        project: Any, db: Any) -> None:
    """The counterpart: once a step ran, every later collection is read again before its turn
    (a collection changed meanwhile stops the run at ``replan``), and a collection that had
    work once more after it (the fixed-point check)."""
    for name in ("c00", "c01", "c02"):
        db.create_collection(name)
    with make_migrator(project, collections=declared()[:3]) as migrator, \
            AUDIT.recording() as sent:
        assert migrator.converge().changed == 9
    listed = collections.Counter(s.target for s in sent if s.command == "listIndexes")
    # the first read, then c00: verify; c01 and c02: re-plan + verify
    assert listed == {"c00": 2, "c01": 3, "c02": 3}
