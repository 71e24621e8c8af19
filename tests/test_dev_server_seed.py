"""``--seed DB.COLLECTION:N``: a dev server prints its URI only once its collections are filled.

Real processes: ``start_subprocess(seed=...)``, ``python -m migronaut.devserver --seed`` and
``migronaut dev-server --seed`` (through click). Each test starts its own dev server, so these are
skipped when the suite runs against ``MIGRONAUT_TEST_URI``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId
from pymongo import MongoClient

from helpers.markers import needs_embedded
from migronaut.devserver import DevServerProcess, default_python, start_subprocess
from migronaut.devserver.seed import MAX_FILE_DOCUMENTS, order_batches, parse_seeds
from migronaut.errors import EXIT_CODES, ConfigInvalidError

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("MIGRONAUT_TEST_URI")), reason="starts its own dev servers"
)

CONFIG_INVALID = EXIT_CODES[ConfigInvalidError.code]
FIELDS = {"_id", "__v", "customer", "status", "total"}
STATUSES = {"pending", "paid", "shipped", "delivered", "cancelled"}
USER, PASSWORD = "seeder", "s33d-pa55"


def connect(uri: str) -> MongoClient[dict[str, Any]]:
    return MongoClient(uri, serverSelectionTimeoutMS=10_000)


def devserver(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m migronaut.devserver --port 0 ARGS`` run to its end."""
    return subprocess.run(
        [default_python(), "-m", "migronaut.devserver", "--port", "0", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="module")
def seeded() -> Iterator[DevServerProcess]:
    with start_subprocess(seed=["app.orders:2500", "other.items:10"]) as server:
        yield server


# ------------------------------------------------------------------------------- the documents


def test_the_seeded_collections_hold_exactly_n_orders(seeded: DevServerProcess) -> None:
    with connect(seeded.uri) as client:
        orders = list(client.app.orders.find().sort("_id", 1))
        items = list(client.other.items.find())
        assert client.app.orders.count_documents({}) == 2500
        assert client.other.items.count_documents({}) == 10
    assert len({doc["_id"] for doc in orders}) == 2500
    assert len({doc["_id"] for doc in items}) == 10
    for doc in orders + items:
        assert set(doc) == FIELDS
        assert isinstance(doc["_id"], ObjectId)
        assert doc["__v"] == 1
        assert re.fullmatch(r"customer-\d{5}", doc["customer"])
        assert doc["status"] in STATUSES
        assert isinstance(doc["total"], float) and 5.0 <= doc["total"] <= 500.0
        assert round(doc["total"], 2) == doc["total"]
    assert {doc["status"] for doc in orders} == STATUSES
    times = [doc["_id"].generation_time for doc in orders]
    assert times == sorted(times) and times[0].isoformat() == "2025-01-01T00:00:00+00:00"


def test_the_documents_are_reproducible(seeded: DevServerProcess) -> None:
    """The server holds exactly what the generator gives for the namespace, every run; a
    smaller N is the start of a larger one."""
    expected = [doc for batch in order_batches("app.orders", 2500) for doc in batch]
    with connect(seeded.uri) as client:
        assert list(client.app.orders.find().sort("_id", 1)) == expected
    assert next(order_batches("app.orders", 7)) == expected[:7]
    assert next(order_batches("other.orders", 7)) != expected[:7]


def test_progress_goes_to_stderr(seeded: DevServerProcess) -> None:
    stderr = seeded.read_stderr()
    assert re.search(r"^seeded app\.orders: 2,500 documents in \d+\.\d s$", stderr, re.M)
    assert re.search(r"^seeded other\.items: 10 documents in \d+\.\d s$", stderr, re.M)


def test_a_seeded_server_with_auth() -> None:
    with start_subprocess(auth=(USER, PASSWORD), seed="app.orders:120") as server:
        with connect(server.uri) as client:
            assert client.app.orders.count_documents({"__v": 1}) == 120
        assert PASSWORD not in server.read_stderr()


# ------------------------------------------------------------------------------------ --path


def test_a_path_file_is_seeded_once_then_refused(tmp_path: Path) -> None:
    """Every collection is checked before the first insert: a refusal writes nothing."""
    data = str(tmp_path / "dev.sqlite")
    with start_subprocess(path=data, seed=["app.orders:50"]) as server:
        stderr = server.read_stderr()
    progress = re.findall(r"^seeding app\.orders: (\d+) of 50 documents \((\d+) %\)$", stderr,
                          re.M)
    assert progress == [("10", "20"), ("20", "40"), ("30", "60"), ("40", "80")]  # 10 at a time
    again = devserver("--path", data, "--seed", "app.fresh:5", "--seed", "app.orders:50")
    assert again.returncode == CONFIG_INVALID
    assert again.stdout == ""
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: --seed app.orders: the collection already holds 50 documents in {data}; seed "
        "only an empty collection (or drop it first)"
    )
    with start_subprocess(path=data) as server, connect(server.uri) as client:
        assert client.app.orders.count_documents({}) == 50
        assert client.app.fresh.count_documents({}) == 0
        assert "fresh" not in client.app.list_collection_names()


