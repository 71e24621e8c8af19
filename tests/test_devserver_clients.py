"""The dev server serves the official clients, not only pymongo: the Node.js driver and mongosh.

Both refuse a cursor whose ``id`` is not an int64 (``BSON element "id" is missing``), so these
scenarios are what keeps the dev server's int64 cursor ids honest, together with the pymongo check
of the wire types below. The clients are the pinned npm packages that
:mod:`helpers.node_clients` installs once into ``.node-clients/``; without ``node``/``npm`` the
tests are skipped, or fail under ``MIGRONAUT_TEST_REQUIRE_TOOLS=1`` (CI).

The module starts its own dev server, so it is skipped when the suite runs against
``MIGRONAUT_TEST_URI``.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import MongoClient

from helpers.node_clients import NodeClients, ensure_node_clients
from migronaut.devserver import DevServerProcess, start_subprocess

# one_interpreter: the dev server runs under Python 3.13 in both of scripts/test.sh's passes and
# the clients are Node's: the second pass would repeat the first exactly
pytestmark = [
    pytest.mark.skipif(bool(os.environ.get("MIGRONAUT_TEST_URI")),
                       reason="starts its own dev server"),
    pytest.mark.one_interpreter,
]

#: Run with ``node``: the official driver through each kind of command, observations on stdout as
#: one JSON document. Command monitoring counts what went on the wire (``getMore``,
#: ``killCursors``), so "the batches were fetched" is observed, not assumed.
DRIVER_SCENARIO = r"""
const { MongoClient } = require('mongodb');

async function main() {
  const client = new MongoClient(process.env.MONGO_URI, {
    serverSelectionTimeoutMS: 10000, monitorCommands: true,
  });
  const sent = {};
  let killed = [];
  client.on('commandStarted', (e) => { sent[e.commandName] = (sent[e.commandName] || 0) + 1; });
  client.on('commandSucceeded', (e) => {
    if (e.commandName === 'killCursors') killed = e.reply.cursorsKilled.map(String);
  });
  await client.connect();
  const seen = {};
  try {
    const items = client.db(process.env.MONGO_DB).collection('items');
    const docs = Array.from({ length: 250 }, (_, i) => ({ _id: i, n: i, group: i % 5, tags: [] }));
    seen.inserted = (await items.insertMany(docs)).insertedCount;

    const ids = [];
    for await (const doc of items.find({}, { sort: { _id: 1 }, batchSize: 7 })) ids.push(doc._id);
    seen.foundIds = ids;
    seen.getMoresOfTheFind = sent.getMore || 0;

    const one = await items.updateOne(
      { _id: 3 }, { $set: { name: 'three' }, $inc: { n: 100 }, $push: { tags: 'x' } });
    seen.updateOne = [one.matchedCount, one.modifiedCount];
    const many = await items.updateMany({ group: 0 }, { $set: { flag: true } });
    seen.updateMany = [many.matchedCount, many.modifiedCount];
    const piped = await items.updateOne(
      { _id: 4 }, [{ $set: { double: { $multiply: ['$n', 2] } } }]);
    seen.pipelineUpdate = [piped.matchedCount, piped.modifiedCount];

    seen.createdIndex = await items.createIndex({ group: 1, n: -1 }, { name: 'group_n' });
    seen.indexes = (await items.indexes()).map((index) => index.name).sort();
    seen.listedIndexes = (await items.listIndexes().toArray()).map((index) => index.name).sort();
    seen.countOfGroup1 = await items.countDocuments({ group: 1 });

    const early = items.find({}, { sort: { _id: 1 }, batchSize: 5 });
    seen.firstOfEarlyClosed = (await early.next())._id;
    const openId = String(early.id);
    await early.close();
    seen.killCursors = sent.killCursors || 0;
    seen.killedTheOpenCursor = killed.includes(openId) && openId !== '0';

    const getMoresBefore = sent.getMore || 0;
    const aggregated = await items.aggregate(
      [{ $match: { group: 2 } }, { $sort: { _id: 1 } }, { $project: { _id: 1 } }],
      { batchSize: 4 }).toArray();
    seen.aggregatedIds = aggregated.map((doc) => doc._id);
    seen.getMoresOfTheAggregate = (sent.getMore || 0) - getMoresBefore;

    try {
      await items.updateOne({}, { $set: { a: 1 }, $inc: { 'a.b': 1 } });
      seen.conflict = null;
    } catch (error) {
      seen.conflict = { name: error.name, code: error.code, codeName: error.codeName };
    }
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(seen) + '\n');
}

