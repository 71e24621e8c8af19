"""Dry runs of background migrations (reference background §6.7): previews, the sandbox, steps.

Every scenario checks I14 — nothing persists: the database's full contents (every collection,
every document) are the same before and after the dry run. I15 — no document data in log lines
or events — is checked with a marker value planted in the documents and their ids.
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from migronaut.background.tools.dryrun import exit_code
from migronaut.errors import (
    ConfigInvalidError,
    MigrationFileNotFoundError,
    TransactionsUnsupportedError,
)

if TYPE_CHECKING:
    from pymongo.database import Database

    from migronaut import Migrator
    from migronaut.background.engine import BackgroundEngine

FILE = "20240101000000_things_v2.py"
STEP_FILE = "20240101000000_step.py"
MARKER = "MARKER-7f3a"


# ------------------------------------------------------------------------------------ helpers


@pytest.fixture
def migrator(project: Any) -> Iterator[Migrator]:
    from migronaut.api import Migrator

    with Migrator(uri=project.uri, db_name=project.db_name,
                  migrations_dir=str(project.migrations), env_file=False) as m:
        yield m


@pytest.fixture
def engine(migrator: Migrator) -> BackgroundEngine:
    return migrator.background


def snapshot(db: Database[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every collection of the database with all its documents, in ``_id`` order."""
    return {
        name: list(db[name].find().sort("_id", 1))
        for name in sorted(db.list_collection_names())
    }


def declarative(project: Any, body: str, *, name: str = FILE, settings: str = "") -> None:
    """A declarative background file on ``things`` from 1 to 2; ``body`` defines the functions."""
    project.write_migration(name, textwrap.dedent(body) + textwrap.dedent(f"""

        background = {{
            "collection": "things",
            "from": 1,
            "to": 2,
            {settings}
            **{{k: v for k, v in (("migrate", globals().get("migrate")),
                                  ("migrate_batch", globals().get("migrate_batch")),
                                  ("revert", globals().get("revert"))) if v is not None}},
        }}
    """))


def step_file(project: Any, body: str, *, name: str = STEP_FILE, revert: bool = False) -> None:
    """A step background file whose ``step(ctx)`` is ``body`` (indented as a function body)."""
    code = "import os, time\nfrom pymongo import MongoClient, WriteConcern\n\n\ndef step(ctx):\n"
    code += textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"
    extra = ', "revert_step": step' if revert else ""
    code += f'\n\nbackground = {{"collection": "things", "step": step{extra}}}\n'
    project.write_migration(name, code)


def seed(db: Database[dict[str, Any]], count: int = 6, *, at: int = 1) -> None:
    db.things.insert_many([
        {"_id": i, "n": i, "name": f"Name {i}", "old": True, "__v": at} for i in range(1, count + 1)
    ])


MIGRATE = """
    def migrate(doc, ctx):
        doc["double"] = doc["n"] * 2
        doc.pop("old", None)
        return doc
"""


# ------------------------------------------------------------------------------------ previews


def test_first_preview_shows_before_change_after_and_writes_nothing(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 6)
    db.things.insert_one({"_id": 0, "n": 0, "__v": 2})  # already migrated: never previewed
    declarative(project, MIGRATE)
    before = snapshot(db)

    report = engine.dry_run(FILE, first=3)

    assert snapshot(db) == before
    assert {k: report[k] for k in ("mode", "migration", "direction", "method", "requested",
                                   "found", "migrated", "failed")} == {
        "mode": "declarative", "migration": FILE, "direction": "forward", "method": "first",
        "requested": 3, "found": 3, "migrated": 3, "failed": 0,
    }
    assert [row["_id"] for row in report["documents"]] == [1, 2, 3]
    row = report["documents"][1]
    assert row["before"] == {"_id": 2, "n": 2, "name": "Name 2", "old": True, "__v": 1}
    assert row["change"] == {"$set": {"double": 4, "__v": 2}, "$unset": {"old": ""},
                             "$inc": {"__rev": 1}}
    assert row["after"] == {"_id": 2, "n": 2, "name": "Name 2", "__v": 2, "__rev": 1,
                            "double": 4}
    assert exit_code(report) == 0
    assert "validated" not in report and "ops" not in report