def test_a_path_file_takes_a_small_seed_only(tmp_path: Path) -> None:
    data = tmp_path / "dev.sqlite"
    result = devserver("--path", str(data), "--seed", f"app.orders:{MAX_FILE_DOCUMENTS + 1}")
    assert result.returncode == CONFIG_INVALID
    assert result.stdout == ""
    assert "--seed 'app.orders:2001' with --path: at most 2,000 documents" in result.stderr
    assert not data.exists()


# -------------------------------------------------------------------------------- bad input

BAD = [
    (["app.orders"], "--seed 'app.orders' must be DB.COLLECTION:N (no ':N' given)"),
    (["app:5"], "--seed 'app:5' must be DB.COLLECTION:N (no collection name given)"),
    (["app.:5"], "--seed 'app.:5' must be DB.COLLECTION:N (no collection name given)"),
    ([".orders:5"], "--seed '.orders:5' must be DB.COLLECTION:N (no database name given)"),
    (["a/b.orders:5"], "--seed 'a/b.orders:5': database name 'a/b' must be a valid database "
                       "name (no '/')"),
    (["app.system.users:5"], "--seed 'app.system.users:5': collection name 'system.users' "
                             "must be a valid collection name"),
    (["app.a$b:5"], "--seed 'app.a$b:5': collection name 'a$b' must be a valid collection name"),
    (["app..x:5"], "--seed 'app..x:5': collection name '.x' must be a valid collection name (no "
     "empty '.' segment"),
    ([f"app.{'x' * 260}:5"], "makes a namespace over 255 bytes"),
    (["app.orders:0"], "--seed 'app.orders:0': N must be a positive integer (got '0')"),
    (["app.orders:-5"], "--seed 'app.orders:-5': N must be a positive integer (got '-5')"),
    (["app.orders:ten"], "--seed 'app.orders:ten': N must be a positive integer (got 'ten')"),
    (["app.orders:"], "--seed 'app.orders:': N must be a positive integer (got '')"),
    (["app.orders:10000001"], "--seed 'app.orders:10000001': N must be at most 10,000,000"),
    (["app.orders:5", "app.orders:7"], "--seed names app.orders twice"),
    (["app.a:6000000", "app.b:6000000"],
     "--seed asks for 12,000,000 documents in all; at most 10,000,000"),
]
BAD_IDS = [" ".join(values)[:40] for values, _ in BAD]


def seed_args(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("--seed", value)]


@pytest.mark.parametrize(("values", "message"), BAD, ids=BAD_IDS)
def test_bad_seeds_are_refused_before_the_server_starts(
    values: list[str], message: str
) -> None:
    result = devserver(*seed_args(values))
    assert result.returncode == CONFIG_INVALID, result.stderr
    assert result.stdout == ""  # no URI: nothing served
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --seed ")
    assert message in lines[0]


