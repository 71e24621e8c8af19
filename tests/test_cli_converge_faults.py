"""``migronaut converge --json`` on its failure paths: the error envelope of exit 27 (apply and
plan phases), the result document of ``--check``'s exit 28, the lock refusal (exit 3) and a
SIGTERM between steps (exit 11) — each with nothing half-written (collections.md §2.7, §2.10)."""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import Any

from helpers.engine import hold_lock


def declare(project: Any, definitions: list[dict[str, Any]]) -> None:
    (project.path / "collections").mkdir(exist_ok=True)
    for definition in definitions:
        (project.path / "collections" / f"{definition['name']}.json").write_text(
            json.dumps(definition))
    project.write("migronaut.toml", 'collections_dir = "collections"\n')


def test_exit_27_apply_is_the_error_envelope_with_the_result_so_far(
    cli: Any, project: Any, db: Any,
) -> None:
    db.u.insert_many([{"n": 1}, {"n": 1}])
    db.u.create_index([("n", 1)], name="n_1")
    declare(project, [{"name": "u", "indexes": [{"key": {"n": 1}, "unique": True}]}])
    failed = cli("converge", "-y", "--json")

    assert failed.exit_code == 27, failed.stderr
    assert set(failed.json) == {"error", "partial"}
    assert failed.json["partial"] == []  # the locked run's migration results: none
    error = failed.json["error"]
    assert set(error) == {"code", "message", "context"}
    assert error["code"] == "CONVERGE_FAILED"
    assert error["message"].startswith('Could not modify index "n_1" on u: ')
    context = error["context"]
    assert {"phase", "collection", "target", "name", "action", "cause", "mongoCode", "hint",
            "violations", "converge"} == set(context)
    assert (context["phase"], context["collection"], context["target"], context["name"],
            context["action"], context["mongoCode"]) == ("apply", "u", "index", "n_1", "modify",
                                                         359)
    assert len(context["violations"]) == 1 and len(context["violations"][0]["ids"]) == 2
    result = context["converge"]
    assert result["dryRun"] is False and result["changed"] == 0 and result["inSync"] is False
    assert result["collections"][0]["actions"][0]["status"] == "failed"
    assert f"✖ CONVERGE_FAILED: {error['message']}" in failed.stderr
    listed = {index["name"]: index for index in db.u.list_indexes()}
    assert "unique" not in listed["n_1"] and "prepareUnique" not in listed["n_1"]


def test_exit_27_plan_names_every_conflict(cli: Any, project: Any, db: Any) -> None:
    db.orders.create_index([("shop", 1)], name="by_shop", sparse=True)
    declare(project, [{"name": "orders", "indexes": [{"key": {"shop": 1}}]},
                      {"name": "fresh", "indexes": [{"key": {"a": 1}}]}])
    refused = cli("converge", "--json")

    assert refused.exit_code == 27, refused.stderr
    error = refused.json["error"]
    assert error["code"] == "CONVERGE_FAILED"
    assert error["message"].startswith('Converge refused: 1 conflict(s) — orders index "shop_1": ')
    context = error["context"]
    assert set(context) == {"phase", "conflicts", "converge"} and context["phase"] == "plan"
    conflict = context["conflicts"][0]
    assert (conflict["collection"], conflict["target"], conflict["name"]) == (
        "orders", "index", "shop_1")
    assert isinstance(conflict["reason"], str) and conflict["reason"]
    statuses = {row["status"] for c in context["converge"]["collections"]
                for row in c["actions"]}
    assert statuses == {"failed", "skipped"}
    assert "fresh" not in db.list_collection_names()  # refused before the first write
    assert "_migronaut_converge" in db.list_collection_names()  # a failed run is recorded


def test_exit_28_check_prints_the_plan_document_not_an_error(
    cli: Any, project: Any, db: Any,
) -> None:
    declare(project, [{"name": "orders", "indexes": [{"key": {"shop": 1}}]}])
    drift = cli("converge", "--check", "--json")

    assert drift.exit_code == 28, drift.stderr
    assert "error" not in drift.json
    assert drift.json["dryRun"] is True and drift.json["inSync"] is False
    assert drift.json["changed"] == 2
    rows = [(row["target"], row["name"], row["action"], row["status"])
            for row in drift.json["collections"][0]["actions"]]
    assert rows == [("collection", "orders", "create", "planned"),
                    ("index", "shop_1", "create", "planned")]
    assert db.list_collection_names() == []


def test_exit_3_when_the_lock_is_held_and_nothing_written(cli: Any, project: Any,
                                                          db: Any) -> None:
    declare(project, [{"name": "orders", "indexes": [{"key": {"shop": 1}}]}])
    hold_lock(db)
    held = cli("converge", "-y", "--json")

    assert held.exit_code == 3, held.stderr
    assert held.json["error"]["code"] == "LOCK_ALREADY_HELD"
    assert "✖ LOCK_ALREADY_HELD" in held.stderr
    assert set(db.list_collection_names()) == {"_migronaut_locks"}


def test_sigterm_between_steps_exits_11_with_the_done_work_kept(
    cli: Any, project: Any, db: Any, monkeypatch: Any,
) -> None:
    """SIGTERM right after the collection was created (raised from a log handler in the CLI's
    own thread, the stop handed over before the handler returns): the index step never runs,
    exit 11 with ``context.converge``, a failed history entry, the lock released."""
    from migronaut.cli.signals import GracefulStop

    handed_over = threading.Event()
    request = GracefulStop._request

    def requested(self: GracefulStop, name: str) -> None:
        request(self, name)
        handed_over.set()

    monkeypatch.setattr(GracefulStop, "_request", requested)

    class TermAfterTheCollection(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not record.getMessage().startswith("✔ Created collection orders"):
                return
            handler = signal.getsignal(signal.SIGTERM)
            if isinstance(getattr(handler, "__self__", None), GracefulStop):  # else: no guard
                signal.raise_signal(signal.SIGTERM)
                handed_over.wait(10)

    declare(project, [{"name": "orders", "indexes": [{"key": {"shop": 1}}]}])
    handler = TermAfterTheCollection(logging.INFO)
    logger = logging.getLogger("migronaut")
    logger.addHandler(handler)
    try:
        stopped = cli("converge", "-y", "--json")
    finally:
        logger.removeHandler(handler)

    assert handed_over.is_set()
    assert stopped.exit_code == 11, stopped.stderr
    error = stopped.json["error"]
    assert error["code"] == "RUN_ABORTED" and error["message"] == "Received SIGTERM"
    assert error["context"]["converge"]["changed"] == 1
    assert "SIGTERM received — finishing the current step, then stopping" in stopped.stderr
    assert set(index["name"] for index in db.orders.list_indexes()) == {"_id_"}
    entry = db["_migronaut_converge"].find_one()
    assert entry is not None and entry["success"] is False and entry["error"] == "Received SIGTERM"
    assert db["_migronaut_locks"].count_documents({}) == 0
