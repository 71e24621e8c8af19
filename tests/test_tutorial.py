"""The getting-started tutorial, run as a user would run it: every ``migronaut`` command of its
shell blocks in order (the exit code a comment names, else 0), its files written where it says.

Differences from a user's machine, and only these: the test's own dev server and database stand
in for ``migronaut dev-server`` and ``--db app`` (the orders it seeds are written through pymongo,
in the seed's shape, and fewer of them: the size is the benchmarks' business), and the commands
run in-process.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from migronaut.devserver.seed import order_batches

PAGE = Path(__file__).resolve().parent.parent / "docs" / "getting-started.md"
BLOCK = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.MULTILINE | re.DOTALL)
SEEDED = 600


def blocks() -> list[tuple[str, str | None, str]]:
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(PAGE.read_text("utf-8"))]


def commands(script: str) -> list[tuple[list[str], int]]:
    """The ``migronaut`` commands of a shell block with the exit code each expects."""
    found = []
    for line in script.splitlines():
        code, _, comment = line.partition("#")
        expected = re.search(r"\bexit (\d+)", comment)
        for part in code.split("&&"):
            words = shlex.split(part)
            if words and words[0] == "migronaut":
                found.append((words[1:], int(expected.group(1)) if expected else 0))
    return found


def test_the_page_has_the_steps_the_test_follows() -> None:
    """A parse that found nothing would pass the tutorial vacuously."""
    found = blocks()
    run = [args[0] for kind, _, text in found if kind == "bash" for args, _ in commands(text)
           if args]
    for step in ("dev-server", "init", "create", "up", "down", "background", "converge",
                 "audit"):
        assert step in run
    assert [title for _, title, _ in found if title] == [
        "migrations/20261205090000_add_users_email_index.py",
        "migrations/20261205090100_store_order_totals_in_cents.py",
        "migronaut.toml (append)",
    ]


def test_the_tutorial_runs_from_start_to_end(project: Any, cli: Any, db: Any) -> None:
    for kind, title, text in blocks():
        if kind == "bash":
            for args, expected in commands(text):
                _run(project, cli, db, args, expected)
        elif title and title.startswith("migrations/"):
            slug = title.split("_", 1)[1]
            [created] = (project.path / "migrations").glob(f"*_{slug}")
            created.write_text(text, encoding="utf-8")
        elif title == "migronaut.toml (append)":
            config = project.path / "migronaut.toml"
            config.write_text(config.read_text("utf-8") + "\n" + text, encoding="utf-8")
    orders = list(db.orders.find({}, {"_id": 0, "__v": 1, "total": 1, "total_cents": 1}))
    assert len(orders) == SEEDED
    assert all(o["__v"] == 2 and o["total_cents"] == round(o["total"] * 100) for o in orders)
    assert {"by_version", "by_customer"} <= {i["name"] for i in db.orders.list_indexes()}
    assert "email_unique" in {i["name"] for i in db.users.list_indexes()}


def _run(project: Any, cli: Any, db: Any, args: list[str], expected: int) -> None:
    if args[0] == "dev-server":  # the test's server stands in; seed what the flag names
        namespace = args[args.index("--seed") + 1].split(":")[0]
        assert namespace == "app.orders"
        for batch in order_batches(namespace, SEEDED):
            db.orders.insert_many(batch)
        return
    if args[0] == "init":
        args = [*args]
        args[args.index("--uri") + 1] = project.uri
        args[args.index("--db") + 1] = project.db_name
    result = cli(*args)
    assert result.exit_code == expected, (
        f"migronaut {shlex.join(args)} exited {result.exit_code}, the page expects {expected}"
        f"\n{result.stdout}\n{result.stderr}")