@pytest.mark.parametrize(("values", "message"), BAD[:3] + BAD[-2:], ids=BAD_IDS[:3] + BAD_IDS[-2:])
def test_the_cli_refuses_bad_seeds_with_config_invalid(
    cli: Any, values: list[str], message: str
) -> None:
    result = cli("dev-server", "--port", "0", *seed_args(values), "--json")
    assert result.exit_code == CONFIG_INVALID
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert message in result.json["error"]["message"]
    human = cli("dev-server", "--port", "0", *seed_args(values))
    assert human.exit_code == CONFIG_INVALID and human.stdout == ""
    (line,) = human.stderr.strip().splitlines()
    assert line.startswith("✖ CONFIG_INVALID: --seed ") and message in line


def test_start_subprocess_refuses_a_bad_seed_without_starting_one() -> None:
    with pytest.raises(ConfigInvalidError, match="no ':N' given") as info:
        start_subprocess(seed=["app.orders"], python="/nonexistent/python")
    assert info.value.context == {"flag": "--seed"}


def test_parse_seeds_gives_the_values_back() -> None:
    seeds = parse_seeds(["app.orders:100000", "app.orders.archive:5", "log.a:b:3"])
    assert [str(one) for one in seeds] == ["app.orders:100000", "app.orders.archive:5", "log.a:b:3"]
    assert [(one.db, one.collection, one.count) for one in seeds] == [
        ("app", "orders", 100_000), ("app", "orders.archive", 5), ("log", "a:b", 3)]
    assert parse_seeds(seeds) == seeds  # checked again
    assert parse_seeds("app.orders:0100") == parse_seeds(["app.orders:100"])


# ------------------------------------------------------------------------- stops and the CLI


@pytest.mark.slow
def test_a_stop_while_seeding_ends_cleanly_without_a_uri() -> None:
    process = subprocess.Popen(
        [default_python(), "-m", "migronaut.devserver", "--port", "0",
         "--seed", "app.orders:200000"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stderr is not None
        first = process.stderr.readline()
        assert first.startswith("seeding app.orders: 20,000 of 200,000 documents (10 %)"), first
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert stdout == ""
    assert re.search(r"seeding app\.orders stopped: [\d,]+ of 200,000 documents inserted", stderr)
    assert "Traceback" not in stderr


@pytest.mark.slow
@needs_embedded
def test_the_cli_prints_the_uri_once_seeded_and_stops_on_sigterm(cli_process: Any) -> None:
    process = cli_process.start("dev-server", "--port", "0", "--auth", f"{USER}:{PASSWORD}",
                                "--seed", "app.orders:300", "--seed", "app.customers:3")
    assert process.stdout is not None
    uri = process.stdout.readline().strip()
    assert uri.startswith(f"mongodb://{USER}:****@127.0.0.1:")
    with connect(uri.replace(":****@", f":{PASSWORD}@")) as client:
        assert client.app.orders.count_documents({}) == 300
        assert client.app.customers.count_documents({}) == 3
    process.send_signal(signal.SIGTERM)
    result = cli_process.wait(process, timeout=30)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""  # nothing after the URI line
    assert "seeded app.orders: 300 documents in " in result.stderr
    assert ("Dev server ready (in memory, 300 documents in app.orders, 3 documents in "
            "app.customers)") in result.stderr
    assert PASSWORD not in result.stderr


@needs_embedded
def test_the_cli_refuses_a_bad_seed_as_a_process(cli_process: Any) -> None:
    result = cli_process("dev-server", "--port", "0", "--seed", "app.orders", timeout=60)
    assert result.exit_code == CONFIG_INVALID
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "✖ CONFIG_INVALID: --seed 'app.orders' must be DB.COLLECTION:N (no ':N' given)"]
