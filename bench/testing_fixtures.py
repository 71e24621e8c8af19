"""What a ``migronaut_db`` costs per test: migrating a fresh database vs copying a template.

    .venv-3.13/bin/python bench/testing_fixtures.py [--repeat N]

Starts the embedded dev server (or uses ``MIGRONAUT_BENCH_URI``), writes projects of N
migrations to a scratch directory and times, per test database (median of ``--repeat`` runs),
what the pytest plugin does: ``migrate`` (a ``Migrator`` on a fresh database, ``up``, drop — the
default) and ``copy`` (``copy_database`` from a template migrated once, drop — ini
``migronaut_template``). A shared database (ini ``migronaut_db_scope``) costs one ``migrate``
per scope and nothing per test. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from migronaut import Migrator
from migronaut.devserver import start_subprocess
from migronaut.testing._databases import copy_database, unique_name

#: (label, migrations, reference documents each migration inserts)
PROJECTS = [
    ("10 index migrations", 10, 0),
    ("50 index migrations", 50, 0),
    ("20 migrations seeding 50 documents each", 20, 50),
]


def write_project(root: Path, migrations: int, documents: int) -> Path:
    directory = root / f"m{migrations}_d{documents}"
    directory.mkdir()
    for i in range(migrations):
        seed = (f"    ctx.db.reference.insert_many([{{'m': {i}, 'k': k}} "
                f"for k in range({documents})])\n") if documents else ""
        (directory / f"20260101{i:06d}_m{i}.py").write_text(
            f"def up(ctx):\n    ctx.db.c{i}.create_index('field', name='field_idx')\n{seed}"
            "\n\ndef down(ctx):\n    pass\n"
        )
    return directory


def median_ms(action: Callable[[], None], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(uri: str, directory: Path, repeat: int) -> tuple[float, float]:
    def migrator(name: str) -> Migrator:
        return Migrator(uri=uri, db_name=name, migrations_dir=str(directory), env_file=False)

    template = unique_name("bench_template_")
    with migrator(template) as built:
        built.up()  # also loads the migration modules once, as a test session would
        client = built.client

        def migrate() -> None:
            name = unique_name("bench_")
            with migrator(name) as fresh:
                fresh.up()
            client.drop_database(name)

        def copy() -> None:
            name = unique_name("bench_")
            copy_database(client, template, name)
            client.drop_database(name)

        try:
            return median_ms(migrate, repeat), median_ms(copy, repeat)
        finally:
            client.drop_database(template)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    configured = os.environ.get("MIGRONAUT_BENCH_URI")
    server = None if configured else start_subprocess()
    uri = configured or (server.uri if server else "")
    try:
        with tempfile.TemporaryDirectory() as scratch:
            print("| project | migrate a fresh database | copy the template |")
            print("|---|---:|---:|")
            for label, migrations, documents in PROJECTS:
                directory = write_project(Path(scratch), migrations, documents)
                migrate, copy = measure(uri, directory, args.repeat)
                print(f"| {label} | {migrate:.0f} ms | {copy:.0f} ms |")
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    main()
