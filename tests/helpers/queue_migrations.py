"""Migration files and waits shared by the migration-queue tests (Redis and RabbitMQ)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

A, B, C = "20240101000000_a.py", "20240102000000_b.py", "20240103000000_c.py"


def write_marking(project: Any, name: str, extra: str = "") -> None:
    """A migration that records one ``marks`` document per successful ``up`` (``extra``: body
    lines, indented four spaces, run first)."""
    project.write_migration(name, (
        "import os, time\nfrom pathlib import Path\n\n\ndef up(ctx):\n" + extra
        + f"    ctx.db.marks.insert_one({{'name': {name!r}}})\n\n\n"
        + f"def down(ctx):\n    ctx.db.marks.delete_many({{'name': {name!r}}})\n"))


def waiting_on(marker: Path, started: Path) -> str:
    """Body lines: say the body started, then wait for ``marker`` (at most 120 s)."""
    return (f"    Path({str(started)!r}).write_text(str(os.getpid()))\n"
            f"    deadline = time.monotonic() + 120\n"
            f"    while not Path({str(marker)!r}).exists() and time.monotonic() < deadline:\n"
            f"        time.sleep(0.05)\n")


def records(db: Any) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in db["_migronaut_migrations"].find({}, {"_id": 0})}


def until(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def in_doubt_then_resolved(handle: Any, app: Any, db: Any, cwd: Path) -> list[Any]:
    """After a worker died inside A's body: the job that comes back refuses with
    ``MIGRATION_IN_DOUBT`` (never retried, B not started); the operator records A pending, and
    a new ``up`` applies both. The new job's results."""
    import pytest

    from migronaut import Migrator, QueueJobFailedError
    from migronaut.celery import enqueue_up

    with pytest.raises(QueueJobFailedError) as doubt:
        handle.wait(150)
    context = doubt.value.context
    assert (context["migration"], context["code"]) == (A, "MIGRATION_IN_DOUBT")
    assert A in doubt.value.message
    assert records(db)[A]["status"] == "running" and B not in records(db)
    assert db.marks.count_documents({}) == 0  # killed before its mark
    with Migrator(cwd=cwd) as operator:
        operator.resolve(A, applied=False, reason="killed before its mark")
    results: list[Any] = enqueue_up(app).wait(150)
    return results
