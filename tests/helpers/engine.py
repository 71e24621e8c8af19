"""Helpers for API-level engine tests: migrators on the test project, migration bodies, polling.

Nothing here sleeps to synchronise: :func:`wait_until` polls an observable condition with a bound.
"""

from __future__ import annotations

import logging
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pymongo.monitoring import (
    CommandFailedEvent,
    CommandListener,
    CommandStartedEvent,
    CommandSucceededEvent,
)

if TYPE_CHECKING:
    from pymongo.database import Database

    from migronaut import Migrator

CHANGELOG = "_migronaut_migrations"
LOCKS = "_migronaut_locks"
LOCK_ID = "migronaut_lock"


def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 15.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


def make_migrator(project: Any, **overrides: Any) -> Migrator:
    """A :class:`Migrator` on the test project's database, with no ``.env`` and no config file
    surprises (the project directory holds none unless the test writes one)."""
    from migronaut import Migrator

    settings: dict[str, Any] = {
        "uri": project.uri,
        "db_name": project.db_name,
        "env_file": False,
    }
    settings.update(overrides)
    return Migrator(cwd=project.path, **settings)


def recording_body(tag: str, *, collection: str = "things", extra_up: str = "") -> str:
    """A migration whose ``up`` inserts ``{"m": tag}`` and whose ``down`` removes it (with the
    transaction's session when there is one); ``extra_up`` is appended to ``up``."""
    extra = textwrap.indent(textwrap.dedent(extra_up).strip(), "    ") if extra_up else ""
    return (
        f'"""Migration {tag}."""\n\n'
        "def up(ctx):\n"
        f"    ctx.db[{collection!r}].insert_one({{'m': {tag!r}}}, session=ctx.session)\n"
        f"    ctx.db['calls'].insert_one({{'m': {tag!r}, 'dir': 'up'}})\n"
        + (extra + "\n" if extra else "")
        + "\n\ndef down(ctx):\n"
        f"    ctx.db[{collection!r}].delete_many({{'m': {tag!r}}}, session=ctx.session)\n"
        f"    ctx.db['calls'].insert_one({{'m': {tag!r}, 'dir': 'down'}})\n"
    )


def write_simple(project: Any, *names: str) -> list[str]:
    """Write recording migrations named ``<name>.py``; returns the file names."""
    files = []
    for name in names:
        project.write_migration(name, recording_body(name))
        files.append(f"{name}.py")
    return files


def calls(db: Database[dict[str, Any]], direction: str | None = None) -> list[str]:
    """Migration bodies that ran, in order (``calls`` collection written by recording bodies)."""
    query = {} if direction is None else {"dir": direction}
    return [d["m"] for d in db["calls"].find(query).sort("_id", 1)]


def records(db: Database[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Changelog records by name."""
    return {d["name"]: d for d in db[CHANGELOG].find({}, {"_id": 0})}


def applied(db: Database[dict[str, Any]]) -> list[str]:
    return sorted(d["name"] for d in db[CHANGELOG].find({"status": "applied"}))


def server_now(db: Database[dict[str, Any]]) -> Any:
    """The server's clock (naive UTC), from ``hello``."""
    return db.client.admin.command("hello")["localTime"].replace(tzinfo=None)


def hold_lock(
    db: Database[dict[str, Any]],
    *,
    owner: str = "someone-else",
    age_ms: int = 0,
    ttl_ms: int = 60_000,
    nonce: str = "their-nonce",
    collection: str = LOCKS,
) -> None:
    """Write a lock document held by another run, stamped ``age_ms`` ago in server time."""
    db[collection].update_one(
        {"_id": LOCK_ID},
        [
            {
                "$replaceWith": {
                    "_id": LOCK_ID,
                    "lockedAt": {"$subtract": ["$$NOW", age_ms]},
                    "pid": 4242,
                    "host": "other-host",
                    "executedBy": "other-user",
                    "owner": owner,
                    "nonce": nonce,
                    "ttlMs": ttl_ms,
                }
            }
        ],
        upsert=True,
    )


class ListHandler(logging.Handler):
    """Collects formatted log messages (thread-safe enough for tests: list.append is atomic)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]

    def has(self, text: str) -> bool:
        return any(text in m for m in self.messages)


@contextmanager
def captured_logger(name: str = "test.migronaut") -> Iterator[tuple[logging.Logger, ListHandler]]:
    """A private logger (pass it as ``logger=``) and the handler that collects its records."""
    logger = logging.getLogger(f"{name}.{id(object())}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = ListHandler()
    logger.addHandler(handler)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


class Events:
    """Records every event of a migrator (``*`` listener)."""

    def __init__(self, migrator: Migrator) -> None:
        self.items: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        migrator.on("*", self._record)

    def _record(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self.items.append(dict(payload))

    @property
    def names(self) -> list[str]:
        return [e["event"] for e in self.items]

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.items if e["event"] == name]


def body_threads_alive() -> bool:
    """Whether a timed-out migration body is still running in its thread."""
    return any(t.name == "migronaut-migration-body" and t.is_alive() for t in threading.enumerate())


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


#: A migration that deletes the migration lock, then waits (bounded) until a ``lock:lost``
#: listener of the test has written a document into ``lost`` (or the run cancels it).
LOSES_LOCK_AND_WAITS = """
def up(ctx):
    ctx.db["_migronaut_locks"].delete_one({"_id": "migronaut_lock"})
    for _ in range(1000):  # bounded: until the lock:lost listener has written its mark
        if ctx.db["lost"].find_one() or ctx.cancellation.wait(0.02):
            break

def down(ctx):
    pass
"""


class ChangelogUpdates(CommandListener):
    """The ``update`` commands sent to the changelog: for each, the first four characters of
    the names its statements filter on (``[["0001"], ["0001", "0002"], …]``)."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def started(self, event: CommandStartedEvent) -> None:
        if event.command_name == "update" and event.command.get("update") == CHANGELOG:
            self.sent.append([s["q"]["name"][:4] for s in event.command["updates"]])

    def succeeded(self, event: CommandSucceededEvent) -> None:
        pass

    def failed(self, event: CommandFailedEvent) -> None:
        pass
