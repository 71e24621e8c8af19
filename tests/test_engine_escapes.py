"""User code that leaves by ``sys.exit()`` / ``SystemExit`` / ``KeyboardInterrupt`` has failed.

A migration body that does it is a failed migration — exit 7 (``MIGRATION_EXECUTION_FAILED``),
the failed changelog record, the ``--json`` error document, the lock released — wherever the
body runs: plain, ``async def`` (the async bridge's loop), in a transaction, under ``timeout_ms``
(a worker thread). A migration file or a declaration file whose top-level code does it while it
is imported is ``MIGRATION_EXECUTION_FAILED`` too, before anything runs. A hook that does it is
``HOOK_FAILED`` (exit 12). A real Ctrl-C keeps its
meaning: the CLI's graceful stop (tests/test_cli_process.py), and under the API with Python's
own SIGINT handler a ``KeyboardInterrupt`` still propagates (it may be the user's Ctrl-C).
"""

from __future__ import annotations

import re
import signal
from typing import Any

import pytest

from helpers.engine import LOCKS, applied, calls, make_migrator, records, write_simple

#: ``{header}`` sets the file's options, ``{prefix}`` is ``async `` or nothing, ``{leave}`` the
#: statement that leaves; the body writes first (in its transaction when it has one).
LEAVING = '''"""Leaves half-way."""
import sys
{header}

{prefix}def up(ctx):
    {wait}ctx.db["touched"].insert_one({{"by": "body"}}, session=ctx.session)
    {leave}


def down(ctx):
    pass
'''

KINDS = {
    "plain": ("", "", ""),
    "async": ("", "async ", "await "),
    "transaction": ("use_transaction = True", "", ""),
    "async-transaction": ("use_transaction = True", "async ", "await "),
    "timeout": ("timeout_ms = 30000", "", ""),
    "async-timeout": ("timeout_ms = 30000", "async ", "await "),
}

LEAVES = {
    "sys.exit(3)": "SystemExit: 3",
    "sys.exit()": "SystemExit",
    "raise KeyboardInterrupt": "KeyboardInterrupt",
}


def write_leaving(project: Any, kind: str, leave: str) -> None:
    header, prefix, wait = KINDS[kind]
    project.write_migration(
        "0002_leaves", LEAVING.format(header=header, prefix=prefix, wait=wait, leave=leave)
    )


def up_json(kind: str, cli: Any, cli_process: Any) -> Any:
    """``up --json`` in-process, or as a real process (bounded wait) where a regression could
    hang: an ``async def`` runs on the bridge's loop, which a ``SystemExit`` used to stop."""
    if "async" in kind:
        return cli_process("up", "--json", timeout=60)
    return cli("up", "--json")


