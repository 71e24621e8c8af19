"""The embedded dev server as a user runs it: real processes, a real pymongo client, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from migronaut import devserver
from migronaut.devserver import DevServerProcess, default_python, start_subprocess
from migronaut.errors import ConfigInvalidError

INSTALL_HINT = "pip install 'migronaut[embedded]' on Python 3.13+"

needs_devserver = pytest.mark.skipif(
    bool(os.environ.get("MIGRONAUT_TEST_URI")),
    reason="runs the dev server itself; skipped when MIGRONAUT_TEST_URI points at a real MongoDB",
)
needs_old_python = pytest.mark.skipif(
    sys.version_info >= (3, 13),
    reason="needs Python < 3.13 (the 3.11 run of scripts/test.sh covers it)",
)


def connect(uri: str) -> MongoClient[dict[str, Any]]:
    return MongoClient(uri, serverSelectionTimeoutMS=10_000)


def launch(*flags: str) -> subprocess.Popen[str]:
    """``python -m migronaut.devserver FLAGS`` with text pipes, as a user would run it."""
    return subprocess.Popen(
        [default_python(), "-m", "migronaut.devserver", *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def server() -> Iterator[DevServerProcess]:
    with start_subprocess() as process:
        yield process


@needs_devserver
def test_prints_exactly_one_uri_line_and_nothing_else() -> None:
    process = launch("--port", "0")
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("mongodb://127.0.0.1:")
        assert first.rstrip("\n").endswith("/?directConnection=true")
    finally:
        process.terminate()
        rest, stderr = process.communicate(timeout=15)
    assert rest == ""
    assert process.returncode == 0, stderr


@needs_devserver
def test_accepts_writes_and_reads_over_the_wire(server: DevServerProcess) -> None:
    with connect(server.uri) as mongo:
        books = mongo.shop.books
        books.insert_many([{"_id": 1, "title": "Dune"}, {"_id": 2, "title": "Emma"}])
        books.update_one({"_id": 2}, {"$set": {"stock": 3}})

        assert list(books.find({}, sort=[("_id", 1)])) == [
            {"_id": 1, "title": "Dune"},
            {"_id": 2, "title": "Emma", "stock": 3},
        ]


@needs_devserver
def test_a_leading_sample_draws_distinct_stored_documents(server: DevServerProcess) -> None:
    """The engine draws a leading ``$sample`` from its index of the collection (the documents
    it reads are counted in ``test_devserver_fast_paths.py``); over the wire, as a client sees
    it, inside a transaction too."""
    with connect(server.uri) as mongo:
        books = mongo.shop.sampled
        books.insert_many([{"_id": n, "n": n} for n in range(300)])
        books.delete_many({"_id": {"$lt": 100}})
        drawn = list(books.aggregate([{"$sample": {"size": 40}}, {"$project": {"n": 1}}]))
        assert len(drawn) == 40 == len({row["_id"] for row in drawn})
        assert all(row["_id"] == row["n"] and 100 <= row["n"] < 300 for row in drawn)
        assert sorted(row["_id"] for row in books.aggregate(
            [{"$sample": {"size": 500}}])) == list(range(100, 300))
        with mongo.start_session() as session, session.start_transaction():
            books.insert_one({"_id": 1000, "n": 1000}, session=session)
            inside = list(books.aggregate([{"$sample": {"size": 500}}], session=session))
        assert len(inside) == 201 and {"_id": 1000, "n": 1000} in inside


@needs_devserver
def test_transactions_work_although_hello_names_no_replica_set(server: DevServerProcess) -> None:
    with connect(server.uri) as mongo:
        assert "setName" not in mongo.admin.command("hello")
        with mongo.start_session() as session, session.start_transaction():
            mongo.shop.orders.insert_one({"_id": 1}, session=session)
        assert mongo.shop.orders.count_documents({}) == 1


@needs_devserver
def test_a_commit_refused_for_a_write_conflict_aborts_the_transaction(
    server: DevServerProcess,
) -> None:
    """The dev server detects conflicts coarsely, at commit: the refusal is mongod's
    (transient, so a client retries the transaction), nothing of the transaction lands — then or
    later — and the session's next operations run outside it."""
    with connect(server.uri) as mongo:
        orders = mongo.shop.orders
        orders.insert_one({"_id": 1, "v": 0})
        with mongo.start_session() as session:
            session.start_transaction()
            orders.update_one({"_id": 1}, {"$set": {"v": 1}}, session=session)
            mongo.shop.other.insert_one({"x": 1})  # a write outside it, meanwhile
            with pytest.raises(OperationFailure) as refused:
                session.commit_transaction()
            assert refused.value.has_error_label("TransientTransactionError")
            assert refused.value.code in (112, 251)
            assert orders.find_one({"_id": 1}, session=session) == {"_id": 1, "v": 0}
            orders.update_one({"_id": 1}, {"$set": {"w": 5}}, session=session)
        assert orders.find_one({"_id": 1}) == {"_id": 1, "v": 0, "w": 5}


@needs_devserver
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stops_cleanly_on_signal(server: DevServerProcess, sig: signal.Signals) -> None:
    with connect(server.uri) as mongo:
        mongo.shop.books.insert_one({"title": "Dune"})  # an open connection while stopping

        server.process.send_signal(sig)
        exit_code = server.process.wait(timeout=15)

    assert exit_code == 0
    assert "Traceback" not in server.read_stderr()