main().catch((error) => { console.error(error); process.exit(1); });
"""

#: Run with ``mongosh URI --eval``: a shell session that prints what it saw as one EJSON line.
MONGOSH_SESSION = r"""
const notes = db.notes;
notes.insertMany(Array.from({ length: 9 }, (_, i) => ({ _id: i, text: 'note ' + i })));
notes.updateOne({ _id: 1 }, { $set: { starred: true } });
notes.createIndex({ text: 1 });
const probe = notes.find().batchSize(2);
probe.next();
const leftInFirstBatch = probe.objsLeftInBatch();
probe.close();
let conflict = null;
try {
  notes.updateOne({}, { $set: { a: 1 }, $inc: { 'a.b': 1 } });
} catch (error) {
  conflict = error.code;
}
print(EJSON.stringify({
  database: db.getName(),
  leftInFirstBatch,
  ids: notes.find().sort({ _id: 1 }).batchSize(2).toArray().map((note) => note._id),
  starred: notes.countDocuments({ starred: true }),
  indexes: notes.getIndexes().map((index) => index.name).sort(),
  conflict,
}));
"""


@pytest.fixture(scope="module")
def node_clients() -> NodeClients:
    return ensure_node_clients()


@pytest.fixture(scope="module")
def server() -> Iterator[DevServerProcess]:
    with start_subprocess() as process:
        yield process


@pytest.fixture
def database(server: DevServerProcess) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with connect(server.uri) as mongo:
        mongo.drop_database(name)


def run(argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 120.0) -> str:
    """Run a client to completion; its stdout, or an assertion error showing what it printed."""
    try:
        result = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise AssertionError(f"{argv[0]} did not finish within {timeout:g} s\n"
                             f"stdout:\n{_text(expired.stdout)}\nstderr:\n{_text(expired.stderr)}"
                             ) from None
    assert result.returncode == 0, (
        f"{argv[0]} exited with {result.returncode}\nstdout:\n{result.stdout}\n"
        f"stderr:\n{result.stderr}"
    )
    return result.stdout


def _text(output: str | bytes | None) -> str:
    """What a timed-out process printed (``TimeoutExpired`` may hold bytes despite ``text``)."""
    if isinstance(output, bytes):
        return output.decode("utf-8", "replace")
    return output or ""


def connect(uri: str) -> MongoClient[dict[str, Any]]:
    return MongoClient(uri, serverSelectionTimeoutMS=10_000)


def last_json_line(stdout: str) -> Any:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "the client printed nothing"
    return json.loads(lines[-1])


def test_the_node_driver_reads_writes_and_pages_through_cursors(
    node_clients: NodeClients, server: DevServerProcess, database: str, tmp_path: Path
) -> None:
    script = tmp_path / "scenario.js"
    script.write_text(DRIVER_SCENARIO, encoding="utf-8")
    env = node_clients.environment(tmp_path, {"MONGO_URI": server.uri, "MONGO_DB": database})

    seen = last_json_line(run([node_clients.node, str(script)], cwd=tmp_path, env=env))

    assert seen["inserted"] == 250
    assert seen["foundIds"] == list(range(250))  # all of them, in order, across getMores
    assert seen["getMoresOfTheFind"] == 35  # 36 batches of 7: the find's, then 35 getMores
    assert seen["updateOne"] == [1, 1]
    assert seen["updateMany"] == [50, 50]
    assert seen["pipelineUpdate"] == [1, 1]
    assert seen["createdIndex"] == "group_n"
    assert seen["indexes"] == seen["listedIndexes"] == ["_id_", "group_n"]
    assert seen["countOfGroup1"] == 50
    assert seen["firstOfEarlyClosed"] == 0
    assert seen["killCursors"] == 1
    assert seen["killedTheOpenCursor"] is True
    assert seen["aggregatedIds"] == list(range(2, 250, 5))
    assert seen["getMoresOfTheAggregate"] >= 12  # 50 results in batches of 4
    # mongod's refusal (the strict layer answers it as a write error), with mongod's code
    assert seen["conflict"] == {
        "name": "MongoServerError", "code": 40, "codeName": "ConflictingUpdateOperators"
    }

    with connect(server.uri) as mongo:
        items = mongo[database].items
        assert items.count_documents({}) == 250
        assert items.find_one({"_id": 3}) == {
            "_id": 3, "n": 103, "group": 3, "tags": ["x"], "name": "three"
        }
        assert items.count_documents({"flag": True}) == items.count_documents({"group": 0}) == 50
        assert items.find_one({"_id": 4}, {"double": 1}) == {"_id": 4, "double": 8}
        assert "group_n" in items.index_information()
        assert items.count_documents({"a": {"$exists": True}}) == 0  # the refused update


def test_a_mongosh_session_inserts_updates_and_reads_across_batches(
    node_clients: NodeClients, server: DevServerProcess, database: str, tmp_path: Path
) -> None:
    uri = server.uri.replace("/?", f"/{database}?", 1)  # the session's db is the URI's database
    home = tmp_path / "home"  # mongosh's config and logs go here, not in the user's home
    home.mkdir()
    argv = [str(node_clients.mongosh), uri, "--quiet", "--norc", "--eval", MONGOSH_SESSION]

    seen = last_json_line(run(argv, cwd=tmp_path, env=node_clients.environment(home)))

    assert seen == {
        "database": database,
        "leftInFirstBatch": 1,  # batches of 2: the 9 notes took getMores
        "ids": list(range(9)),
        "starred": 1,
        "indexes": ["_id_", "text_1"],
        "conflict": 40,
    }
    with connect(server.uri) as mongo:
        notes = mongo[database].notes
        assert notes.count_documents({}) == 9
        assert notes.find_one({"_id": 1}) == {"_id": 1, "text": "note 1", "starred": True}


def test_cursor_ids_are_int64_on_the_wire_as_mongod_sends_them(
    server: DevServerProcess, database: str
) -> None:
    with connect(server.uri) as mongo:
        db = mongo[database]
        db.items.insert_many([{"_id": i} for i in range(5)])

        found = db.command("find", "items", sort={"_id": 1}, batchSize=2)
        cursor_id = found["cursor"]["id"]
        assert type(cursor_id) is Int64 and cursor_id != 0
        more = db.command("getMore", cursor_id, collection="items", batchSize=2)
        assert type(more["cursor"]["id"]) is Int64
        assert [doc["_id"] for doc in more["cursor"]["nextBatch"]] == [2, 3]
        killed = db.command("killCursors", "items", cursors=[more["cursor"]["id"]])
        assert killed["cursorsKilled"] == [cursor_id]

        drained = db.command("find", "items", batchSize=10)
        assert drained["cursor"]["id"] == 0 and type(drained["cursor"]["id"]) is Int64
