"""Helpers for process-level tests: bounded waits on real processes, boot scripts."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from helpers.engine import wait_until

#: Run by each racing ``run_migrations(on_lock_held="wait")`` process. A logging handler writes a
#: ``waiters`` document when the process starts waiting, so the test can observe it.
BOOT_SCRIPT = """
import json
import logging
import os
import sys

from pymongo import MongoClient

from migronaut import run_migrations

client = MongoClient(os.environ["MIGRONAUT_URI"])
db = client[os.environ["MIGRONAUT_DB"]]


class WaitingMark(logging.Handler):
    def emit(self, record):
        if "waiting for it to release" in record.getMessage():
            db["waiters"].insert_one({"pid": os.getpid()})


logger = logging.getLogger("boot")
logger.setLevel(logging.INFO)
logger.propagate = False
logger.addHandler(WaitingMark())
summary = run_migrations(on_lock_held="wait", lock_poll_interval_ms=50,
                         lock_wait_timeout_ms=120000, logger=logger)
print(json.dumps(summary.to_dict()))
"""


def exited(processes: Iterable[subprocess.Popen[str]]) -> list[subprocess.Popen[str]]:
    return [p for p in processes if p.poll() is not None]


def wait_for_exits(
    processes: list[subprocess.Popen[str]], count: int, *, timeout: float = 60.0
) -> list[subprocess.Popen[str]]:
    """Wait (bounded) until at least ``count`` of ``processes`` have exited."""
    return wait_until(
        lambda: len(exited(processes)) >= count and exited(processes),
        timeout=timeout,
        interval=0.05,
        what=f"{count} process(es) to exit",
    )


@contextmanager
def python_processes(
    script: str, count: int, *, cwd: Any, env: dict[str, str]
) -> Iterator[list[subprocess.Popen[str]]]:
    """Start ``count`` ``python -c script`` processes; kill any still running on exit."""
    processes: list[subprocess.Popen[str]] = []
    try:
        for _ in range(count):
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", script],
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            try:
                process.communicate(timeout=10)
            except Exception:
                pass
