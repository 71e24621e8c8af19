"""Ctrl-C while ``migronaut_config.py`` loads or a ``before_all`` hook runs (real processes).

A read-only command is interrupted at once (exit 130, no traceback); a mutating one latches the
stop — its usual line — and ends with ``RUN_ABORTED`` (exit 11) before any migration, its lock
released. Each hold is on a gate file the test writes (bounded: 60 s).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from helpers.engine import LOCKS, applied, wait_until, write_simple

HOLD = """
import pathlib, time

def hold():
    pathlib.Path("holding.txt").write_text("x")
    for _ in range(1200):
        if pathlib.Path("go.txt").exists():
            return
        time.sleep(0.05)
"""

AT_IMPORT = HOLD + "\nhold()\nconfig = {}\n"
IN_CONFIG = HOLD + "\ndef config():\n    hold()\n    return {}\n"
IN_BEFORE_ALL = HOLD + """
from migronaut import Hooks

def before_all(ctx):
    hold()

config = {"hooks": Hooks(before_all=before_all)}
"""

CONFIGS = {"import": AT_IMPORT, "config": IN_CONFIG, "before_all": IN_BEFORE_ALL}

STOP_LINE = ("⚠ SIGINT received — finishing the current migration, then stopping. "
             "Press again to exit immediately.")


def interrupt(cli_process: Any, project: Any, where: str, command: str) -> Any:
    """Start ``command`` on a config holding at ``where``; SIGINT once it holds."""
    project.write("migronaut_config.py", CONFIGS[where])
    write_simple(project, "0001_a")
    process = cli_process.start(command, "--json")
    wait_until((project.path / "holding.txt").exists, timeout=60, what=f"the hold at {where}")
    process.send_signal(signal.SIGINT)
    return process


@pytest.mark.slow
@pytest.mark.parametrize("where", ["import", "config"])
def test_ctrl_c_while_the_config_loads_interrupts_a_read_only_command(
    cli_process: Any, project: Any, db: Any, where: str
) -> None:
    result = cli_process.wait(interrupt(cli_process, project, where, "status"), timeout=60)
    assert result.exit_code == 130, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip() == ""
    assert result.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("where", ["import", "config", "before_all"])
def test_ctrl_c_while_the_config_loads_or_before_all_runs_stops_up_before_any_migration(
    cli_process: Any, project: Any, db: Any, where: str
) -> None:
    process = interrupt(cli_process, project, where, "up")
    assert process.stderr is not None
    assert process.stderr.readline().strip() == STOP_LINE
    (project.path / "go.txt").write_text("go")
    result = cli_process.wait(process, timeout=60)
    assert result.exit_code == 11, result.stderr
    assert "Traceback" not in result.stderr
    assert result.json["error"]["code"] == "RUN_ABORTED"
    assert result.json["error"]["message"] == "Received SIGINT"
    assert result.json["partial"] == []
    assert applied(db) == []
    assert db[LOCKS].count_documents({}) == 0