@pytest.mark.parametrize("leave", list(LEAVES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_body_that_exits_is_a_failed_migration(
    cli: Any, cli_process: Any, project: Any, db: Any, kind: str, leave: str
) -> None:
    write_simple(project, "0001_a")
    write_leaving(project, kind, leave)
    write_simple(project, "0003_c")
    result = up_json(kind, cli, cli_process)

    assert result.exit_code == 7, (result.stdout, result.stderr)
    error = result.json["error"]
    assert error["code"] == "MIGRATION_EXECUTION_FAILED"
    # the file and the line of the user's code that left, then what it raised
    left = re.escape(LEAVES[leave])
    assert re.fullmatch(rf"Migration up failed: 0002_leaves\.py, line \d+: {left}",
                        error["message"]), error["message"]
    assert [(r["file"], r["status"]) for r in result.json["partial"]] == [
        ("0001_a.py", "applied"), ("0002_leaves.py", "error")
    ]
    assert "✖ MIGRATION_EXECUTION_FAILED: Migration up failed: 0002_leaves.py" in result.stderr
    assert "Traceback" not in result.stderr
    failed = records(db)["0002_leaves.py"]
    assert failed["status"] == "failed" and LEAVES[leave] in failed["error"]
    assert applied(db) == ["0001_a.py"]
    assert calls(db) == ["0001_a"]  # 0003 never ran
    transactional = "transaction" in kind
    assert db["touched"].count_documents({}) == (0 if transactional else 1)
    assert db[LOCKS].count_documents({}) == 0
    run = db["_migronaut_runs"].find_one()
    assert run["outcome"] == "failed" and run["error"]["code"] == "MIGRATION_EXECUTION_FAILED"


HOOKS_CONFIG = """
import sys

def {hook}(*args):
    {leave}

config = {{"hooks": {{"{hook}": {hook}}}}}
"""


@pytest.mark.parametrize("leave", ["sys.exit(4)", "raise KeyboardInterrupt"])
@pytest.mark.parametrize("hook", ["before_all", "before_each", "after_each"])
def test_a_hook_that_exits_is_hook_failed(
    cli: Any, project: Any, db: Any, hook: str, leave: str
) -> None:
    project.write("migronaut_config.py", HOOKS_CONFIG.format(hook=hook, leave=leave))
    write_simple(project, "0001_a", "0002_b")
    result = cli("up", "--json")
    assert result.exit_code == 12, (result.stdout, result.stderr)
    assert result.json["error"]["code"] == "HOOK_FAILED"
    cause = "SystemExit: 4" if "exit" in leave else "KeyboardInterrupt"
    assert result.json["error"]["message"] == f"The {hook} hook failed: {cause}"
    assert db[LOCKS].count_documents({}) == 0


def test_an_async_hook_that_exits_does_not_hang_the_run(
    cli_process: Any, project: Any, db: Any
) -> None:
    project.write("migronaut_config.py", """
        import sys

        async def before_each(*args):
            sys.exit(5)

        config = {"hooks": {"before_each": before_each}}
    """)
    write_simple(project, "0001_a")
    result = cli_process("up", "--json", timeout=60)
    assert result.exit_code == 12, (result.stdout, result.stderr)
    assert result.json["error"]["message"] == "The before_each hook failed: SystemExit: 5"
    assert calls(db) == []


@pytest.mark.slow
def test_a_real_process_whose_body_calls_sys_exit_exits_7(
    cli_process: Any, project: Any, db: Any
) -> None:
    write_leaving(project, "plain", "sys.exit(0)")
    result = cli_process("up", "--json", timeout=60)
    assert result.exit_code == 7, result.stderr
    assert re.fullmatch(r"Migration up failed: 0002_leaves\.py, line \d+: SystemExit: 0",
                        result.json["error"]["message"]), result.json["error"]["message"]
    assert records(db)["0002_leaves.py"]["status"] == "failed"
    assert db[LOCKS].count_documents({}) == 0


def test_under_the_api_with_pythons_own_sigint_handler_a_keyboardinterrupt_propagates(
    project: Any, db: Any
) -> None:
    """It may be the user's Ctrl-C: Python's meaning is kept (the lock is still released)."""
    # Python's own handler, also when the suite was started with SIGINT ignored (a background
    # job of a non-interactive shell inherits SIG_IGN, and Python then keeps it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    write_leaving(project, "plain", "raise KeyboardInterrupt")
    try:
        with make_migrator(project) as migrator, pytest.raises(KeyboardInterrupt):
            migrator.up()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert db[LOCKS].count_documents({}) == 0
    assert applied(db) == []


def test_under_the_api_a_body_that_calls_sys_exit_is_a_failed_migration(
    project: Any, db: Any
) -> None:
    from migronaut import MigrationExecutionFailedError

    write_leaving(project, "timeout", "sys.exit('bye')")  # raised in the body's worker thread
    with make_migrator(project) as migrator, pytest.raises(MigrationExecutionFailedError) as info:
        migrator.up()
    assert info.value.exit_code == 7
    assert isinstance(info.value.__cause__, SystemExit)
    assert records(db)["0002_leaves.py"]["status"] == "failed"


LEAVES_AT_IMPORT = '''"""Leaves while it is imported."""
import sys

{leave}


def up(ctx):
    ctx.db["touched"].insert_one({{"by": "body"}})


def down(ctx):
    pass
'''


@pytest.mark.parametrize("leave", list(LEAVES))
def test_a_migration_file_that_exits_while_imported_is_a_failed_migration(
    cli_process: Any, project: Any, db: Any, leave: str
) -> None:
    """``sys.exit(3)`` at a file's top level used to end ``up`` with exit 3 (read as
    ``LOCK_ALREADY_HELD``) and no output, ``sys.exit()`` with exit 0: a real process exits 7 with
    the typed error naming the file and line, runs nothing and leaves no lock."""
    write_simple(project, "0001_a")
    project.write_migration("0002_leaves", LEAVES_AT_IMPORT.format(leave=leave))
    for args in (("up", "--json"), ("up", "0002_leaves.py", "--json")):
        result = cli_process(*args, timeout=60)
        assert result.exit_code == 7, (args, result.stdout, result.stderr)
        error = result.json["error"]
        assert error["code"] == "MIGRATION_EXECUTION_FAILED"
        left = re.escape(LEAVES[leave])
        assert re.fullmatch(rf"Migration file failed to load: 0002_leaves\.py, line 4: {left}",
                            error["message"]), error["message"]
        assert error["context"]["line"] == 4
        assert "Traceback" not in result.stderr
    assert applied(db) == [] and calls(db) == []
    assert db["touched"].count_documents({}) == 0
    assert db[LOCKS].count_documents({}) == 0


@pytest.mark.parametrize("leave", list(LEAVES))
def test_a_declaration_file_that_exits_while_imported_stops_the_command(
    cli_process: Any, project: Any, db: Any, leave: str
) -> None:
    """The same for a declaration file, in the commands that read them. A read-only command
    keeps Python's own SIGINT handler, so there a ``KeyboardInterrupt`` may be the user's Ctrl-C
    and keeps its meaning: only ``sys.exit`` is checked in ``converge --dry-run``."""
    project.write("migronaut.toml", 'collections_dir = "collections"\n')
    project.write("collections/things.py", f"import sys\n\n{leave}\nindexes = []\n")
    write_simple(project, "0001_a")
    commands = [("up", "--converge", "--json"), ("converge", "--json")]
    if "exit" in leave:
        commands.append(("converge", "--dry-run", "--json"))
    for args in commands:
        result = cli_process(*args, timeout=60)
        assert result.exit_code == 7, (args, result.stdout, result.stderr)
        error = result.json["error"]
        assert error["code"] == "MIGRATION_EXECUTION_FAILED"
        left = re.escape(LEAVES[leave])
        assert re.fullmatch(rf"Declaration file failed to load: things\.py, line 3: {left}",
                            error["message"]), error["message"]
        assert "Traceback" not in result.stderr
    assert applied(db) == [] and calls(db) == []
    assert "things" not in db.list_collection_names()
    assert db[LOCKS].count_documents({}) == 0
