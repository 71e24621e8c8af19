"""The migration queue's job payloads (``up``, ``down``, ``converge``, ``sync``): what a worker
accepts, and the first problem it names when it refuses (``QUEUE_JOB_INVALID``, exit 25)."""

from __future__ import annotations

from typing import Any

import pytest

from migronaut import QueueJobInvalidError
from migronaut.executors.celery.payloads import validate

SHA = "ab" * 32


@pytest.mark.parametrize("data", [
    {"v": 1, "kind": "up"},
    {"v": 1, "kind": "up", "to": "20240101000000_a.py", "requestedBy": "ci", "reason": "r"},
    {"v": 1, "kind": "up", "migration": "20240101000000_a.py", "ordered": True, "batch": 7,
     "checksum": SHA, "groupId": "g1"},
    {"v": 1, "kind": "down"},
    {"v": 1, "kind": "down", "migration": "20240101000000_a.py", "ordered": True},
    {"v": 1, "kind": "converge", "ordered": False, "groupId": "g1"},
    {"v": 1, "kind": "sync", "requestedBy": "celery-beat"},
])
def test_migration_jobs_a_worker_accepts(data: dict[str, Any]) -> None:
    assert validate(data["kind"], data) == data


@pytest.mark.parametrize(("kind", "data", "field", "words"), [
    ("up", {"batch": 0}, "batch", "from 1 to"),
    ("up", {"batch": "3"}, "batch", "integer"),
    ("up", {"checksum": "AB" * 32}, "checksum", "lower-case hex"),
    ("up", {"checksum": "ab"}, "checksum", "64"),
    ("up", {"ordered": "yes"}, "ordered", "true or false"),
    ("up", {"to": "a/b.py"}, "to", "bare migration file name"),
    ("up", {"force": True}, "force", "not a known field"),
    ("down", {"steps": 2}, "steps", "not a known field"),
    ("converge", {"prune": True}, "prune", "not a known field"),
    ("converge", {"rebuildUnique": True}, "rebuildUnique", "not a known field"),
    ("sync", {"migration": "20240101000000_a.py"}, "migration", "not a known field"),
    ("up", {"requestedBy": "x" * 129}, "requestedBy", "at most 128"),
    ("down", {"reason": ""}, "reason", "non-empty"),
])
def test_migration_jobs_a_worker_refuses(kind: str, data: dict[str, Any], field: str,
                                         words: str) -> None:
    with pytest.raises(QueueJobInvalidError) as refused:
        validate(kind, {"v": 1, "kind": kind, **data})
    assert refused.value.context == {"kind": kind, "field": field}
    assert words in refused.value.message
    assert (refused.value.code, refused.value.exit_code) == ("QUEUE_JOB_INVALID", 25)
