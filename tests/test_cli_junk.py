"""Every command and background action, fed junk for each of its options and arguments.

Junk: a huge number, a negative one, zero, a non-number, an empty string, a file where a
directory is expected and a directory where a file is expected — for the command's own options,
its positional arguments and the global options. Whatever the value, the command either works
(exit 0) or refuses with a typed error: never exit 1 with a raw exception, one ``✖ CODE:
message`` line carrying the code of its exit status, and with ``--json`` exactly one JSON error
document. The commands are read from the CLI itself, so a new command or option is covered
without touching this file.

``dev-server`` and ``background work`` serve until a signal: when a junk value happens to be a
valid one, the case waits for the command to say it is ready, sends it one SIGTERM (it stops
cleanly, exit 0) and checks that.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from migronaut.errors import EXIT_CODES

HUGE = "99999999999999999999"
#: Global options that take a value (flags such as --json are not fed junk).
GLOBAL_VALUE_OPTIONS = ("--uri", "--db", "--dir", "--config", "--env-file", "--log-format")
#: Required positional arguments get these plausible values when another one is under test.
REQUIRED_ARGUMENTS = {("create", "name"): "a new migration", ("dry-run", "direction"): "up",
                      ("fleet enqueue", "action"): "up"}
DEFAULT_REQUIRED = "0009_not_registered.py"
#: Options every case of a command carries (a free port: the dev server never takes 27017 here;
#: --yes: a confirmation is not what is under test).
BASE_OPTIONS = {"dev-server": ["--port", "0"], "baseline": ["--yes"], "unlock": ["--yes"]}
#: Long-running commands: the line that says they are serving (then one SIGTERM stops them).
SERVING = {"dev-server": "mongodb://", "background work": "Worker started", "dashboard": "http://"}
CODE_LINE = re.compile(r"✖ ([A-Z_]+): \S")


def walk(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from walk(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def commands() -> list[tuple[str, click.Command]]:
    from migronaut.cli.app import build_cli

    return list(walk(build_cli()))


@dataclass(frozen=True)
class Case:
    """One invocation: options before ``--``, positional arguments after it."""

    command: str
    options: tuple[str, ...]
    arguments: tuple[str, ...]
    what: str

    def argv(self, *extra: str) -> list[str]:
        args = [*self.command.split(), *self.options, *extra]
        return [*args, "--", *self.arguments] if self.arguments else args


def cases(name: str, command: click.Command, junk: Sequence[str]) -> list[Case]:
    from migronaut.cli.session import GLOBAL_KEYS

    positionals = [p for p in command.params if isinstance(p, click.Argument)]
    options = [p for p in command.params if isinstance(p, click.Option)
               and not p.is_flag and p.name not in GLOBAL_KEYS]
    base = tuple(BASE_OPTIONS.get(name, ()))

    def arguments(replace: str | None = None, value: str = "") -> tuple[str, ...]:
        out: list[str] = []
        for param in positionals:
            if param.name == replace:
                out.append(value)
            elif param.required:
                out.append(REQUIRED_ARGUMENTS.get((name, str(param.name)), DEFAULT_REQUIRED))
            elif replace is not None and positionals.index(param) < [
                    p.name for p in positionals].index(replace):
                out.append(DEFAULT_REQUIRED)  # an earlier optional argument must be given
            else:
                break
        return tuple(out)

    found: list[Case] = []
    for value in junk:
        for option in options:
            flag = max(option.opts, key=len)
            found.append(Case(name, (*base, flag, value), arguments(), f"{flag} {value!r}"))
        for param in positionals:
            found.append(Case(name, base, arguments(str(param.name), value),
                              f"{str(param.name).upper()} {value!r}"))
        for flag in GLOBAL_VALUE_OPTIONS:
            found.append(Case(name, (*base, flag, value), arguments(), f"{flag} {value!r}"))
    return found


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    stopped: bool = False


class Runner:
    """The CLI in-process in the project directory, with its output buffers visible to a
    watcher thread (for the long-running commands)."""

    def __init__(self, project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.project = project
        self.monkeypatch = monkeypatch

    def __call__(self, argv: list[str], serving: str | None) -> Outcome:
        from migronaut.cli import main

        stdout, stderr = io.StringIO(), io.StringIO()
        done = threading.Event()
        stopped = threading.Event()

        def watch() -> None:
            deadline = time.monotonic() + 60
            while not done.wait(0.02):
                if serving and serving in stdout.getvalue() + stderr.getvalue():
                    stopped.set()
                    os.kill(os.getpid(), signal.SIGTERM)  # once: the command stops cleanly
                    return
                if time.monotonic() > deadline:
                    stopped.set()
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

        previous = None
        watcher = threading.Thread(target=watch, daemon=True)
        try:
            with self.monkeypatch.context() as patch:
                patch.chdir(self.project.path)
                patch.setattr(sys, "stdin", io.StringIO(""))
                if serving:  # a signal arriving after the command restored its handlers is moot
                    previous = signal.signal(signal.SIGTERM, lambda *_: None)
                    watcher.start()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                    exit_code = main(argv)
        finally:
            done.set()
            if previous is not None:
                watcher.join()
                signal.signal(signal.SIGTERM, previous)
        return Outcome(exit_code, stdout.getvalue(), stderr.getvalue(), stopped.is_set())


def check(case: Case, outcome: Outcome, *, as_json: bool) -> str | None:
    """The code of a refusal (``None`` for success); fails the test on anything untyped."""
    where = f"{case.command} {case.what}{' --json' if as_json else ''}: {case.argv()}"
    output = f"\nstdout: {outcome.stdout}\nstderr: {outcome.stderr}"
    assert outcome.exit_code != 1, f"exit 1 for {where}{output}"
    assert "Traceback" not in outcome.stdout + outcome.stderr, where + output
    if outcome.stopped:  # a long-running command that was serving: stopped cleanly
        assert outcome.exit_code == 0, where + output
        return None
    if outcome.exit_code == 0:
        return None
    if case.command == "audit" and outcome.exit_code == EXIT_CODES["AUDIT_FAILED"]:
        if as_json:  # a failed check is a report, not an error envelope
            assert json.loads(outcome.stdout)["ok"] is False, where + output
        return "AUDIT_FAILED"
    lines = [line for line in outcome.stderr.splitlines() if CODE_LINE.match(line)]
    assert len(lines) == 1, f"not one '✖ CODE: message' line for {where}{output}"
    code = CODE_LINE.match(lines[0]).group(1)  # type: ignore[union-attr]
    assert EXIT_CODES.get(code) == outcome.exit_code, where + output
    if as_json:
        document = json.loads(outcome.stdout)  # exactly one document: raises otherwise
        assert document["error"]["code"] == code, where + output
        assert document["error"]["message"] and "\n" not in document["error"]["message"]
    else:
        assert CODE_LINE.match(outcome.stderr.splitlines()[-1]), where + output
    return code


@pytest.fixture
def junk(project: Any) -> list[str]:
    a_file = project.write("junk-file.txt", "not a directory\n")
    a_dir = project.path / "junk-dir"
    a_dir.mkdir()
    return [HUGE, "-1", "0", "abc", "", str(a_file), str(a_dir)]


COMMANDS = commands()


def test_every_command_is_covered() -> None:
    names = {name for name, _ in COMMANDS}
    assert {"up", "down", "create", "init", "import", "dev-server", "background work",
            "background dry-run", "logs"} <= names
    assert len(names) >= 28


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_junk_for_every_option_is_refused_with_a_typed_error(
    name: str, command: click.Command, project: Any, db: Any, client: Any, junk: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    project.write_migration("0001_a", "def up(ctx): pass\n\ndef down(ctx): pass\n")
    run = Runner(project, monkeypatch)
    serving = SERVING.get(name)
    written = [project.path / "migronaut.toml", project.path / "migronaut_config.py"]
    refused: dict[str, int] = {}
    try:
        for case in cases(name, command, junk):
            outcome = run(case.argv(), serving)
            code = check(case, outcome, as_json=False)
            if code is not None:
                refused[code] = refused.get(code, 0) + 1
                check(case, run(case.argv("--json"), serving), as_json=True)
            for path in written:  # `init` writes a config file: every case starts without it
                path.unlink(missing_ok=True)
    finally:
        for database in junk[:4]:  # `--db` junk that is a valid name ran against that database
            client.drop_database(database)
    assert refused, f"{name}: no junk value was refused at all"


def test_the_cases_exercise_each_kind_of_junk(project: Any, junk: list[str]) -> None:
    (down,) = [c for n, c in COMMANDS if n == "down"]
    built = cases("down", down, junk)
    assert [c.what for c in built if c.what.startswith("--batch")] == [
        f"--batch {v!r}" for v in junk]
    assert Case("down", ("--batch", HUGE), (), "").argv() == ["down", "--batch", HUGE]
    file_case = next(c for c in built if c.what == f"FILE {'-1'!r}")
    assert file_case.argv() == ["down", "--", "-1"]
    assert Path(junk[5]).is_file() and Path(junk[6]).is_dir()


@pytest.mark.parametrize(("args", "flag"), [
    (("down", "--batch", HUGE), "--batch"), (("down", "--steps", HUGE), "--steps"),
    (("dry-run", "down", "--batch", HUGE), "--batch"), (("status", "--limit", HUGE), "--limit"),
    (("logs", "--limit", HUGE), "--limit"), (("dev-server", "--port", HUGE), "--port"),
    (("background", "run", "--all", "--concurrency", HUGE), "--concurrency"),
    (("background", "work", "--lanes", HUGE), "--lanes"),
])
def test_a_huge_number_is_refused_before_connecting_naming_the_flag(
    cli: Any, args: tuple[str, ...], flag: str
) -> None:
    unreachable = "mongodb://nowhere.invalid:1/?serverSelectionTimeoutMS=1"
    result = cli(*args, "--json", env={"MIGRONAUT_URI": unreachable})
    assert result.exit_code == 6, result.stdout + result.stderr  # not 5: it never connected
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert result.json["error"]["message"].startswith(f"{flag} must be ")
