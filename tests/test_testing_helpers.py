"""``migronaut.testing`` helpers in-process: snapshots and their diff, the reversibility checks.

The pytest plugin around them is exercised end to end in ``test_testing_plugin.py``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from bson.int64 import Int64

from helpers.engine import CHANGELOG, LOCKS, applied, make_migrator
from helpers.testing_project import (
    FILES,
    INDEX,
    NORMALISE,
    SPLIT,
    seed_users,
    write_migrations,
)
from migronaut import ConfigInvalidError, MigrationFileNotFoundError, MigrationInvalidNameError
from migronaut.testing import (
    assert_all_reversible,
    assert_reversible,
    migrate_before,
    snapshot,
)

# ------------------------------------------------------------------------------- snapshots


def test_snapshot_holds_user_collections_only(db: Any) -> None:
    db.users.insert_one({"_id": 1})
    for own in (CHANGELOG, LOCKS, "_migronaut_background", "_migronaut_background_partitions",
                "_migronaut_runs"):
        db[own].insert_one({"_id": 1})
    taken = snapshot(db)
    assert list(taken.collections) == ["users"]
    assert taken.database == db.name
    assert list(taken.collections["users"].indexes) == ["_id_"]


def test_snapshot_of_a_migrator_leaves_out_its_configured_collections(project: Any) -> None:
    write_migrations(project.migrations, (INDEX,))
    with make_migrator(project, migrations_collection="changelog",
                       lock_collection="locks", background_collection="bg") as migrator:
        migrator.up()
        migrator.db["bg_partitions"].insert_one({"_id": 1})
        migrator.db["bg_images"].insert_one({"_id": 1})  # a user's, despite its name
        taken = snapshot(migrator)
        assert sorted(taken.collections) == ["bg_images", "settings", "users"]
        assert "changelog" in snapshot(migrator.db).collections  # a bare Database keeps it
        assert sorted(snapshot(migrator, exclude=["settings", "bg_images"]).collections) == [
            "users"]


def test_equal_data_gives_no_diff_and_compares_equal(db: Any) -> None:
    db.users.insert_many([{"_id": 1, "a": {"x": 1, "y": 2}}, {"_id": 2}])
    db.users.create_index("a", name="a_idx")
    first, second = snapshot(db), snapshot(db)
    assert first.diff(second) is None
    assert first == second


def test_top_level_field_order_is_ignored_nested_order_is_not(db: Any) -> None:
    db.users.insert_one({"_id": 1, "a": 1, "b": {"x": 1, "y": 2}})
    before = snapshot(db)
    db.users.replace_one({"_id": 1}, {"b": {"x": 1, "y": 2}, "a": 1})
    assert snapshot(db) == before
    db.users.replace_one({"_id": 1}, {"a": 1, "b": {"y": 2, "x": 1}})
    problem = before.diff(snapshot(db))
    assert problem is not None and "fields: 'b' changed" in problem


@pytest.mark.parametrize("changed", [Int64(5), 5.0, True, "5"], ids=repr)
def test_values_are_compared_as_bson_types(db: Any, changed: Any) -> None:
    db.things.insert_one({"_id": 1, "n": 5 if changed is not True else 1})
    before = snapshot(db)
    db.things.update_one({"_id": 1}, {"$set": {"n": changed}})
    assert before.diff(snapshot(db)) is not None


def test_the_diff_names_the_first_differing_document_on_both_sides(db: Any) -> None:
    db.users.insert_many([{"_id": i, "name": f"user {i}"} for i in range(1, 5)])
    db.audit.insert_one({"_id": 1})
    before = snapshot(db)
    db.users.update_one({"_id": 3}, {"$set": {"first": "user"}, "$unset": {"name": ""}})
    db.users.update_one({"_id": 4}, {"$set": {"name": "changed"}})
    db.users.delete_one({"_id": 2})
    db.users.insert_one({"_id": 9})
    db.audit.delete_many({})
    db.zeta.insert_one({"_id": 1})
    after = snapshot(db)
    assert before.diff(after, labels=("before up", "after down")) == "\n".join([
        "collection 'audit': documents differ (1 only before up, of 1)",
        "  first difference, _id 1:",
        "    before up : {'_id': 1}",
        "    after down: (absent)",
        "2 more collection(s) differ: 'users', 'zeta'",
    ])
    users_only = {"users": after.collections["users"]}
    assert before.diff(replace(after, collections=users_only), labels=("a", "b")) == "\n".join([
        "collection 'audit' exists only a (1 document(s); indexes: none besides _id)",
        "1 more collection(s) differ: 'users'",
    ])
    before_users = replace(before, collections={"users": before.collections["users"]})
    assert before_users.diff(replace(after, collections=users_only), labels=("a", "b")) == (
        "\n".join([
            "collection 'users': documents differ (2 changed, 1 only a, 1 only b, of 5)",
            "  first difference, _id 2:",
            "    a: {'_id': 2, 'name': 'user 2'}",
            "    b: (absent)",
        ])
    )


def test_a_document_only_after_is_shown_when_nothing_else_differs(db: Any) -> None:
    db.users.insert_one({"_id": 1})
    before = snapshot(db)
    db.users.insert_one({"_id": 2, "name": "new"})
    assert before.diff(snapshot(db)) == "\n".join([
        "collection 'users': documents differ (1 only after, of 2)",
        "  first difference, _id 2:",
        "    before: (absent)",
        "    after : {'_id': 2, 'name': 'new'}",
    ])


def test_a_changed_document_lists_its_changed_fields(db: Any) -> None:
    db.users.insert_one({"_id": 1, "name": "Ada Lovelace", "age": 36})
    before = snapshot(db)
    db.users.replace_one({"_id": 1}, {"first": "Ada", "last": "Lovelace", "age": 37})
    assert before.diff(snapshot(db)) == "\n".join([
        "collection 'users': documents differ (1 changed, of 1)",
        "  first difference, _id 1:",
        "    before: {'_id': 1, 'name': 'Ada Lovelace', 'age': 36}",
        "    after : {'_id': 1, 'first': 'Ada', 'last': 'Lovelace', 'age': 37}",
        "    fields: 'age' changed; 'name' only before; 'first', 'last' only after",
    ])


def test_long_documents_are_shortened_in_the_diff(db: Any) -> None:
    db.blobs.insert_one({"_id": 1, "text": "x" * 5000})
    before = snapshot(db)
    db.blobs.update_one({"_id": 1}, {"$set": {"text": "y" * 5000}})
    problem = before.diff(snapshot(db))
    assert problem is not None and len(problem) < 1200 and "…" in problem


def test_an_empty_plain_collection_counts_as_absent(db: Any) -> None:
    before = snapshot(db)
    db.things.insert_one({"_id": 1})
    db.things.delete_many({})
    assert "things" in snapshot(db).collections
    assert snapshot(db) == before


def test_an_empty_collection_with_an_index_or_options_is_a_difference(db: Any) -> None:
    before = snapshot(db)
    db.things.create_index("k", name="k_idx")
    assert before.diff(snapshot(db)) == (
        "collection 'things' exists only after (0 document(s); indexes: k_idx)"
    )
    db.drop_collection("things")
    db.create_collection("checked", validator={"$jsonSchema": {"required": ["a"]}})
    problem = before.diff(snapshot(db))
    assert problem == (
        "collection 'checked' exists only after (0 document(s); indexes: none besides _id)"
    )


def test_index_differences_are_reported_by_name(db: Any) -> None:
    db.users.create_index("email", name="email_idx")
    db.users.create_index("age", name="age_idx")
    before = snapshot(db)
    db.users.drop_index("email_idx")
    db.users.create_index("email", name="email_idx", unique=True)
    db.users.drop_index("age_idx")
    lines = (before.diff(snapshot(db)) or "").splitlines()
    assert lines[0] == "collection 'users': index 'age_idx' exists only before: " + repr(
        snapshot_index(before, "users", "age_idx"))
    assert lines[1] == "collection 'users': index 'email_idx' differs"
    assert "'unique': True" in lines[3] and "'unique': True" not in lines[2]


def snapshot_index(taken: Any, collection: str, index: str) -> dict[str, Any]:
    return dict(taken.collections[collection].indexes[index])


def test_collection_options_and_views_are_compared(db: Any) -> None:
    db.create_collection("checked", validator={"$jsonSchema": {"required": ["a"]}})
    db.checked.insert_one({"_id": 1, "a": 1})
    db.create_collection("active", viewOn="checked", pipeline=[{"$match": {"a": 1}}])
    before = snapshot(db)
    assert before.collections["active"].kind == "view"
    assert before.collections["active"].documents == {}
    db.drop_collection("active")
    db.create_collection("active", viewOn="checked", pipeline=[{"$match": {"a": 2}}])
    problem = before.diff(snapshot(db)) or ""
    assert problem.splitlines()[0] == "collection 'active': options differ"
    assert "{'$match': {'a': 2}}" in problem.splitlines()[2]


# ------------------------------------------------------------------------ reversibility


def test_assert_reversible_passes_for_a_down_that_undoes_up(project: Any, db: Any) -> None:
    write_migrations(project.migrations)
    with make_migrator(project) as migrator:
        assert_reversible(migrator, INDEX)
        assert_reversible(migrator, SPLIT, seed=seed_users)
    assert applied(db) == [INDEX, SPLIT]  # the cycle ends with the migration applied
    assert db.users.find_one({"_id": 1}) == {
        "_id": 1, "email": "Ada@Example.COM", "first": "Ada", "last": "Lovelace"}


def test_assert_reversible_fails_with_the_diff_when_down_restores_nothing(
    project: Any, db: Any
) -> None:
    """up → down → up alone would pass here: lower-casing twice changes nothing the second
    time. Comparing "before up" with "after down" is what catches it."""
    write_migrations(project.migrations)
    with make_migrator(project) as migrator, pytest.raises(AssertionError) as failure:
        assert_reversible(migrator, NORMALISE, seed=seed_users)
    assert str(failure.value) == "\n".join([
        f"{NORMALISE} is not reversible: down did not restore the data up changed",
        "collection 'users': documents differ (1 changed, of 2)",
        "  first difference, _id 1:",
        # seeded after SPLIT ran: the seed is in the shape the test chose, not the split one
        "    before up : {'_id': 1, 'name': 'Ada Lovelace', 'email': 'Ada@Example.COM'}",
        "    after down: {'_id': 1, 'name': 'Ada Lovelace', 'email': 'ada@example.com'}",
        "    fields: 'email' changed",
    ])


@pytest.mark.parametrize(
    ("down", "up_again", "message"),
    [
        ('raise RuntimeError("cannot go back")', "", "down failed: Migration down failed: "
         "0001_one_way.py, line 12: RuntimeError: cannot go back"),
        ("ctx.db.things.delete_one({'_id': 1})",
         'if len(RUNS) > 1: raise RuntimeError("only once")',
         "up failed after down: Migration up failed: 0001_one_way.py, line 7: RuntimeError: "
         "only once"),
    ],
    ids=["down raises", "second up raises"],
)
def test_a_failing_step_is_a_failed_assertion(
    project: Any, down: str, up_again: str, message: str
) -> None:
    project.write_migration("0001_one_way", f"""
        RUNS = []


        def up(ctx):
            RUNS.append(1)
            {up_again}
            ctx.db.things.insert_one({{"_id": 1}})


        def down(ctx):
            {down}
    """)
    with make_migrator(project) as migrator, pytest.raises(AssertionError) as failure:
        assert_reversible(migrator, "0001_one_way.py")
    assert str(failure.value) == f"0001_one_way.py is not reversible: {message}"


def test_an_up_that_gives_other_data_after_down_fails_the_second_check(project: Any) -> None:
    project.write_migration("0001_counter", '''
        RUNS = []  # state outside the database: the second up writes something else


        def up(ctx):
            RUNS.append(ctx.run.id)
            ctx.db.things.insert_one({"_id": 1, "run": len(RUNS)})


        def down(ctx):
            ctx.db.things.delete_one({"_id": 1})
    ''')
    with make_migrator(project) as migrator, pytest.raises(AssertionError) as failure:
        assert_reversible(migrator, "0001_counter.py")
    assert str(failure.value).splitlines()[:2] == [
        "0001_counter.py is not reversible: up after down did not give the data of the first up",
        "collection 'things': documents differ (1 changed, of 1)",
    ]
    assert "first up     : {'_id': 1, 'run': 1}" in str(failure.value)
    assert "up after down: {'_id': 1, 'run': 2}" in str(failure.value)


def test_migrate_before_applies_only_what_precedes(project: Any, db: Any) -> None:
    write_migrations(project.migrations)
    with make_migrator(project) as migrator:
        assert migrate_before(migrator, INDEX) == []
        assert [r.file for r in migrate_before(migrator, NORMALISE)] == [INDEX, SPLIT]
        assert applied(db) == [INDEX, SPLIT]
        assert migrate_before(migrator, NORMALISE) == []  # idempotent


def test_migrate_before_applies_an_out_of_order_pending_file(project: Any, db: Any) -> None:
    write_migrations(project.migrations, (INDEX, NORMALISE))
    with make_migrator(project) as migrator:
        migrator.up()
        write_migrations(project.migrations, (SPLIT,))  # sorts before the applied NORMALISE
        project.write_migration("20260104000000_later", "def up(ctx): pass\ndef down(ctx): pass\n")
        assert [r.file for r in migrate_before(migrator, "20260104000000_later.py")] == [SPLIT]
    assert applied(db) == list(FILES)


@pytest.mark.parametrize(
    ("name", "error", "message"),
    [
        ("20990101000000_nowhere.py", MigrationFileNotFoundError,
         "Migration file not found: 20990101000000_nowhere.py"),
        ("../escape.py", MigrationInvalidNameError, "must be a bare filename"),
        ("_helpers.py", MigrationFileNotFoundError,
         "assert_reversible: _helpers.py is not a migration file (ignored by discovery)"),
    ],
)
def test_assert_reversible_refuses_a_name_that_is_not_a_migration(
    project: Any, db: Any, name: str, error: type[Exception], message: str
) -> None:
    write_migrations(project.migrations)
    (project.migrations / "_helpers.py").write_text("X = 1\n")
    with make_migrator(project) as migrator, pytest.raises(error, match=re.escape(message)):
        assert_reversible(migrator, name)
    assert applied(db) == []


def test_assert_reversible_refuses_an_applied_migration(project: Any, db: Any) -> None:
    write_migrations(project.migrations)
    with make_migrator(project) as migrator:
        migrator.up()
        with pytest.raises(ConfigInvalidError) as refused:
            assert_reversible(migrator, SPLIT)
    assert refused.value.message == (
        f"assert_reversible: {SPLIT} is already applied in database {db.name!r}, and it must be "
        "pending — use a database where it was never applied (the migronaut_migrator fixture, "
        "not migronaut_db)"
    )
    assert refused.value.exit_code == 6
    assert applied(db) == list(FILES)


def test_assert_all_reversible_stops_at_the_first_bad_migration(project: Any, db: Any) -> None:
    write_migrations(project.migrations)
    with make_migrator(project) as migrator, pytest.raises(AssertionError) as failure:
        assert_all_reversible(migrator, seeds={SPLIT: seed_users})
    assert str(failure.value).startswith(f"{NORMALISE} is not reversible: down did not restore")
    assert applied(db) == [INDEX, SPLIT]  # the failing one is left reverted


def test_assert_all_reversible_applies_skipped_one_way_migrations(project: Any, db: Any) -> None:
    write_migrations(project.migrations)
    with make_migrator(project) as migrator:
        assert_all_reversible(migrator, seeds={INDEX: seed_users}, skip=[NORMALISE])
    assert applied(db) == list(FILES)
    assert db.users.find_one({"_id": 1}) == {
        "_id": 1, "email": "ada@example.com", "first": "Ada", "last": "Lovelace"}


def test_assert_all_reversible_refuses_to_check_nothing(project: Any, db: Any) -> None:
    write_migrations(project.migrations)
    with make_migrator(project) as migrator:
        migrator.up()
        with pytest.raises(ConfigInvalidError, match="nothing to check"):
            assert_all_reversible(migrator)
        with pytest.raises(MigrationFileNotFoundError) as unknown:
            assert_all_reversible(migrator, skip=["0001_typo.py"], seeds={"0000_x.py": print})
    assert unknown.value.message == (
        "assert_all_reversible: no such migration file: 0000_x.py, 0001_typo.py"
    )