def test_sample_preview_defaults_to_five_matching_documents(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 8)
    db.things.update_many({"_id": {"$gt": 6}}, {"$set": {"__v": 2}})
    declarative(project, MIGRATE)
    before = snapshot(db)

    report = engine.dry_run(FILE)
    assert report["method"] == "sample" and report["requested"] == 5
    assert report["found"] == 5 and report["migrated"] == 5
    ids = [row["_id"] for row in report["documents"]]
    assert len(set(ids)) == 5 and set(ids) <= {1, 2, 3, 4, 5, 6}

    small = engine.dry_run(FILE, sample=100)
    assert small["requested"] == 100 and small["found"] == 6
    assert snapshot(db) == before


def test_nothing_to_migrate_is_exit_1(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 3, at=2)
    declarative(project, MIGRATE)
    report = engine.dry_run(FILE, first=5)
    assert report["found"] == 0 and report["documents"] == []
    assert exit_code(report) == 1


def test_revert_preview_uses_revert_and_reads_documents_at_to(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    db.things.insert_many([
        {"_id": 1, "n": 1, "double": 2, "__v": 2, "__rev": 1},
        {"_id": 2, "n": 2, "__v": 1},
    ])
    declarative(project, MIGRATE + """
    def revert(doc, ctx):
        doc.pop("double", None)
        doc["old"] = True
        return doc
    """)
    before = snapshot(db)
    report = engine.dry_run(FILE, first=10, direction="revert")
    assert snapshot(db) == before
    assert report["direction"] == "revert" and report["found"] == 1
    (row,) = report["documents"]
    assert row["_id"] == 1
    assert row["change"] == {"$set": {"old": True, "__v": 1}, "$unset": {"double": ""},
                             "$inc": {"__rev": 1}}
    assert row["after"] == {"_id": 1, "n": 1, "__v": 1, "__rev": 2, "old": True}


def test_transform_errors_are_shown_per_row(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 4)
    declarative(project, """
    def migrate(doc, ctx):
        if doc["n"] == 2:
            raise ValueError("cannot handle this one")
        if doc["n"] == 3:
            return "not a document"
        doc["seen_dry_run"] = ctx.dry_run
        doc["had_db"] = ctx.db is not None
        return doc
    """)
    report = engine.dry_run(FILE, first=4)
    rows = {row["_id"]: row for row in report["documents"]}
    assert report["migrated"] == 2 and report["failed"] == 2
    assert rows[2]["error"] == "ValueError: cannot handle this one"
    assert "change" not in rows[2] and rows[2]["before"]["n"] == 2
    assert "not a document" in rows[3]["error"] and "str" in rows[3]["error"]
    assert rows[1]["change"]["$set"]["seen_dry_run"] is True
    assert rows[1]["change"]["$set"]["had_db"] is False  # a plain preview has no database
    assert exit_code(report) == 0


def test_migrate_batch_slot_errors_and_wrong_length(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 3)
    declarative(project, """
    def migrate_batch(docs, ctx):
        out = []
        for doc in docs:
            out.append(RuntimeError("slot failed") if doc["n"] == 2 else {**doc, "b": 1})
        return out
    """)
    report = engine.dry_run(FILE, first=3)
    assert [("error" in row) for row in report["documents"]] == [False, True, False]
    assert report["documents"][1]["error"] == "RuntimeError: slot failed"

    declarative(project, """
    def migrate_batch(docs, ctx):
        return docs[:1]
    """)
    report = engine.dry_run(FILE, first=3)
    assert report["failed"] == 3 and exit_code(report) == 1
    assert "returned 1 results for 3 documents" in report["documents"][0]["error"]


def test_bad_options_fail_before_anything_runs(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 2)
    declarative(project, MIGRATE)
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"sample": 2, "first": 2}, "sample", "not both"),
        ({"sample": 0}, "sample", "from 1 to 1000"),
        ({"first": 1001}, "first", "from 1 to 1000"),
        ({"sample": True}, "sample", "integer"),
        ({"direction": "down"}, "direction", "'forward' or 'revert'"),
        ({"steps": 2}, "steps", "step migrations"),
        ({"from_start": True}, "from_start", "step migrations"),
        ({"max_documents": 0}, "max_documents", "from 1 to 1000"),
        ({"deadline_ms": 50_001}, "deadline_ms", "from 1 to 50000"),
        ({"direction": "revert"}, "direction", "declares no revert"),
    ]
    for options, option, text in cases:
        with pytest.raises(ConfigInvalidError) as caught:
            engine.dry_run(FILE, **options)
        assert text in caught.value.message, options
        assert caught.value.context["option"] == option
        assert caught.value.exit_code == 6
    with pytest.raises(MigrationFileNotFoundError) as missing:
        engine.dry_run("20990101000000_nope.py")
    assert missing.value.exit_code == 8


