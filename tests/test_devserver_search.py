"""The dev server's ``--search`` mode answers Atlas's search-index commands as Atlas does.

Converge's Search path (reference collections §7) is tested over the wire against it, so each
command, reply shape, error and state transition is pinned here — with pymongo's own helpers
(``create_search_index``, ``list_search_indexes``, ``update_search_index``,
``drop_search_index``) and with raw commands. Without ``--search`` the server refuses them as a
``mongod`` 7.0 without Atlas Search does (31082), which the availability probe (§7.4) relies on.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bson import SON, ObjectId
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import OperationFailure
from pymongo.operations import SearchIndexModel

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MIGRONAUT_TEST_URI")),
    reason="the --search dev server is the subject; a real server has its own Search (or none)",
)

Db = Database[dict[str, Any]]
Coll = Collection[dict[str, Any]]

DYNAMIC = {"mappings": {"dynamic": True}}
VECTOR = {"fields": [{"type": "vector", "path": "embedding", "numDimensions": 3,
                      "similarity": "cosine"}]}
NOT_ENABLED = (
    "Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage requires "
    "additional configuration. Please connect to Atlas or an AtlasCLI local deployment to "
    "enable. For more information on how to connect, see "
    "https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs."
)


@pytest.fixture
def sdb(search_client: MongoClient[dict[str, Any]]) -> Iterator[Db]:
    name = f"s_{uuid.uuid4().hex[:12]}"
    yield search_client[name]
    search_client.drop_database(name)


@pytest.fixture
def coll(sdb: Db) -> Coll:
    sdb.create_collection("movies")
    return sdb["movies"]


def refused(send: Callable[[], Any]) -> tuple[int | None, str, str]:
    with pytest.raises(OperationFailure) as caught:
        send()
    details = caught.value.details or {}
    return caught.value.code, str(details.get("codeName")), str(details.get("errmsg"))


def listed(coll: Coll, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in coll.list_search_indexes() if doc["name"] == name]
    return dict(found)


def poll(coll: Coll, name: str, done: Callable[[dict[str, Any]], bool]) -> list[str]:
    """The statuses seen until ``done`` holds (bounded: 10 s); the last one satisfies it."""
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while True:
        doc = listed(coll, name)
        if not seen or seen[-1] != doc["status"]:
            seen.append(doc["status"])
        if done(doc):
            return seen
        assert time.monotonic() < deadline, f"{name} still {doc['status']} after 10 s: {seen}"
        time.sleep(0.05)


def ready(doc: dict[str, Any]) -> bool:
    return doc["status"] == "READY"


# ------------------------------------------------------------------------------- create


def test_create_replies_with_ids_and_lists_the_index_pending(coll: Coll) -> None:
    reply = coll.database.command(SON([("createSearchIndexes", "movies"), ("indexes", [
        {"name": "plot", "definition": DYNAMIC},
        {"name": "vec", "type": "vectorSearch", "definition": VECTOR},
    ])]))
    created = reply["indexesCreated"]
    assert [entry["name"] for entry in created] == ["plot", "vec"]
    assert all(ObjectId.is_valid(entry["id"]) for entry in created)
    doc = listed(coll, "plot")
    assert list(doc) == ["id", "name", "type", "status", "queryable", "latestDefinitionVersion",
                         "latestDefinition", "statusDetail"]
    assert doc["id"] == created[0]["id"]
    assert (doc["type"], doc["status"], doc["queryable"]) == ("search", "PENDING", False)
    assert doc["latestDefinition"] == DYNAMIC
    assert doc["latestDefinitionVersion"]["version"] == 0
    (detail,) = doc["statusDetail"]
    assert detail["mainIndex"]["status"] == "PENDING"
    assert detail["mainIndex"]["definition"] == DYNAMIC
    assert "stagedIndex" not in detail
    assert listed(coll, "vec")["type"] == "vectorSearch"


def test_pymongo_helpers_create_an_unnamed_index_as_default(coll: Coll) -> None:
    assert coll.create_search_index({"definition": DYNAMIC}) == "default"
    assert coll.create_search_index(
        SearchIndexModel(VECTOR, name="vec", type="vectorSearch")) == "vec"
    assert sorted(doc["name"] for doc in coll.list_search_indexes()) == ["default", "vec"]


def test_a_new_index_moves_pending_building_ready_and_becomes_queryable(coll: Coll) -> None:
    coll.create_search_index({"name": "plot", "definition": DYNAMIC})
    assert poll(coll, "plot", ready) == ["PENDING", "BUILDING", "READY"]
    doc = listed(coll, "plot")
    assert doc["queryable"] is True
    assert doc["statusDetail"][0]["mainIndex"]["queryable"] is True


def test_a_duplicate_name_is_68_in_the_same_command_or_against_a_live_index(coll: Coll) -> None:
    coll.create_search_index({"name": "plot", "definition": DYNAMIC})
    assert refused(lambda: coll.create_search_index({"name": "plot", "definition": DYNAMIC})) \
        == (68, "IndexAlreadyExists", "Duplicate Index")
    assert refused(lambda: coll.create_search_indexes([
        SearchIndexModel(DYNAMIC, name="a"), SearchIndexModel(DYNAMIC, name="a")]))[0] == 68
    assert [doc["name"] for doc in coll.list_search_indexes()] == ["plot"]


def test_create_on_a_missing_collection_is_26(sdb: Db) -> None:
    assert refused(lambda: sdb.nowhere.create_search_index({"definition": DYNAMIC})) == (
        26, "NamespaceNotFound", f"Collection '{sdb.name}.nowhere' does not exist.")


def test_malformed_create_commands_are_refused_like_mongods_parser(coll: Coll) -> None:
    def send(**fields: Any) -> tuple[int | None, str, str]:
        return refused(lambda: coll.database.command(
            SON([("createSearchIndexes", "movies"), *fields.items()])))

    assert send() == (40414, "Location40414",
                      "BSON field 'createSearchIndexes.indexes' is missing but a required field")
    assert send(indexes={})[0] == 14
    assert send(indexes=[{"name": "x"}])[2] == \
        "BSON field 'createSearchIndexes.indexes.definition' is missing but a required field"
    assert send(indexes=[{"definition": []}])[0] == 14
    assert send(indexes=[{"definition": DYNAMIC, "analyzer": "x"}])[2] == \
        "BSON field 'createSearchIndexes.indexes.analyzer' is an unknown field."
    assert list(coll.list_search_indexes()) == []


# ------------------------------------------------------------------------------- FAILED


@pytest.mark.parametrize(("kind", "definition", "says"), [
    ("search", {"mappings": {"fields": {"title": {"type": "text"}}}}, "mappings.fields.title.type"),
    ("search", {"mappings": {"dynamic": True}, "analyzer": "my.own"}, "analyzer"),
    ("search", {"fields": [{"type": "vector", "path": "v"}]}, "vectorSearch"),
    ("vectorSearch", {"fields": [{"type": "vector", "path": "v", "similarity": "cosine"}]},
     "numDimensions"),
    ("vectorSearch", {"fields": [{"type": "vector", "path": "v", "numDimensions": 3,
                                  "similarity": "manhattan"}]}, "similarity"),
    ("vectorSearch", {"mappings": {"dynamic": True}}, "search index"),
])
def test_a_definition_atlas_cannot_build_ends_failed_with_a_message(
    coll: Coll, kind: str, definition: dict[str, Any], says: str
) -> None:
    coll.create_search_index(SearchIndexModel(definition, name="bad", type=kind))
    assert poll(coll, "bad", lambda doc: doc["status"] == "FAILED") == \
        ["PENDING", "BUILDING", "FAILED"]
    doc = listed(coll, "bad")
    assert doc["queryable"] is False
    assert says in doc["message"]
    assert doc["statusDetail"][0]["mainIndex"]["message"] == doc["message"]
    assert doc["latestDefinition"] == definition


# ------------------------------------------------------------------------------- update


def test_an_update_rebuilds_while_the_previous_definition_stays_queryable(coll: Coll) -> None:
    coll.create_search_index({"name": "plot", "definition": DYNAMIC})
    poll(coll, "plot", ready)
    new = {"mappings": {"dynamic": False, "fields": {"title": {"type": "string"}}}}
    coll.update_search_index("plot", new)
    doc = listed(coll, "plot")
    assert (doc["status"], doc["queryable"]) == ("PENDING", True)
    assert doc["latestDefinition"] == new
    assert doc["latestDefinitionVersion"]["version"] == 1
    detail = doc["statusDetail"][0]
    assert detail["mainIndex"]["definition"] == DYNAMIC
    assert detail["mainIndex"]["definitionVersion"]["version"] == 0
    assert (detail["stagedIndex"]["definition"], detail["stagedIndex"]["queryable"]) == \
        (new, False)
    assert poll(coll, "plot", ready) == ["PENDING", "BUILDING", "READY"]
    detail = listed(coll, "plot")["statusDetail"][0]
    assert detail["mainIndex"]["definitionVersion"]["version"] == 1
    assert "stagedIndex" not in detail


def test_a_failed_update_keeps_serving_the_old_definition(coll: Coll) -> None:
    coll.create_search_index({"name": "plot", "definition": DYNAMIC})
    poll(coll, "plot", ready)
    coll.update_search_index("plot", {"mappings": {"fields": {"t": {"type": "nope"}}}})
    poll(coll, "plot", lambda doc: doc["status"] == "FAILED")
    doc = listed(coll, "plot")
    assert doc["queryable"] is True and "mappings.fields.t.type" in doc["message"]
    detail = doc["statusDetail"][0]
    assert (detail["mainIndex"]["status"], detail["mainIndex"]["definition"]) == \
        ("READY", DYNAMIC)
    assert detail["stagedIndex"]["status"] == "FAILED"


def test_resending_the_latest_definition_changes_nothing_even_when_failed(coll: Coll) -> None:
    bad = {"mappings": {"fields": {"t": {"type": "nope"}}}}
    coll.create_search_index({"name": "bad", "definition": bad})
    poll(coll, "bad", lambda doc: doc["status"] == "FAILED")
    coll.update_search_index("bad", bad)
    doc = listed(coll, "bad")
    assert (doc["status"], doc["latestDefinitionVersion"]["version"]) == ("FAILED", 0)


def test_a_vector_index_is_updated_without_type_and_refuses_type(coll: Coll) -> None:
    coll.create_search_index(SearchIndexModel(VECTOR, name="vec", type="vectorSearch"))
    wider = {"fields": [{**VECTOR["fields"][0], "numDimensions": 4}]}
    assert coll.database.command({"updateSearchIndex": "movies", "name": "vec",
                                  "definition": wider})["ok"] == 1
    assert listed(coll, "vec")["type"] == "vectorSearch"
    assert refused(lambda: coll.database.command(SON([
        ("updateSearchIndex", "movies"), ("name", "vec"), ("type", "vectorSearch"),
        ("definition", wider)]))) == (
        40415, "Location40415", "BSON field 'updateSearchIndex.type' is an unknown field.")


def test_update_errors_unknown_index_missing_collection_name_and_id(coll: Coll, sdb: Db) -> None:
    assert refused(lambda: coll.update_search_index("nope", DYNAMIC)) == (
        27, "IndexNotFound", "Search index 'nope' not found")
    assert refused(lambda: sdb.command(SON([("updateSearchIndex", "nowhere"), ("name", "x"),
                                            ("definition", DYNAMIC)])))[0] == 26
    sdb.nowhere.update_search_index("x", DYNAMIC)  # pymongo treats NamespaceNotFound as success
    index_id = coll.create_search_index({"name": "plot", "definition": DYNAMIC}) and \
        listed(coll, "plot")["id"]
    both = SON([("updateSearchIndex", "movies"), ("name", "plot"), ("id", index_id),
                ("definition", DYNAMIC)])
    assert refused(lambda: sdb.command(both))[0] == 72
    neither = SON([("updateSearchIndex", "movies"), ("definition", DYNAMIC)])
    assert refused(lambda: sdb.command(neither))[0] == 72
    by_id = SON([("updateSearchIndex", "movies"), ("id", index_id),
                 ("definition", {"mappings": {"dynamic": False}})])
    assert sdb.command(by_id)["ok"] == 1
    assert listed(coll, "plot")["latestDefinitionVersion"]["version"] == 1


# --------------------------------------------------------------------------------- drop


def test_a_dropped_index_is_deleting_then_gone_and_its_name_is_free_again(coll: Coll) -> None:
    coll.create_search_index({"name": "plot", "definition": DYNAMIC})
    assert coll.database.command({"dropSearchIndex": "movies", "name": "plot"})["ok"] == 1
    doc = listed(coll, "plot")
    assert (doc["status"], doc["queryable"]) == ("DELETING", False)
    assert refused(lambda: coll.create_search_index(
        {"name": "plot", "definition": DYNAMIC}))[0] == 68
    coll.drop_search_index("plot")  # dropping it again while DELETING is fine
    deadline = time.monotonic() + 10
    while list(coll.list_search_indexes()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert coll.create_search_index({"name": "plot", "definition": DYNAMIC}) == "plot"


def test_drop_errors_and_what_pymongo_tolerates(coll: Coll, sdb: Db) -> None:
    assert refused(lambda: coll.drop_search_index("nope")) == (
        27, "IndexNotFound", "Search index 'nope' not found")
    assert refused(lambda: sdb.command({"dropSearchIndex": "nowhere", "name": "x"}))[0] == 26
    sdb.nowhere.drop_search_index("x")  # pymongo treats NamespaceNotFound as success


def test_indexes_go_with_their_collection_and_database(
    sdb: Db, search_client: MongoClient[dict[str, Any]]
) -> None:
    sdb.create_collection("a")
    sdb.a.create_search_index({"name": "plot", "definition": DYNAMIC})
    sdb.a.drop()
    sdb.create_collection("a")
    assert list(sdb.a.list_search_indexes()) == []
    sdb.a.create_search_index({"name": "plot", "definition": DYNAMIC})
    search_client.drop_database(sdb.name)
    sdb.create_collection("a")
    assert list(sdb.a.list_search_indexes()) == []


# ------------------------------------------------------------------- $listSearchIndexes


def test_list_by_name_or_id_with_later_stages_and_on_a_missing_collection(
    coll: Coll, sdb: Db
) -> None:
    coll.create_search_index({"name": "one", "definition": DYNAMIC})
    coll.create_search_index({"name": "two", "definition": DYNAMIC})
    two_id = listed(coll, "two")["id"]
    assert [d["name"] for d in coll.aggregate([{"$listSearchIndexes": {"id": two_id}}])] == \
        ["two"]
    assert [d["name"] for d in coll.list_search_indexes("one")] == ["one"]
    assert list(coll.aggregate([{"$listSearchIndexes": {}}, {"$match": {"name": "two"}},
                                {"$project": {"_id": 0, "name": 1, "type": 1}}])) == \
        [{"name": "two", "type": "search"}]
    assert list(sdb.nowhere.list_search_indexes()) == []


def test_list_stage_errors(coll: Coll) -> None:
    assert refused(lambda: list(coll.aggregate([{"$match": {}}, {"$listSearchIndexes": {}}])))\
        == (40602, "Location40602",
            "$listSearchIndexes is only valid as the first stage in a pipeline.")
    assert refused(lambda: list(coll.aggregate(
        [{"$listSearchIndexes": {"name": "a", "id": "b"}}])))[0] == 72
    assert refused(lambda: list(coll.aggregate([{"$listSearchIndexes": {"x": 1}}])))[0] == 40415


# -------------------------------------------------------------- a server without --search


def test_a_server_without_search_refuses_like_mongod_without_atlas(db: Db) -> None:
    db.create_collection("movies")
    sends: list[Callable[[], Any]] = [
        lambda: list(db.movies.list_search_indexes()),
        lambda: db.movies.create_search_index({"definition": DYNAMIC}),
        lambda: db.movies.update_search_index("default", DYNAMIC),
        lambda: db.command({"dropSearchIndex": "movies", "name": "default"}),
        lambda: list(db.nowhere.aggregate([{"$listSearchIndexes": {}}])),
    ]
    for send in sends:
        assert refused(send) == (31082, "SearchNotEnabled", NOT_ENABLED)


def test_a_search_delay_out_of_range_is_config_invalid() -> None:
    from migronaut.devserver import start_subprocess
    from migronaut.errors import ConfigInvalidError

    with pytest.raises(ConfigInvalidError, match="--search-delay must be between 0 and 3600"):
        start_subprocess(search=True, search_delay=-1)


def test_a_search_lag_out_of_range_is_config_invalid() -> None:
    from migronaut.devserver import start_subprocess
    from migronaut.errors import ConfigInvalidError

    with pytest.raises(ConfigInvalidError, match="--search-lag must be between 0 and 3600"):
        start_subprocess(search=True, search_lag=-1)


def until(check: Callable[[], bool]) -> int:
    """How many polls (50 ms apart, at most 10 s) until ``check`` holds."""
    deadline = time.monotonic() + 10
    polls = 0
    while not check():
        assert time.monotonic() < deadline, "not within 10 s"
        polls += 1
        time.sleep(0.05)
    return polls


def test_with_a_lag_the_list_shows_a_create_and_an_update_only_later(
    lagged_search_uri: str,
) -> None:
    """``--search-lag``: the list is eventually consistent, as Atlas's is — a created index is
    missing at first, an updated one shows its previous definition."""
    client: MongoClient[dict[str, Any]] = MongoClient(lagged_search_uri)
    name = f"s_{uuid.uuid4().hex[:12]}"
    try:
        coll = client[name].movies
        client[name].create_collection("movies")
        coll.create_search_index({"name": "plot", "definition": DYNAMIC})
        assert list(coll.list_search_indexes()) == []  # created, not listed yet
        assert until(lambda: bool(list(coll.list_search_indexes()))) > 0
        new = {"mappings": {"dynamic": False, "fields": {"title": {"type": "string"}}}}
        coll.update_search_index("plot", new)
        assert listed(coll, "plot")["latestDefinition"] == DYNAMIC  # the previous one
        assert until(lambda: listed(coll, "plot")["latestDefinition"] == new) > 0
        assert listed(coll, "plot")["latestDefinitionVersion"]["version"] == 1
    finally:
        client.drop_database(name)
        client.close()
