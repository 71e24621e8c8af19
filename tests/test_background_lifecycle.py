"""Background migrations through their lifecycle: the §2.5 transition table, the plan-commit race
(I8), the once-per-generation roll-up (I7), ``requires`` through the CLI (I17), revert and
withdraw through ``down``, re-registration (``up --force``, ``redo``), inline mode, and the spec
refusals of ``up`` — each arranged in the database, acted on through the CLI or the public API,
and checked on what a user sees and on the stored documents."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from helpers.background import background_file, seed
from helpers.engine import LOCKS, Events, make_migrator, records, wait_until
from migronaut.background.state.rollup import roll_up

B1 = "0001_users_v1.py"
B2 = "0002_orders_v1.py"
C = "0003_contract.py"
STATES = "_migronaut_background"
PARTITIONS = "_migronaut_background_partitions"
CHANGELOG = "_migronaut_migrations"

STATUSES = ("blocked", "pending", "running", "paused", "completed", "failed", "cancelled")


def state(db: Any, name: str = B1) -> dict[str, Any]:
    found = db[STATES].find_one({"_id": name})
    assert found is not None, f"{name} has no state"
    return dict(found)


def output(result: Any) -> str:
    return f"{result.stdout}\n{result.stderr}"


# ------------------------------------------------------------------- §2.5 transition table

#: action -> (allowed from, goes to, already done in) — transcribed from reference §2.5.
TABLE: dict[str, tuple[set[str], str, set[str]]] = {
    "unblock": ({"blocked"}, "pending", {"pending", "running", "paused"}),
    "plan": ({"pending"}, "running", {"running"}),
    "complete": ({"running"}, "completed", {"completed"}),
    "fail": ({"blocked", "pending", "running"}, "failed", {"failed"}),
    "pause": ({"blocked", "pending", "running"}, "paused", {"paused"}),
    "resume": ({"paused"}, "pending", {"blocked", "pending", "running"}),
    "cancel": ({"blocked", "pending", "running", "paused"}, "cancelled", {"cancelled"}),
    "retry": ({"failed", "cancelled"}, "pending", {"pending"}),
    "reopen": ({"completed"}, "running", {"running"}),
}


@pytest.mark.parametrize(
    ("status", "action"), list(itertools.product(STATUSES, [*TABLE, "explode"]))
)
def test_transition_table_is_exhaustive(status: str, action: str) -> None:
    from migronaut.background.state.store import ACTIONS, transition
    from migronaut.errors import BackgroundConflictError

    assert set(ACTIONS) == set(TABLE)
    allowed, to, done = TABLE.get(action, (set(), "", set()))
    if status in allowed:
        assert transition("m.py", status, action) == (to, True)
    elif status in done:
        assert transition("m.py", status, action) == (status, False)
    else:
        with pytest.raises(BackgroundConflictError) as raised:
            transition("m.py", status, action)
        error = raised.value
        assert error.code == "BACKGROUND_CONFLICT" and error.exit_code == 33
        assert error.message == f"Cannot {action} background migration m.py: it is {status}"


def test_every_status_is_reachable_or_terminal_in_the_table() -> None:
    """Terminal statuses (completed, failed, cancelled) leave only through retry/reopen."""
    from migronaut.background.state.store import transition

    for status in ("completed", "failed", "cancelled"):
        leaving = {a for a in TABLE if status in TABLE[a][0]}
        assert leaving <= {"retry", "reopen"}, (status, leaving)
    # a repeated control is idempotent (I16)
    assert transition("m.py", "paused", "pause") == ("paused", False)


# ------------------------------------------------------------------------ I8 plan race


def test_two_plan_commits_for_one_generation_only_one_wins(project: Any, cli: Any,
                                                          db: Any) -> None:
    seed(db, docs=150)
    project.write_migration("0001_users_v1", background_file())
    assert cli("up").exit_code == 0
    migrator = make_migrator(project)
    try:
        engine = migrator.background
        stale = engine.store.require(B1)  # both coordinators read the same state
        job = engine.job(stale)
        first = engine.coordinator.plan_pass(stale, job)
        second = engine.coordinator.plan_pass(stale, job)
    finally:
        migrator.close()

    assert first is None  # committed: the coordinator loops on
    assert second is not None
    assert (second.next, second.reason) == ("wait", "plan-race")
    stored = state(db)
    assert stored["generation"] == 1 and stored["pass"] == 1 and stored["phase"] == "process"
    token = stored["plan"]["token"]
    partitions = list(db[PARTITIONS].find({"background": B1}))
    assert partitions, "the winner's partitions are gone"
    assert {p["plan"] for p in partitions} == {token}  # the loser's partitions were dropped
    assert {p["generation"] for p in partitions} == {1}
    assert len(partitions) == stored["plan"]["partitions"]

    # the migration still runs to completion on the winning plan
    result = cli("background", "run", B1, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json["background"][0]["totals"]["migrated"] == 150


# ------------------------------------------------------------------------ I7 roll-up once


def test_roll_up_twice_counts_totals_once(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=150)
    project.write_migration("0001_users_v1", background_file())
    assert cli("up").exit_code == 0
    assert cli("background", "run", B1, "--once").exit_code == 0  # plan + one round, no finalize
    before = state(db)
    assert before["rolledGeneration"] == 0 and before["generation"] == 1
    partitions = list(db[PARTITIONS].find({"background": B1, "generation": 1}))
    expected = sum(int((p.get("counters") or {}).get("migrated", 0)) for p in partitions)
    assert expected == db.users.count_documents({"__v": 1}) > 0

    migrator = make_migrator(project)
    try:
        engine = migrator.background
        roll_up(engine, before)
        roll_up(engine, before)  # a second finalize with the same (stale) state
    finally:
        migrator.close()

    after = state(db)
    assert after["rolledGeneration"] == 1
    assert after["totals"]["migrated"] == expected
    batches = sum(int((p.get("counters") or {}).get("batches", 0)) for p in partitions)
    assert after["totals"].get("batches", 0) == batches


# ------------------------------------------------------------------------- I17 requires

HOOKS_CONFIG = '''
from pathlib import Path


def before_each(name, ctx, info):
    with open(Path(__file__).parent / "hooks.log", "a", encoding="utf-8") as log:
        log.write(name + "\\n")


config = {"hooks": {"before_each": before_each}}
'''

CONTRACT = f'''
requires = ["{B1}"]


def up(ctx):
    ctx.db.contract_ran.insert_one({{"ran": True}})


def down(ctx):
    ctx.db.contract_ran.delete_many({{}})
'''


def write_requires_chain(project: Any, db: Any) -> None:
    seed(db, "users", 60)
    seed(db, "orders", 40)
    project.write("migronaut_config.py", HOOKS_CONFIG)
    project.write_migration("0001_users_v1", background_file())
    project.write_migration("0002_orders_v1", background_file(
        collection="orders", requires=f'requires = ["{B1}"]'))
    project.write_migration("0003_contract", CONTRACT)


def hook_calls(project: Any) -> list[str]:
    log = project.path / "hooks.log"
    return log.read_text(encoding="utf-8").split() if log.exists() else []


def test_requires_blocks_the_contract_and_the_dependent(project: Any, cli: Any,
                                                        db: Any) -> None:
    write_requires_chain(project, db)
    first = cli("up", "--json")
    assert first.exit_code == 31, first.stderr
    error = first.json["error"]
    assert error["code"] == "BACKGROUND_PENDING"
    assert error["context"]["waitsFor"] == [{"migration": B1, "status": "pending"}]
    assert [(r["file"], r["status"]) for r in first.json["partial"]] == [
        (B1, "applied"), (B2, "applied")]
    assert state(db, B1)["status"] == "pending"
    b2 = state(db, B2)
    assert b2["status"] == "blocked" and b2["waitsFor"] == [B1] and b2["requires"] == [B1]
    assert C not in records(db)  # no failed trace either
    assert C not in hook_calls(project) and hook_calls(project) == [B1, B2]
    assert db.contract_ran.count_documents({}) == 0
    assert db.users.count_documents({"__v": {"$exists": True}}) == 0  # up touched no document

    run = cli("background", "run", B1, "--json")
    assert run.exit_code == 0, run.stderr
    assert state(db, B1)["status"] == "completed"
    b2 = state(db, B2)
    assert b2["status"] == "pending" and b2["waitsFor"] == []
    assert db.orders.count_documents({"__v": 1}) == 0  # unblocked, not run

    second = cli("up", "--json")
    assert second.exit_code == 0, second.stderr
    assert [(r["file"], r["status"]) for r in second.json] == [(C, "applied")]
    assert records(db)[C]["status"] == "applied"
    assert db.contract_ran.count_documents({}) == 1
    assert hook_calls(project)[-1] == C


def test_requires_probe_reopens_a_requirement_whose_old_shape_reappeared(
        project: Any, cli: Any, db: Any) -> None:
    write_requires_chain(project, db)
    assert cli("up").exit_code == 31
    assert cli("background", "run", B1).exit_code == 0
    assert state(db, B1)["status"] == "completed"
    db.users.insert_one({"n": 999})  # an old application version wrote a v0 document

    refused = cli("up", "--json")
    assert refused.exit_code == 31, refused.stderr
    assert refused.json["error"]["code"] == "BACKGROUND_PENDING"
    assert refused.json["error"]["context"]["waitsFor"] == [{"migration": B1, "status": "running"}]
    reopened = state(db, B1)
    assert reopened["status"] == "running" and reopened["reopened"] == 1
    assert reopened["history"][-1]["reason"] == "old-shape documents reappeared"
    assert C not in records(db) and db.contract_ran.count_documents({}) == 0

    # through the API: the drift event names the source and the action
    migrator = make_migrator(project)
    try:
        events = Events(migrator)
        assert cli("background", "run", B1).exit_code == 0
        db.users.insert_one({"n": 1000})
        from migronaut.errors import BackgroundPendingError

        with pytest.raises(BackgroundPendingError):
            migrator.up()
        [drift] = events.of("background:drift")
        assert drift["migration"] == B1 and drift["source"] == "requires"
        assert drift["action"] == "reopened" and "_id" not in drift
    finally:
        migrator.close()

    assert cli("background", "run", B1).exit_code == 0
    applied = cli("up", "--json")
    assert applied.exit_code == 0, applied.stderr
    assert db.users.count_documents({"__v": 1}) == 62
    assert db.contract_ran.count_documents({}) == 1


# ----------------------------------------------------------------------------- revert


def test_down_reverts_documents_end_to_end(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=120)
    project.write_migration("0001_users_v1", background_file())
    assert cli("up").exit_code == 0
    assert cli("background", "run", B1).exit_code == 0
    assert db.users.count_documents({"__v": 1, "__rev": 1, "active": True}) == 120
    forward_registration = state(db)["registration"]

    down = cli("down")
    assert down.exit_code == 0, down.stderr
    assert f"⧗ Reverting {B1}" in output(down)
    reverting = state(db)
    assert reverting["direction"] == "revert" and reverting["status"] == "pending"
    assert reverting["registration"] != forward_registration
    assert db[PARTITIONS].count_documents({"background": B1}) == 0
    assert records(db)[B1]["status"] == "reverted"
    assert db.users.count_documents({"__v": 1}) == 120  # down itself touches no document

    run = cli("background", "run", B1, "--json")
    assert run.exit_code == 0, run.stderr
    assert run.json["background"][0]["totals"]["migrated"] == 120
    assert state(db)["status"] == "completed"
    assert db.users.count_documents({"__v": {"$exists": True}}) == 0  # from 0: field removed
    assert db.users.count_documents({"active": {"$exists": True}}) == 0
    assert db.users.count_documents({"__rev": 2}) == 120  # the revision was raised again


def test_down_without_revert_withdraws_or_refuses(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(revert=False))
    assert cli("up").exit_code == 0
    assert state(db)["status"] == "pending"

    withdrawn = cli("down")
    assert withdrawn.exit_code == 0, withdrawn.stderr
    assert db[STATES].count_documents({"_id": B1}) == 0
    assert db[PARTITIONS].count_documents({"background": B1}) == 0
    assert records(db)[B1]["status"] == "reverted"

    assert cli("up").exit_code == 0
    assert cli("background", "run", B1).exit_code == 0
    refused = cli("down", "--json")
    assert refused.exit_code == 13, refused.stderr
    assert refused.json["error"]["code"] == "MIGRATION_IRREVERSIBLE"
    assert records(db)[B1]["status"] == "applied"
    kept = state(db)
    assert kept["status"] == "completed" and kept["direction"] == "forward"
    assert db.users.count_documents({"__v": 1, "active": True}) == 60


def test_down_withdraws_a_planned_migration_that_rewrote_nothing(
    project: Any, cli: Any, db: Any
) -> None:
    """A plan was committed but no lane wrote yet: ``down`` pauses it, sees no live lease and
    nothing rewritten, and removes it — state and partitions."""
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(revert=False))
    assert cli("up").exit_code == 0
    with make_migrator(project) as migrator:
        assert migrator.background.coordinate(B1).next == "process"  # plan committed, no lane
    assert state(db)["generation"] == 1 and db[PARTITIONS].count_documents({}) > 0

    withdrawn = cli("down")
    assert withdrawn.exit_code == 0, withdrawn.stderr
    assert db[STATES].count_documents({"_id": B1}) == 0
    assert db[PARTITIONS].count_documents({"background": B1}) == 0
    assert records(db)[B1]["status"] == "reverted"
    assert db.users.count_documents({"__v": {"$exists": True}}) == 0


def test_down_refuses_to_withdraw_while_a_lane_holds_a_lease_and_resumes_it(
    project: Any, cli: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from migronaut.background.state.store import BackgroundStore, Lease

    monkeypatch.setattr("migronaut.background.state.registration._DRAIN_S", 0.5)
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(revert=False))
    assert cli("up").exit_code == 0
    with make_migrator(project) as migrator:
        assert migrator.background.coordinate(B1).next == "process"
    planned = state(db)
    store = BackgroundStore(db)
    held = store.claim(B1, generation=1, plan=planned["plan"]["token"], max_parallel=2,
                       ttl_ms=600_000, owner="busy-lane")
    assert isinstance(held, Lease)  # a lane in another process, working

    refused = cli("down", "--json")
    assert refused.exit_code == 33, refused.stderr
    assert refused.json["error"]["code"] == "BACKGROUND_CONFLICT"
    assert "lanes are still working" in refused.json["error"]["message"]
    kept = state(db)
    assert kept["status"] == "running" and kept["registration"] == planned["registration"]
    assert [h["action"] for h in kept["history"][-2:]] == ["pause", "resume"]
    assert records(db)[B1]["status"] == "applied"
    assert db[PARTITIONS].count_documents({"background": B1}) == planned["plan"]["partitions"]


# ------------------------------------------------------------------------ re-registration


def test_up_force_and_redo_re_register(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=100)
    project.write_migration("0001_users_v1", background_file())
    assert cli("up").exit_code == 0
    assert cli("background", "run", B1).exit_code == 0
    done = state(db)
    assert done["status"] == "completed" and done["totals"]["migrated"] == 100
    assert db[PARTITIONS].count_documents({"background": B1}) > 0

    forced = cli("up", B1, "--force", "--yes")
    assert forced.exit_code == 0, forced.stderr
    again = state(db)
    assert again["registration"] != done["registration"]
    assert again["status"] == "pending" and again["direction"] == "forward"
    assert (again["pass"], again["generation"], again["totals"]) == (0, 0, {})
    assert "plan" not in again and "completedAt" not in again
    assert db[PARTITIONS].count_documents({"background": B1}) == 0
    assert again["history"][: len(done["history"])] == done["history"]  # history kept
    assert again["history"][-1]["action"] == "register"
    previous = again["previous"]
    assert previous["registration"] == done["registration"]
    assert previous["status"] == "completed" and previous["direction"] == "forward"
    assert previous["totals"]["migrated"] == 100 and "completedAt" in previous

    rerun = cli("background", "run", B1, "--json")  # documents already at `to` no longer match
    assert rerun.exit_code == 0, rerun.stderr
    assert rerun.json["background"][0]["totals"].get("migrated", 0) == 0
    assert db.users.count_documents({"__rev": 1}) == 100

    redo = cli("redo")
    assert redo.exit_code == 0, redo.stderr
    redone = state(db)
    assert redone["direction"] == "forward" and redone["status"] == "pending"
    assert redone["registration"] != again["registration"]
    directions = [h.get("direction") for h in redone["history"] if h["action"] == "register"]
    assert directions[-2:] == ["revert", "forward"]
    assert records(db)[B1]["status"] == "applied"


# ----------------------------------------------------------------------------- inline


def test_inline_up_runs_the_migration_to_completion(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=120)
    project.write_migration("0001_users_v1", background_file())
    result = cli("up", env={"MIGRONAUT_BACKGROUND_INLINE": "true"})
    assert result.exit_code == 0, result.stderr
    assert db.users.count_documents({"__v": 1, "__rev": 1, "active": True}) == 120
    stored = state(db)
    assert stored["status"] == "completed" and stored["totals"]["migrated"] == 120
    assert records(db)[B1]["status"] == "applied"
    assert db[PARTITIONS].count_documents({"lease": {"$exists": True}}) == 0


def test_inline_failure_exits_32(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(
        fail_on=5, extra_spec='"max_document_errors": 0,'))
    result = cli("up", "--json", env={"MIGRONAUT_BACKGROUND_INLINE": "true"})
    assert result.exit_code == 32, result.stderr
    assert result.json["error"]["code"] == "BACKGROUND_FAILED"
    assert state(db)["status"] == "failed"
    assert db.users.count_documents({"n": 5, "__v": {"$exists": True}}) == 0


# ------------------------------------------------------------------------- spec refusal


def assert_nothing_registered(db: Any) -> None:
    assert db[STATES].count_documents({}) == 0
    assert db[CHANGELOG].count_documents({}) == 0


def test_up_refuses_an_invalid_spec_before_writing(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=10)
    project.write_migration("0001_users_v1", background_file(extra_spec='"batch_size": 0,')
                            .replace('"batch_size": 50,', ""))
    result = cli("up", "--json")
    assert result.exit_code == 20, result.stderr
    assert result.json["error"]["code"] == "MIGRATION_INVALID_EXPORT"
    assert "background.batch_size" in result.json["error"]["message"]
    assert_nothing_registered(db)
    assert db.users.count_documents({"__v": {"$exists": True}}) == 0


def test_up_refuses_the_untouched_skeleton(project: Any, cli: Any, db: Any) -> None:
    assert cli("create", "backfill", "--background").exit_code == 0
    result = cli("up", "--json")
    assert result.exit_code == 20, result.stderr
    assert "placeholder" in result.json["error"]["message"]
    assert_nothing_registered(db)


def test_up_refuses_a_background_file_that_also_defines_up(project: Any, cli: Any,
                                                           db: Any) -> None:
    project.write_migration("0001_users_v1", background_file(up_too=True))
    result = cli("up", "--json")
    assert result.exit_code == 20, result.stderr
    assert result.json["error"]["code"] == "MIGRATION_INVALID_EXPORT"
    assert_nothing_registered(db)


# --------------------------------------------------------------- hardening

SLOW = '''
import time


def migrate(doc, ctx):
    time.sleep(0.01)
    doc["active"] = True
    return doc


background = {{
    "collection": "users",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 25,
    "pause_ms": 0,
    "slice_ms": 1000,
    "max_parallel": {max_parallel},
    "adaptive": False,
    "partitions": {{"min_partition_docs": 50}},
}}
'''


def test_a_replan_rolls_up_the_superseded_plan_so_totals_count_every_document(
    project: Any, cli: Any, db: Any
) -> None:
    """``repin`` of a changed ``max_parallel`` supersedes the open partitions and plans again;
    what the superseded plan migrated still counts: ``totals.migrated`` equals the documents
    migrated (it once reported 521 for 600)."""
    seed(db, docs=600)
    project.write_migration("0001_users_v1", SLOW.format(max_parallel=2))
    assert cli("up").exit_code == 0
    assert cli("background", "run", B1, "--once").exit_code == 0  # plan + one slice per lane
    first = state(db)
    assert first["generation"] == 1 and 0 < db.users.count_documents({"__v": 1}) < 600

    project.write_migration("0001_users_v1", SLOW.format(max_parallel=3))
    repinned = cli("background", "repin", B1, "--yes", "--json")
    assert repinned.exit_code == 0, repinned.stderr
    assert repinned.json["replan"] is True
    finished = cli("background", "run", B1, "--json")
    assert finished.exit_code == 0, finished.stderr

    done = state(db)
    assert done["status"] == "completed" and done["generation"] >= 2
    assert db.users.count_documents({"__v": 1, "__rev": 1, "active": True}) == 600
    assert done["totals"]["migrated"] == 600
    assert done["totals"]["scanned"] == 600
    assert finished.json["background"][0]["totals"]["migrated"] == 600


def test_plans_and_registrations_are_stored_as_the_node_original_writes_them(
    project: Any, cli: Any, db: Any
) -> None:
    import re

    from migronaut.background.planning.id_ranges import plan_id_ranges

    spec = {"batchSize": 50, "maxParallel": 2, "partitions": {"minPartitionDocs": 50}}
    db.small.insert_many([{"_id": i} for i in range(300)])
    db.large.insert_many([{"_id": i} for i in range(500)])
    db.one.insert_many([{"_id": i} for i in range(20)])
    assert plan_id_ranges(db.small, {}, spec).method == "match-first"  # 300 < 8 × 50
    assert plan_id_ranges(db.large, {}, spec).method == "sample-first"  # the count hit its cap
    assert plan_id_ranges(db.one, {}, spec).method == "single"
    assert plan_id_ranges(db.empty, {}, spec).method == "empty"

    seed(db, docs=300)
    project.write_migration("0001_users_v1", background_file())
    assert cli("up").exit_code == 0
    registration = state(db)["registration"]
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                        registration), registration
    assert cli("background", "run", B1).exit_code == 0
    assert state(db)["plan"]["method"] == "match-first"

    # what older versions stored (a hex registration, method 'sampled') still reads
    db[STATES].update_one({"_id": B1}, {"$set": {"registration": "ab" * 16,
                                                 "plan.method": "sampled"}})
    shown = cli("background", "status", B1, "--json")
    assert shown.exit_code == 0, shown.stderr
    view = shown.json["background"][0]
    assert view["registration"] == "ab" * 16 and view["plan"]["method"] == "sampled"


def test_up_prints_every_problem_of_an_invalid_spec(project: Any, cli: Any, db: Any) -> None:
    seed(db, docs=10)
    project.write_migration("0001_users_v1", background_file(
        extra_spec='"batch_size": 0, "max_passes": 0, "colour": "blue",')
        .replace('"batch_size": 50,', "").replace('"pause_ms": 0,', '"pause_ms": -1,'))
    result = cli("up")
    assert result.exit_code == 20
    lines = result.stderr.splitlines()
    assert lines[0].startswith("✖ MIGRATION_INVALID_EXPORT: Invalid background migration "
                               f"{B1}: ")
    listed = [line.strip() for line in lines[1:] if line.strip().startswith("•")]
    for path in ("background.batch_size", "background.pause_ms", "background.max_passes",
                 "background.colour"):
        assert any(line.startswith(f"• {path}: ") for line in listed), (path, result.stderr)
    assert len(listed) == 4
    assert_nothing_registered(db)

    as_json = cli("up", "--json")
    assert as_json.exit_code == 20
    assert len(as_json.json["error"]["context"]["issues"]) == 4


def test_run_migrations_can_stop_before_a_migration_waiting_for_background_work(
    project: Any, db: Any
) -> None:
    """``on_background_pending="stop"``: everything before the waiting migration applies, the
    run ends cleanly (no error, lock released, no record for it or anything after), the summary
    says what it waits for and ``background:waiting`` is emitted."""
    from migronaut import run_migrations
    from migronaut.errors import BackgroundPendingError, ConfigInvalidError

    write_requires_chain(project, db)
    project.write_migration("0004_after", "def up(ctx):\n    ctx.db.after.insert_one({})\n"
                            "\n\ndef down(ctx):\n    pass\n")
    events: list[dict[str, Any]] = []
    summary = run_migrations(uri=project.uri, db_name=project.db_name, cwd=project.path,
                             env_file=False, on_background_pending="stop",
                             on_migrator=lambda m: m.on("*", events.append))
    assert [(r.file, r.status) for r in summary.applied] == [(B1, "applied"), (B2, "applied")]
    assert summary.up_to_date is False
    assert summary.waiting == [{"migration": C,
                                "waitsFor": [{"migration": B1, "status": "pending"}]}]
    assert summary.to_dict()["waiting"] == summary.waiting
    waiting = [e for e in events if e["event"] == "background:waiting"]
    assert [(e["migration"], e["waitsFor"]) for e in waiting] == [
        (C, [{"migration": B1, "status": "pending"}])]
    ended = [e for e in events if e["event"] == "run:end"]
    assert ended and ended[-1]["success"] is True
    assert set(records(db)) == {B1, B2}  # nothing for the waiting one, nor after it
    assert db.contract_ran.count_documents({}) == 0 and db.after.count_documents({}) == 0
    assert C not in hook_calls(project)
    assert db[LOCKS].count_documents({"_id": "migronaut_lock"}) == 0

    with pytest.raises(BackgroundPendingError):  # the default is still an error
        run_migrations(uri=project.uri, db_name=project.db_name, cwd=project.path,
                       env_file=False)
    with pytest.raises(ConfigInvalidError, match="on_background_pending"):
        run_migrations(uri=project.uri, db_name=project.db_name, cwd=project.path,
                       env_file=False, on_background_pending="wait")  # type: ignore[arg-type]

    assert cli_run_background(project) == 0
    done = run_migrations(uri=project.uri, db_name=project.db_name, cwd=project.path,
                          env_file=False, on_background_pending="stop")
    assert [(r.file, r.status) for r in done.applied] == [(C, "applied"),
                                                          ("0004_after.py", "applied")]
    assert done.waiting == [] and done.up_to_date is False


def cli_run_background(project: Any) -> int:
    with make_migrator(project) as migrator:
        migrator.background.drive(B1)
    return 0


# ---------------------------------------------------------------- fixed costs of a migration


def test_a_one_partition_migration_costs_few_commands_beyond_its_batches(
    project: Any, cli: Any, db: Any
) -> None:
    """``drive`` of a migration planned as one partition: the plan and the close read the state
    they need once, the version index is listed once (coordinator and lane share it), nothing
    probes the collection's ``_id`` brackets or asks ``hello``, and the lane claims once — its
    partition, with the document it wrote — and does not claim again once it is done.

    Each step's driver record rides on the write the step makes (the plan commit, the roll-up):
    no ``update`` of the state of its own; the close counts the partitions from the one read the
    roll-up sums; the view returned reads its counts and live leases in one ``aggregate``."""
    import threading

    from pymongo import monitoring

    seed(db, docs=120)
    project.write_migration("0001_users_v1", background_file(
        extra_spec='"max_parallel": 1, "partitions": {"min_partition_docs": 500},'))
    assert cli("up").exit_code == 0
    sent: list[tuple[str, str, str]] = []

    class Commands(monitoring.CommandListener):
        def started(self, event: Any) -> None:
            target = event.command.get(event.command_name)
            sent.append((threading.current_thread().name, event.command_name,
                         target if isinstance(target, str) else ""))

        def succeeded(self, event: Any) -> None:
            pass

        def failed(self, event: Any) -> None:
            pass

    with make_migrator(project, client_options={"event_listeners": [Commands()]}) as migrator:
        migrator.background.ready()
        sent.clear()
        view = migrator.background.drive(B1)
    assert view["status"] == "completed" and view["totals"]["migrated"] == 120
    assert view["partitions"]["total"] == 1
    caller = [(name, target) for thread, name, target in sent if thread == "MainThread"]
    lane = [(name, target) for thread, name, target in sent
            if thread.startswith("migronaut-lane-")]
    assert ("hello", "") not in caller and ("find", "users") not in caller
    assert [c for c in sent if c[1] == "listIndexes"] == [("MainThread", "listIndexes", "users")]
    assert caller.count(("find", STATES)) <= 3  # each step's read, the unblock check
    assert ("update", STATES) not in caller  # the coordinator stamp is never a write alone
    assert caller.count(("find", PARTITIONS)) == 1  # the close: counted and rolled up from it
    assert caller.count(("aggregate", PARTITIONS)) == 1  # the view: counts and live leases
    assert len([c for c in caller if c[0] != "endSessions"]) <= 17  # 8 + 8 + the view
    stored = state(db)
    assert stored["coordinator"]["kind"] == "local" and stored["coordinator"]["at"]
    assert view["coordinator"] == stored["coordinator"] and view["liveLeases"] == 0
    claims = [c for c in lane if c == ("findAndModify", PARTITIONS)]
    assert lane[0] == ("findAndModify", PARTITIONS) and len(claims) == 1, lane
    assert ("find", PARTITIONS) not in lane  # no slot listing, no read-back of the claim


def _drive_in_thread(project: Any) -> tuple[Any, dict[str, Any]]:
    """``drive`` of B1 in a thread of its own; the dict gets its view (or its error)."""
    import threading

    out: dict[str, Any] = {}

    def drive() -> None:
        try:
            with make_migrator(project) as migrator:
                out["view"] = migrator.background.drive(B1)
        except BaseException as error:
            out["error"] = error

    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    return thread, out


def test_a_drive_that_finds_the_coordinator_lock_held_looks_again_soon(
    project: Any, cli: Any, db: Any
) -> None:
    """Another process's coordinator step holds ``background:<name>`` for milliseconds: a drive
    that found it held asks again within a second or so, not after the lock's ttl/2 (30 s by
    default), and goes on to finish the migration once the lock is free."""
    from helpers.background import hold_coordinator
    from helpers.wire_audit import AUDIT

    seed(db, docs=120)
    project.write_migration("0001_users_v1", background_file())
    assert cli("up").exit_code == 0
    hold_coordinator(db, B1)
    with AUDIT.recording() as sent:
        thread, out = _drive_in_thread(project)
        wait_until(lambda: sum(1 for s in list(sent) if (s.command, s.target) == (
            "update", LOCKS)) >= 2, what="a second try of the coordinator lock")
    db[LOCKS].delete_one({"_id": f"background:{B1}"})
    thread.join(60)
    assert "error" not in out, out
    assert out["view"]["status"] == "completed" and out["view"]["totals"]["migrated"] == 120


def test_a_drive_starts_no_lane_while_lanes_elsewhere_lease_every_open_partition(
    project: Any, cli: Any, db: Any
) -> None:
    """When every open partition is leased by another process's lanes, a lane of this drive
    could only claim nothing and hand back to a step at once — a loop of steps and empty claims
    for as long as the other lanes work. The drive sends no claim and steps again later; once
    the lease is given back it claims the partition and finishes the migration."""
    import datetime as dt

    from helpers.wire_audit import AUDIT

    seed(db, docs=120)
    project.write_migration("0001_users_v1", background_file(  # two slots, one partition
        extra_spec='"partitions": {"min_partition_docs": 500},'))
    assert cli("up").exit_code == 0
    with make_migrator(project) as migrator:
        assert migrator.background.coordinate(B1).next == "process"
    assert db[PARTITIONS].count_documents({"background": B1}) == 1
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    held = db[PARTITIONS].update_one({"background": B1}, {"$set": {"status": "running", "lease": {
        "slot": 0, "token": "elsewhere", "owner": "other", "host": "other-host", "pid": 4242,
        "ttlMs": 60_000, "renewedAt": now, "claimedAt": now}}})
    assert held.modified_count == 1
    with AUDIT.recording() as sent:
        thread, out = _drive_in_thread(project)
        wait_until(lambda: sum(1 for s in list(sent) if (s.command, s.target) == (
            "update", LOCKS)) >= 3, what="three coordinator steps")
        claims = [s for s in list(sent) if (s.command, s.target) == ("findAndModify", PARTITIONS)]
        assert claims == []  # not a lane started while the partition was leased elsewhere
    db[PARTITIONS].update_one({"background": B1}, {"$unset": {"lease": ""}})
    thread.join(60)
    assert "error" not in out, out
    assert out["view"]["status"] == "completed" and out["view"]["totals"]["migrated"] == 120
    assert db["users"].count_documents({"active": True}) == 120


def test_a_step_that_neither_commits_nor_closes_still_records_its_driver(
    project: Any, cli: Any, db: Any
) -> None:
    """The coordinator stamp (reference background §3.1, 5) lands with every step that gets
    past the blocked check: with the plan commit, alone when the step only answers ``process``
    (a plan with open partitions), and alone when the step raises after it."""
    from migronaut.background.coordination.coordinator import Coordinator
    from migronaut.errors import ConfigInvalidError

    seed(db, docs=30)
    project.write_migration("0001_users_v1", background_file(extra_spec='"max_parallel": 1,'))
    assert cli("up").exit_code == 0
    with make_migrator(project) as migrator:
        assert migrator.background.coordinate(B1, driver="cli").next == "process"  # commits
        first = state(db)["coordinator"]
        assert first["kind"] == "cli"
        answer = migrator.background.coordinate(B1, driver="runner")  # open partitions: no write
        assert answer.next == "process"
        second = state(db)["coordinator"]
        assert second["kind"] == "runner" and second["at"] >= first["at"]
        assert state(db)["generation"] == 1  # nothing replanned

    def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConfigInvalidError("refused by the test")

    db[STATES].update_one({"_id": B1}, {"$set": {"phase": "partition"}})  # plans again
    original = Coordinator._plan_collection
    Coordinator._plan_collection = refused  # type: ignore[method-assign]
    try:
        with make_migrator(project) as migrator, pytest.raises(ConfigInvalidError):
            migrator.background.coordinate(B1, driver="inline")
    finally:
        Coordinator._plan_collection = original  # type: ignore[method-assign]
    third = state(db)["coordinator"]
    assert third["kind"] == "inline" and third["at"] >= second["at"]
    assert state(db)["generation"] == 1  # the refused plan committed nothing


@pytest.mark.parametrize("junk", ["3", 1.5, -1, True, {"n": 1}])
def test_a_stored_round_migronaut_does_not_understand_stops_a_queue_coordinator(
    project: Any, cli: Any, db: Any, junk: Any
) -> None:
    """Fail closed: a ``round`` that is not a non-negative integer is ``STATE_INVALID`` naming
    the field, never taken as some round (a chain would supersede or resume the wrong one);
    nothing is written."""
    from migronaut.errors import StateInvalidError

    seed(db, docs=10)
    project.write_migration("0001_users_v1", background_file(extra_spec='"max_parallel": 1,'))
    assert cli("up").exit_code == 0
    db[STATES].update_one({"_id": B1}, {"$set": {"round": junk}})
    before = state(db)
    with make_migrator(project) as migrator, pytest.raises(StateInvalidError) as caught:
        migrator.background.coordinate(B1, driver="celery")
    assert caught.value.code == "STATE_INVALID" and caught.value.exit_code == 35
    assert "round" in caught.value.message and B1 in caught.value.message
    assert caught.value.context["problems"][0]["field"] == "round"
    after = state(db)
    assert after["round"] == junk and after.get("coordinator") == before.get("coordinator")


def test_a_glance_answers_without_the_lock_only_what_a_step_would(
    project: Any, cli: Any, db: Any
) -> None:
    """``glance`` (a queue's re-check, a lane that found nothing to claim): ``done`` for a
    migration that is finished, paused or not registered; ``process`` with no lane to add only
    while live leases of the current plan cover every open partition a lane could take (up to
    ``maxParallel``) in the chain's round; ``None`` — a step under the lock — otherwise. It
    takes no lock and writes nothing."""
    from migronaut.background.state.store import BackgroundStore, Lease

    seed(db, docs=60)
    project.write_migration("0001_users_v1", background_file(extra_spec='"max_parallel": 2,'))
    assert cli("up").exit_code == 0
    with make_migrator(project) as migrator:
        engine = migrator.background
        assert engine.glance("0009_nothing.py") is not None
        assert engine.glance("0009_nothing.py").next == "done"  # type: ignore[union-attr]
        assert engine.glance(B1) is None  # pending: only a step plans
        assert engine.coordinate(B1, driver="celery").next == "process"  # commits round 1
        planned = state(db)
        token, partitions = planned["plan"]["token"], planned["plan"]["partitions"]
        assert partitions >= 2, "the test needs a plan of two partitions or more"
        assert engine.glance(B1, round=1) is None  # open partitions, no lane: fan out
        store = BackgroundStore(db)
        leases = []
        held = store.claim(B1, generation=1, plan=token, max_parallel=2, ttl_ms=600_000,
                           owner="lane-a")
        assert isinstance(held, Lease)
        leases.append(held)
        assert engine.glance(B1, round=1) is None  # one lane where two could work
        held = store.claim(B1, generation=1, plan=token, max_parallel=2, ttl_ms=600_000,
                           owner="lane-b")
        assert isinstance(held, Lease)
        leases.append(held)
        stamped = state(db).get("coordinator")
        busy = engine.glance(B1, round=1)
        assert busy is not None and busy.next == "process" and busy.lanes == 0
        assert busy.generation == 1 and busy.round == 1
        assert engine.glance(B1) is not None  # a driver without rounds: the same
        assert engine.glance(B1, round=2) is None  # not this chain's round: a step supersedes
        assert db[LOCKS].count_documents({"_id": f"background:{B1}"}) == 0
        assert state(db).get("coordinator") == stamped  # nothing written
        # an expired lease does not count as a lane at work
        db[PARTITIONS].update_one({"_id": leases[1].partition_id},
                                  {"$set": {"lease.ttlMs": 1}})
        assert engine.glance(B1, round=1) is None
        # another generation's live leases do not count either
        db[PARTITIONS].update_one({"_id": leases[0].partition_id}, {"$set": {"lease.ttlMs": 1}})
        db[PARTITIONS].update_one({"_id": leases[1].partition_id},
                                  {"$set": {"lease.ttlMs": 600_000, "generation": 7}})
        assert engine.glance(B1, round=1) is None
        db[STATES].update_one({"_id": B1}, {"$set": {"status": "paused"}})
        paused = engine.glance(B1, round=1)
        assert paused is not None and (paused.next, paused.status) == ("done", "paused")
        db[STATES].update_one({"_id": B1}, {"$set": {"status": "completed"}})
        finished = engine.glance(B1, round=1)
        assert finished is not None and (finished.next, finished.status) == ("done", "completed")


@pytest.mark.parametrize(("field", "junk"), [
    ("status", "weird"), ("status", 3), ("phase", 7), ("phase", "plan"), ("generation", "1"),
    ("generation", -1), ("plan", "tok"), ("plan", {"partitions": 1}), ("schema", "x"),
    ("schema", True),
])
def test_a_state_field_the_coordinator_does_not_understand_stops_it(
    project: Any, cli: Any, db: Any, field: str, junk: Any
) -> None:
    """Fail closed: a coordinator step, a glance, a lane slice (a Celery lane task's, and the
    runner's of ``background work``) and ``background run`` refuse a state whose ``status``,
    ``phase``, ``generation``, ``plan`` or ``schema`` migronaut does not know with
    ``STATE_INVALID`` (exit 35) naming the field — never read as some status (an unknown one used
    to end a chain as ``done``, and a lane as "nothing to claim"), or as "plan again" (an unknown
    phase used to replan) — and write nothing: no stamp, no plan, no lease, no lock left."""
    from migronaut.background.runner import BackgroundRunner
    from migronaut.errors import StateInvalidError

    seed(db, docs=20)
    project.write_migration("0001_users_v1", background_file(extra_spec='"max_parallel": 1,'))
    assert cli("up").exit_code == 0
    with make_migrator(project) as migrator:
        assert migrator.background.coordinate(B1, driver="celery").next == "process"
    db[STATES].update_one({"_id": B1}, {"$set": {field: junk}})
    before = state(db)
    partitions = db[PARTITIONS].count_documents({})
    with make_migrator(project) as migrator:
        engine = migrator.background
        runner = BackgroundRunner(migrator, lanes=1)
        for attempt in (lambda: engine.glance(B1, round=1),
                        lambda: engine.coordinate(B1, driver="celery", round=1),
                        lambda: engine.run_slice(B1, ref="lane-task"),
                        lambda: runner._slice(engine, B1)):
            with pytest.raises(StateInvalidError) as caught:
                attempt()
            assert caught.value.code == "STATE_INVALID" and caught.value.exit_code == 35
            assert f"has a {field} migronaut does not understand" in caught.value.message
            assert caught.value.context["problems"][0]["field"] == field
            assert caught.value.context["record"] == B1
    refused = cli("background", "run", B1, "--once", "--json")
    assert refused.exit_code == 35, refused.stderr
    assert refused.json["error"]["code"] == "STATE_INVALID"
    assert state(db) == before
    assert db[PARTITIONS].count_documents({}) == partitions
    assert db[PARTITIONS].count_documents({"lease": {"$exists": True}}) == 0
    assert db[LOCKS].count_documents({"_id": f"background:{B1}"}) == 0