@needs_devserver
def test_path_persists_data_across_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "dev.db"
    with start_subprocess(path=str(data)) as first:
        with connect(first.uri) as mongo:
            mongo.shop.books.insert_one({"_id": 1, "title": "Dune"})
        assert first.stop() == 0
    assert data.is_file()

    with start_subprocess(path=str(data)) as second, connect(second.uri) as mongo:
        assert mongo.shop.books.find_one({"_id": 1}) == {"_id": 1, "title": "Dune"}


@needs_devserver
def test_path_in_a_missing_directory_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "dev.db"

    with pytest.raises(ConfigInvalidError, match="does not exist"):
        start_subprocess(path=str(missing))


@needs_devserver
@pytest.mark.parametrize("kind", ["text file", "directory"])
def test_path_that_is_not_a_sqlite_file_is_a_config_error(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "dev.db"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("not a database\n")

    process = launch("--path", str(target))
    stdout, stderr = process.communicate(timeout=30)

    assert process.returncode == 6
    assert stdout == ""
    assert stderr.startswith(f"error: dev server data file {str(target)!r} cannot be opened")
    assert len(stderr.strip().splitlines()) == 1
    assert "Traceback" not in stderr


@needs_devserver
def test_auth_admits_the_user_and_refuses_a_wrong_password() -> None:
    with start_subprocess(auth=("admin", "s3cr:et@1")) as server:
        assert "admin:s3cr%3Aet%401@" in server.uri
        assert "authMechanism=SCRAM-SHA-256" in server.uri
        with connect(server.uri) as mongo:
            mongo.shop.books.insert_one({"_id": 1})
            assert mongo.shop.books.count_documents({}) == 1

        wrong = server.uri.replace("s3cr%3Aet%401", "wrong")
        with connect(wrong) as mongo, pytest.raises(OperationFailure, match="Authentication"):
            mongo.shop.books.count_documents({})

        anonymous = server.uri.replace("admin:s3cr%3Aet%401@", "").split("&authMechanism")[0]
        with connect(anonymous) as mongo, pytest.raises(OperationFailure, match="Authentication"):
            mongo.shop.books.insert_one({"_id": 2})


@needs_devserver
def test_printed_uri_hides_the_password() -> None:
    process = launch("--port", "0", "--auth", "admin:s3cret")
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
    finally:
        process.terminate()
        process.communicate(timeout=15)
    assert line.startswith("mongodb://admin:****@127.0.0.1:")
    assert "s3cret" not in line


@needs_devserver
def test_busy_port_is_a_config_error(server: DevServerProcess) -> None:
    port = server.uri.split(":")[2].split("/")[0]

    process = launch("--port", port)
    stdout, stderr = process.communicate(timeout=30)

    assert process.returncode == 6
    assert stdout == ""
    assert f"cannot listen on 127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr


@needs_devserver
def test_port_out_of_range_is_a_config_error() -> None:
    process = launch("--port", "70000")
    stdout, stderr = process.communicate(timeout=30)

    assert process.returncode == 6
    assert stdout == ""
    assert stderr.strip() == "error: --port must be between 0 and 65535 (got 70000)"


@needs_devserver
def test_malformed_auth_flag_is_a_config_error() -> None:
    process = launch("--auth", "just-a-user")
    stdout, stderr = process.communicate(timeout=30)

    assert process.returncode == 6
    assert stdout == ""
    assert stderr.strip() == (
        "error: --auth must be 'user:password' with a non-empty user and password"
    )


# ------------------------------------------------------------------------- the missing extra


def test_serve_without_mongoeco_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mongoeco", None)  # makes `import mongoeco...` fail
    monkeypatch.setitem(sys.modules, "mongoeco.wire", None)
    monkeypatch.setitem(sys.modules, "mongoeco.engines", None)
    ready: list[str] = []

    with pytest.raises(ConfigInvalidError) as raised:
        devserver.serve(on_ready=ready.append)

    assert INSTALL_HINT in raised.value.message
    assert raised.value.code == "CONFIG_INVALID"
    assert raised.value.exit_code == 6
    assert ready == []


@needs_old_python
def test_serve_under_python_3_11_refuses_with_the_install_hint() -> None:
    ready: list[str] = []

    with pytest.raises(ConfigInvalidError) as raised:
        devserver.serve(on_ready=ready.append)

    assert INSTALL_HINT in raised.value.message
    assert "this is Python 3." in raised.value.message
    assert ready == []


@needs_old_python
def test_module_under_python_3_11_exits_6_with_one_line() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "migronaut.devserver"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert process.returncode == 6
    assert process.stdout == ""
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: the dev server needs Python 3.13+")
    assert INSTALL_HINT in lines[0]


@needs_old_python
def test_start_subprocess_with_an_old_python_raises_the_servers_error() -> None:
    with pytest.raises(ConfigInvalidError) as raised:
        start_subprocess(sys.executable, timeout=60)

    assert INSTALL_HINT in raised.value.message
    assert raised.value.message.startswith("dev server did not start: the dev server needs")


@needs_old_python
def test_default_python_without_an_interpreter_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MIGRONAUT_DEVSERVER_PYTHON", raising=False)

    with pytest.raises(ConfigInvalidError) as raised:
        default_python()

    assert INSTALL_HINT in raised.value.message
    assert "MIGRONAUT_DEVSERVER_PYTHON" in raised.value.message


def test_default_python_prefers_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIGRONAUT_DEVSERVER_PYTHON", "/opt/py313/bin/python")

    assert default_python() == "/opt/py313/bin/python"
