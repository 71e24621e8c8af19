"""A transform's error text is stored on partitions (``lastDocErrors``) and the state
(``docErrors``, ``lastError``) for good: a URI password or a value a duplicate-key error quotes in
it is masked before it is written."""

from __future__ import annotations

import json
from typing import Any

from helpers.background import PARTITIONS, STATES, background_file, seed

MIGRATE = '''
def migrate(doc, ctx):
    if FAIL_ON is not None and doc.get("n") == FAIL_ON:
        raise ValueError("cannot migrate this one")
'''
LEAKY = '''
def migrate(doc, ctx):
    if doc.get("n") in (3, 5):
        raise ValueError('sync to mongodb://etl:hunter2@warehouse/db failed: '
                         'dup key: { email: "eve@example.com" }')
'''


def leaks(value: Any) -> list[str]:
    text = json.dumps(value, default=str)
    return [secret for secret in ("hunter2", "eve@example.com") if secret in text]


def test_document_errors_are_stored_redacted(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(
        extra_spec='"max_document_errors": 10,').replace(MIGRATE, LEAKY))
    result = cli("up", env={"MIGRONAUT_BACKGROUND_INLINE": "true"})
    assert result.exit_code == 0, result.stderr
    state = db[STATES].find_one({})
    assert state is not None and state["status"] == "completed"
    messages = [entry["error"] for entry in state["docErrors"]]
    assert len(messages) == 2
    for message in messages:
        assert "mongodb://etl:****@warehouse/db" in message and "dup key: { **** }" in message
    partitions = list(db[PARTITIONS].find({}))
    assert sum(len(p.get("lastDocErrors") or []) for p in partitions) == 2
    assert leaks(state) == [] and leaks(partitions) == []
    assert db.users.count_documents({"n": {"$in": [3, 5]}, "__v": {"$exists": True}}) == 0


def test_the_failure_over_budget_is_stored_redacted(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(
        extra_spec='"max_document_errors": 0,').replace(MIGRATE, LEAKY))
    result = cli("up", "--json", env={"MIGRONAUT_BACKGROUND_INLINE": "true"})
    assert result.exit_code == 32, result.stderr
    assert result.json["error"]["code"] == "BACKGROUND_FAILED"
    state = db[STATES].find_one({})
    assert state is not None and state["status"] == "failed"
    assert "etl:****@warehouse" in state["lastError"]
    assert leaks(state) == [] and leaks(list(db[PARTITIONS].find({}))) == []
    assert leaks(result.stdout + result.stderr) == []