# ------------------------------------------------------------------------------------ validated


def test_validated_preview_fails_one_document_and_validates_the_rest(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    db.things.create_index("email", unique=True)
    db.things.insert_many([
        {"_id": 1, "email": "A@X.IO", "__v": 1},
        {"_id": 2, "email": "Taken@X.IO", "__v": 1},
        {"_id": 3, "email": "C@X.IO", "__v": 1},
        {"_id": 4, "email": "D@X.IO", "__v": 1},
        {"_id": 9, "email": "taken@x.io", "__v": 2},
    ])
    declarative(project, """
    def migrate(doc, ctx):
        assert ctx.dry_run and ctx.session.in_transaction
        ctx.db["audit"].insert_one({"of": doc["_id"]}, session=ctx.session)
        doc["email"] = doc["email"].lower()
        return doc
    """)
    before = snapshot(db)

    report = engine.dry_run(FILE, first=4, validate=True)

    assert snapshot(db) == before
    assert "audit" not in db.list_collection_names()
    rows = {row["_id"]: row for row in report["documents"]}
    assert [rows[i]["validation"] for i in (1, 2, 3, 4)] == ["ok", "failed", "ok", "ok"]
    assert "E11000" in rows[2]["error"] and "taken@x.io" not in rows[2]["error"]
    assert "after" not in rows[2]
    assert rows[3]["after"] == {"_id": 3, "email": "c@x.io", "__v": 2, "__rev": 1}
    assert report["validated"] is True and report["aborted"] is True
    assert report["migrated"] == 3 and report["failed"] == 1
    assert report["attempts"] == 2  # a fresh sandbox after the failed write
    assert report["refusals"] == []
    inserts = [d for d in report["sideEffects"] if d["collection"] == "audit"]
    assert {d["op"] for d in inserts} == {"insert"} and len(inserts) == 4
    assert all(d["after"]["of"] in (1, 2, 3, 4) for d in inserts)
    writes = [op for op in report["ops"] if op["method"] == "update_one"]
    assert len(writes) == 4 and writes[0]["filter"]["_id"] == 1
    assert [op["seq"] for op in report["ops"]] == sorted({op["seq"] for op in report["ops"]})
    assert exit_code(report) == 0


def test_validated_preview_reports_refusals(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 2)
    declarative(project, """
    def migrate(doc, ctx):
        try:
            ctx.db["things"].drop()
        except Exception:
            pass
        return {**doc, "x": 1}
    """)
    before = snapshot(db)
    report = engine.dry_run(FILE, first=2, validate=True)
    assert snapshot(db) == before
    assert [r["method"] for r in report["refusals"]] == ["drop", "drop"]
    assert report["migrated"] == 2
    assert exit_code(report) == 34


# ------------------------------------------------------------------------------------ steps

BATCH_STEP = """
last = ctx.checkpoint or 0
coll = ctx.db["things"]
seen = coll.count_documents({"touched": True})
batch = list(coll.find({"_id": {"$gt": last}}).sort("_id", 1).limit(2))
for doc in batch:
    coll.update_one({"_id": doc["_id"]}, {"$set": {"touched": True}}, session=ctx.session)
if not batch:
    return {"checkpoint": last, "done": True}
ctx.db["log"].insert_one({"seen": seen})
return {"checkpoint": batch[-1]["_id"], "done": False, "processed": len(batch),
        "migrated": len(batch)}
"""


def test_step_dry_run_chains_checkpoints_sees_earlier_writes_and_writes_nothing(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 5)
    step_file(project, BATCH_STEP)
    before = snapshot(db)

    report = engine.dry_run(STEP_FILE, steps=3)

    assert snapshot(db) == before
    assert report["mode"] == "step" and report["aborted"] is True and report["ok"] is True
    assert report["stoppedBy"] == "steps" and report["attempts"] == 1
    assert [(s["checkpointIn"], s["checkpointOut"]) for s in report["steps"]] == [
        (None, 2), (2, 4), (4, 5)]
    assert report["steps"][0]["processed"] == 2 and report["steps"][0]["done"] is False
    logs = [d for d in report["documents"] if d["collection"] == "log"]
    assert [d["after"]["seen"] for d in logs] == [0, 2, 4]  # each step sees the earlier writes
    updates = [d for d in report["documents"] if d["op"] == "update"]
    assert updates[0]["before"]["_id"] == 1 and updates[0]["after"]["touched"] is True
    methods = [(op["step"], op["method"]) for op in report["ops"]]
    assert methods[:3] == [(1, "count_documents"), (1, "find"), (1, "update_one")]
    assert report["ops"][1]["result"] == {"returned": 2}
    assert report["refusals"] == [] and report["truncated"] is False
    assert exit_code(report) == 0

    done = engine.dry_run(STEP_FILE, steps=10)
    assert done["stoppedBy"] == "done" and len(done["steps"]) == 4
    assert done["steps"][-1]["done"] is True
    limited = engine.dry_run(STEP_FILE, steps=3, max_documents=2)
    assert len(limited["documents"]) == 2 and limited["truncated"] is True
    assert snapshot(db) == before


def test_step_dry_run_starts_from_the_stored_checkpoint(
    project: Any, db: Database[dict[str, Any]], migrator: Migrator, engine: BackgroundEngine
) -> None:
    seed(db, 5)
    step_file(project, BATCH_STEP)
    migrator.up()
    engine.coordinate(STEP_FILE)  # commits the plan: one step partition
    db["_migronaut_background_partitions"].update_one(
        {"background": STEP_FILE}, {"$set": {"cursor": {"checkpoint": 3}}})
    before = snapshot(db)

    stored = engine.dry_run(STEP_FILE)
    assert stored["steps"][0]["checkpointIn"] == 3
    assert stored["steps"][0]["checkpointOut"] == 5
    fresh = engine.dry_run(STEP_FILE, from_start=True)
    assert fresh["steps"][0]["checkpointIn"] is None
    assert snapshot(db) == before


def test_step_options(project: Any, db: Database[dict[str, Any]],
                      engine: BackgroundEngine) -> None:
    step_file(project, "return {'checkpoint': None, 'done': True}")
    for options, option in (({"sample": 3}, "sample"), ({"first": 3}, "first"),
                            ({"direction": "revert"}, "direction"), ({"steps": 51}, "steps")):
        with pytest.raises(ConfigInvalidError) as caught:
            engine.dry_run(STEP_FILE, **options)
        assert caught.value.context["option"] == option
    step_file(project, "return {'checkpoint': None, 'done': True}", revert=True)
    report = engine.dry_run(STEP_FILE, direction="revert")
    assert report["direction"] == "revert" and report["ok"] is True


def test_step_failures_are_reported(project: Any, db: Database[dict[str, Any]],
                                    engine: BackgroundEngine) -> None:
    seed(db, 2)
    step_file(project, "raise RuntimeError('boom')")
    report = engine.dry_run(STEP_FILE, steps=3)
    assert report["ok"] is False and "stoppedBy" not in report
    assert report["steps"] == [{"step": 1, "checkpointIn": None, "error": "RuntimeError: boom"}]
    assert exit_code(report) == 1

    step_file(project, "return {'checkpoint': 1, 'done': 'yes'}")
    report = engine.dry_run(STEP_FILE)
    assert "done a boolean" in report["steps"][0]["error"] and report["ok"] is False

    step_file(project, "return {'checkpoint': 'x' * 70000, 'done': False}")
    report = engine.dry_run(STEP_FILE)
    assert "keep a cursor in it, not data" in report["steps"][0]["error"]


def test_a_failed_write_aborts_the_sandbox_and_later_operations_fail(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 2)
    step_file(project, """
        try:
            ctx.db.things.insert_one({"_id": 1})
        except Exception:
            pass
        ctx.db.things.find_one({"_id": 2})
        return {"checkpoint": None, "done": True}
    """)
    before = snapshot(db)
    report = engine.dry_run(STEP_FILE)
    assert snapshot(db) == before
    assert report["ok"] is False
    assert report["abortedBy"]["method"] == "insert_one"
    assert "E11000" in report["abortedBy"]["error"]
    assert "aborted by an earlier failed operation" in report["steps"][0]["error"]
    assert report["ops"][0]["error"].startswith("DuplicateKeyError")
    assert exit_code(report) == 1


# ------------------------------------------------------------------------------------ refusals

REFUSALS = [
    ("drop", "ctx.db.things.drop()", "drop", "allow-list"),
    ("create_index", "ctx.db['things'].create_index('n')", "create_index", "allow-list"),
    ("command", "ctx.db.command('ping')", "command", "allow-list"),
    ("list_collection_names", "ctx.db.list_collection_names()", "list_collection_names",
     "allow-list"),
    ("another_database", "ctx.client['other_db']", "get_database", "another database"),
    ("another_database_attr", "ctx.client.get_database('other').things.find_one({})",
     "get_database", "another database"),
    ("own_collection", "ctx.db['_migronaut_migrations'].find_one({})", "get_collection",
     "migronaut's own collections"),
    ("partitions_collection", "ctx.db.get_collection('_migronaut_background_partitions')",
     "get_collection", "migronaut's own collections"),
    ("system_collection", "ctx.db['system.views'].find_one({})", "get_collection",
     "system collection"),
    ("out_stage", "list(ctx.db.things.aggregate([{'$match': {}}, {'$out': 'copy'}]))",
     "aggregate", "the $out stage"),
    ("merge_in_facet",
     "list(ctx.db.things.aggregate([{'$facet': {'a': [{'$merge': {'into': 'x'}}]}}]))",
     "aggregate", "the $merge stage"),
    ("lookup_own",
     "list(ctx.db.things.aggregate([{'$lookup': {'from': '_migronaut_migrations', "
     "'localField': 'n', 'foreignField': '_id', 'as': 'm'}}]))",
     "aggregate", "_migronaut_migrations"),
    ("lookup_nested",
     "list(ctx.db.things.aggregate([{'$facet': {'a': [{'$lookup': {'from': 'other', "
     "'pipeline': [{'$unionWith': '_migronaut_locks'}], 'as': 'm'}}]}}]))",
     "aggregate", "_migronaut_locks"),
    ("current_op", "list(ctx.db.aggregate([{'$currentOp': {}}]))", "aggregate",
     "the $currentOp stage"),
    ("user_session",
     "other = MongoClient(os.environ['MIGRONAUT_URI'])\n"
     "with other.start_session() as s:\n"
     "    ctx.db.things.find_one({}, session=s)",
     "find_one", "another session"),
    ("write_concern", "ctx.db.get_collection('things', write_concern=WriteConcern(w=1))",
     "get_collection", "write_concern"),
    ("write_concern_kwarg", "ctx.db.things.insert_one({'a': 1}, write_concern=1)",
     "insert_one", "write_concern"),
    ("bypass", "ctx.db.things.insert_one({'a': 1}, bypass_document_validation=True)",
     "insert_one", "bypass_document_validation"),
    ("secondary",
     "from pymongo import ReadPreference\n"
     "ctx.db.get_collection('things', read_preference=ReadPreference.SECONDARY)",
     "get_collection", "non-primary"),
    ("commit", "ctx.session.commit_transaction()", "commit_transaction", "allow-list"),
    ("start_session", "ctx.client.start_session()", "start_session", "allow-list"),
    ("explain", "ctx.db.things.find({}).explain()", "explain", "allow-list"),
    ("closed_cursor", "c = ctx.db.things.find({})\nc.close()\nnext(c)", "next", "closed"),
]


@pytest.mark.parametrize(("case", "code", "method", "reason"), REFUSALS,
                         ids=[case for case, *_ in REFUSALS])
def test_each_refusal_is_recorded_and_fails_the_dry_run(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine,
    case: str, code: str, method: str, reason: str | None,
) -> None:
    seed(db, 2)
    step_file(project, f"""
try:
{textwrap.indent(code, "    ")}
except Exception as error:
    ctx.db.caught.insert_one({{"type": type(error).__name__}})
    raise
return {{"checkpoint": None, "done": True}}
""")
    before = snapshot(db)
    report = engine.dry_run(STEP_FILE)
    assert snapshot(db) == before
    assert report["ok"] is False
    (refusal,) = report["refusals"]
    assert refusal["method"] == method and refusal["step"] == 1
    if reason is not None:
        assert reason in refusal["reason"]
    assert report["steps"][0]["error"].startswith(
        f"SandboxRefusedError: The dry run refused {method}: ")
    assert exit_code(report) == 34


def test_a_caught_refusal_still_counts(project: Any, db: Database[dict[str, Any]],
                                       engine: BackgroundEngine) -> None:
    seed(db, 1)
    step_file(project, """
        try:
            ctx.db.things.drop()
        except Exception:
            pass
        ctx.db.things.update_one({"_id": 1}, {"$set": {"x": 1}})
        return {"checkpoint": 1, "done": True}
    """)
    report = engine.dry_run(STEP_FILE)
    assert "error" not in report["steps"][0]
    assert report["refusals"][0]["method"] == "drop"
    assert report["ok"] is False and exit_code(report) == 34
    assert db.things.find_one({"_id": 1}) == {"_id": 1, "n": 1, "name": "Name 1", "old": True,
                                              "__v": 1}


def test_allowed_surface_works_inside_the_sandbox(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 4)
    step_file(project, """
        from pymongo import InsertOne, DeleteOne, ReturnDocument
        coll = ctx.client.get_database().get_collection("things")
        assert coll.name == "things" and coll.full_name.endswith(".things")
        assert coll.database.name == ctx.db.name and ctx.session.in_transaction
        assert ctx.session.session_id
        assert [d["_id"] for d in coll.find({}, {"_id": 1}).sort("_id", -1).limit(2)] == [4, 3]
        assert coll.distinct("n") == [1, 2, 3, 4]
        assert list(coll.aggregate([{"$group": {"_id": None, "t": {"$sum": "$n"}}}]))[0]["t"] == 10
        coll.insert_many([{"_id": 10}, {"_id": 11}])
        coll.replace_one({"_id": 10}, {"r": 1})
        coll.update_many({"n": {"$gte": 3}}, {"$inc": {"n": 100}})
        coll.delete_one({"_id": 11})
        coll.find_one_and_update({"_id": 1}, {"$set": {"f": 1}},
                                 return_document=ReturnDocument.AFTER)
        coll.find_one_and_delete({"_id": 2})
        coll.bulk_write([InsertOne({"_id": 20}), DeleteOne({"_id": 20})])
        coll.delete_many({"_id": {"$in": [3]}})
        leaked = coll.find({}).batch_size(1)
        next(leaked)
        return {"checkpoint": {"at": coll.count_documents({})}, "done": True}
    """)
    before = snapshot(db)
    report = engine.dry_run(STEP_FILE)
    assert snapshot(db) == before
    assert report["ok"] is True, report
    assert report["steps"][0]["checkpointOut"] == {"at": 3}
    by_op: dict[str, int] = {}
    for doc in report["documents"]:
        by_op[doc["op"]] = by_op.get(doc["op"], 0) + 1
    assert by_op == {"insert": 2, "update": 4, "delete": 3, "unknown": 1}
    replaced = next(d for d in report["documents"] if d["_id"] == 10 and d["op"] == "update")
    assert replaced["before"] == {"_id": 10} and replaced["after"] == {"_id": 10, "r": 1}
    assert report["leakedCursors"] == 1


def test_filters_over_2_kib_are_truncated(project: Any, db: Database[dict[str, Any]],
                                          engine: BackgroundEngine) -> None:
    seed(db, 1)
    step_file(project, """
        ctx.db.things.find_one({"name": {"$in": ["x" * 100] * 30}})
        ctx.db.things.find_one({"_id": 1})
        return {"checkpoint": None, "done": True}
    """)
    report = engine.dry_run(STEP_FILE)
    big, small = report["ops"]
    assert big["filter"]["$truncated"] is True and big["filter"]["size"] > 2048
    assert small["filter"] == {"_id": 1} and small["result"] == {"returned": 1}


# ------------------------------------------------------------------------------------ deadline


def test_the_deadline_stops_a_step_that_runs_too_long(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 2)
    step_file(project, """
        ctx.db.things.update_one({"_id": 1}, {"$set": {"slow": True}})
        time.sleep(3)
        ctx.db.things.update_one({"_id": 2}, {"$set": {"slow": True}})
        return {"checkpoint": None, "done": True}
    """)
    before = snapshot(db)
    started = time.monotonic()
    report = engine.dry_run(STEP_FILE, deadline_ms=300)
    assert time.monotonic() - started < 2.5
    assert report["stoppedBy"] == "deadline" and report["ok"] is False
    assert report["steps"][0]["error"] == "stopped at the deadline (300 ms)"
    assert len(report["ops"]) == 1
    time.sleep(3)  # the abandoned step wakes up: its second write must not reach the server
    assert snapshot(db) == before


def test_the_deadline_between_steps_stops_cleanly(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine
) -> None:
    seed(db, 1)
    step_file(project, """
        time.sleep(0.15)
        return {"checkpoint": (ctx.checkpoint or 0) + 1, "done": False}
    """)
    report = engine.dry_run(STEP_FILE, steps=50, deadline_ms=400)
    assert report["stoppedBy"] == "deadline"
    assert 1 <= len(report["steps"]) < 50


# ------------------------------------------------------------------------------------ standalone


def test_standalone_servers_refuse_validated_and_step_dry_runs(
    project: Any, tmp_path: Any
) -> None:
    from migronaut.api import Migrator
    from migronaut.devserver import start_subprocess

    with start_subprocess(standalone=True) as server, Migrator(
        uri=server.uri, db_name="standalone", migrations_dir=str(project.migrations),
        env_file=False,
    ) as migrator:
        migrator.db.things.insert_many([{"_id": 1, "n": 1, "__v": 1}])
        declarative(project, MIGRATE)
        step_file(project, "return {'checkpoint': None, 'done': True}")
        engine = migrator.background
        preview = engine.dry_run(FILE, first=1)  # a sample preview works on any topology
        assert preview["migrated"] == 1
        for name, options in ((FILE, {"validate": True}), (STEP_FILE, {})):
            with pytest.raises(TransactionsUnsupportedError) as caught:
                engine.dry_run(name, **options)
            assert caught.value.exit_code == 15


# ------------------------------------------------------------------------------------ I15


def test_logs_and_events_never_contain_documents(
    project: Any, db: Database[dict[str, Any]], migrator: Migrator, engine: BackgroundEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    db.things.create_index("email", unique=True)
    db.things.insert_many([
        {"_id": f"{MARKER}-1", "email": f"{MARKER}@a", "__v": 1},
        {"_id": f"{MARKER}-2", "email": f"{MARKER}@b", "__v": 1},
        {"_id": f"{MARKER}-9", "email": f"{MARKER}@a!", "__v": 2},
    ])
    declarative(project, """
    def migrate(doc, ctx):
        doc["email"] = doc["email"].rstrip("b") + ("a!" if doc["email"].endswith("b") else "")
        return doc
    """)
    step_file(project, f"""
        ctx.db.things.update_one({{"email": "{MARKER}@a"}}, {{"$set": {{"seen": "{MARKER}"}}}})
        ctx.db.things.drop()
    """)
    events: list[dict[str, Any]] = []
    migrator.on("*", events.append)
    caplog.set_level(logging.DEBUG, logger="migronaut")

    preview = engine.dry_run(FILE, first=2)
    validated = engine.dry_run(FILE, first=2, validate=True)
    stepped = engine.dry_run(STEP_FILE)

    assert MARKER in str(preview) and MARKER in str(validated) and MARKER in str(stepped)
    assert validated["failed"] == 1
    for record in caplog.records:
        assert MARKER not in record.getMessage()
        assert MARKER not in str(getattr(record, "__dict__", {}))
    assert MARKER not in str(events)
    assert any("Dry run" in r.getMessage() or "dry run" in r.getMessage()
               for r in caplog.records)


def test_exit_code_mapping() -> None:
    assert exit_code({"mode": "declarative", "migrated": 2, "refusals": []}) == 0
    assert exit_code({"mode": "declarative", "migrated": 0}) == 1
    assert exit_code({"mode": "declarative", "migrated": 3, "refusals": [{}]}) == 34
    assert exit_code({"mode": "step", "ok": True, "refusals": []}) == 0
    assert exit_code({"mode": "step", "ok": False, "refusals": []}) == 1
    assert exit_code({"mode": "step", "ok": False, "refusals": [{}]}) == 34



# ------------------------------------------------------------------------------------ transient


@pytest.fixture
def one_write_conflict(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first ``update_one`` on ``things`` inside a transaction fails with a transient
    WriteConflict (the dev server never raises one); returns the list of injected failures."""
    from pymongo.collection import Collection
    from pymongo.errors import OperationFailure

    original = Collection.update_one
    injected: list[int] = []

    def update_one(self: Any, *args: Any, **kwargs: Any) -> Any:
        session = kwargs.get("session")
        if self.name == "things" and session is not None and session.in_transaction \
                and not injected:
            injected.append(112)
            raise OperationFailure("WriteConflict", code=112, details={
                "errmsg": "WriteConflict", "code": 112,
                "errorLabels": ["TransientTransactionError"]})
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Collection, "update_one", update_one)
    return injected


def test_a_transient_error_reruns_the_step_sandbox(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine,
    one_write_conflict: list[int],
) -> None:
    seed(db, 5)
    step_file(project, BATCH_STEP)
    before = snapshot(db)
    report = engine.dry_run(STEP_FILE, steps=2)
    assert one_write_conflict == [112]
    assert report["attempts"] == 2 and report["ok"] is True
    assert [s["checkpointOut"] for s in report["steps"]] == [2, 4]
    assert all("error" not in op for op in report["ops"])  # the failed attempt is discarded
    assert snapshot(db) == before


def test_a_transient_error_reruns_the_validated_sandbox(
    project: Any, db: Database[dict[str, Any]], engine: BackgroundEngine,
    one_write_conflict: list[int],
) -> None:
    seed(db, 3)
    declarative(project, MIGRATE)
    before = snapshot(db)
    report = engine.dry_run(FILE, first=3, validate=True)
    assert one_write_conflict == [112]
    assert report["attempts"] == 2
    assert [row["validation"] for row in report["documents"]] == ["ok", "ok", "ok"]
    assert snapshot(db) == before
