"""The wire audit: every command the test suite sends, checked against mongod's rules.

One pymongo command listener, registered before any client exists (``tests/conftest.py``),
sees every command the in-process code sends — through ``Migrator``, the CLI run in-process,
lanes in their threads, async clients — whatever server the suite talks to. For each one it
applies:

* mongod's refusals (:mod:`migronaut.devserver.mongod_rules`): path conflicts in
  ``$set``/``$project`` stages and across update operators, mixed or malformed update documents,
  undefined ``$$`` variables, empty write batches;
* migronaut's own rules for its collections (``_migronaut*``): reads go to the primary (no
  ``$readPreference`` other than ``primary``), and no stored document carries a ``$``-prefixed
  field name (insert documents, replacements, ``$literal`` payloads and operator values).

A violation fails the test that sent it (at teardown), so new code cannot bring the bug back.
A test that sends a refused command on purpose does it inside :meth:`WireAudit.allowing`, which
hands it what the audit saw instead. Commands of CLI subprocesses are not seen here: those go
to the dev server, which refuses the same shapes itself.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pymongo import monitoring

from migronaut.devserver.mongod_rules import check_command

#: Our own collections all start with this (``_migronaut_migrations``, ``_migronaut_locks``, …).
OWN_PREFIX = "_migronaut"
_READS = frozenset({"find", "aggregate", "count", "distinct", "listIndexes"})
#: Stored fields that hold a query as its author wrote it (a background spec's ``filter``, as
#: the original stores it): their operators are ``$``-prefixed by nature.
QUERY_FIELDS = frozenset({"filter"})


@dataclass(frozen=True)
class Finding:
    """A command the audit refused: where it went and which rule it broke."""

    command: str
    target: str
    rule: str

    def __str__(self) -> str:
        return f"{self.command} on {self.target}: {self.rule}"


@dataclass(frozen=True)
class Sent:
    """One command seen while :meth:`WireAudit.recording`: its name, target and read mode."""

    command: str
    target: str
    read_preference: str


class WireAudit(monitoring.CommandListener):
    """Checks each command as it starts; keeps the findings and a count per command name."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.counts: Counter[str] = Counter()
        self._guard = threading.Lock()
        self._allowing = threading.local()
        self._recording: list[Sent] | None = None

    # -- the listener ------------------------------------------------------------------------
    def started(self, event: monitoring.CommandStartedEvent) -> None:
        command = event.command
        found = audit_command(event.command_name, command)
        allowed: list[Finding] | None = getattr(self._allowing, "seen", None)
        with self._guard:
            self.counts[event.command_name] += 1
            if self._recording is not None:
                preference = (command.get("$readPreference") or {}).get("mode", "primary")
                self._recording.append(
                    Sent(event.command_name, str(command.get(event.command_name, "")),
                         str(preference)))
            if allowed is not None:
                allowed.extend(found)
            else:
                self.findings.extend(found)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    # -- for tests -----------------------------------------------------------------------------
    def mark(self) -> int:
        with self._guard:
            return len(self.findings)

    def since(self, mark: int) -> list[Finding]:
        with self._guard:
            return self.findings[mark:]

    @contextmanager
    def recording(self) -> Iterator[list[Sent]]:
        """Every command sent (by any thread) inside the block, in order."""
        sent: list[Sent] = []
        with self._guard:
            self._recording = sent
        try:
            yield sent
        finally:
            with self._guard:
                self._recording = None

    @contextmanager
    def allowing(self) -> Iterator[list[Finding]]:
        """Commands this thread sends inside the block are not held against the test; the list
        yielded collects what the audit found in them."""
        seen: list[Finding] = []
        previous = getattr(self._allowing, "seen", None)
        self._allowing.seen = seen
        try:
            yield seen
        finally:
            self._allowing.seen = previous


def audit_command(name: str, command: Mapping[str, Any]) -> list[Finding]:
    """Every rule ``command`` breaks (empty for a clean command)."""
    target = str(command.get(name, ""))
    found = [Finding(name, target, str(v)) for v in check_command(command)]
    if target.startswith(OWN_PREFIX):
        mode = (command.get("$readPreference") or {}).get("mode", "primary")
        if name in _READS and mode != "primary":
            found.append(Finding(name, target, f"own state read with readPreference {mode}"))
        for path in _dollar_names(_stored_values(name, command)):
            found.append(Finding(name, target, f"stores a $-prefixed field name at {path}"))
    return found


def _stored_values(name: str, command: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The values a write command stores as they are: documents, replacements, operator and
    ``$literal`` values."""
    if name == "insert":
        for index, document in enumerate(command.get("documents") or []):
            yield f"documents[{index}]", document
    updates: list[tuple[str, Any]] = []
    if name == "update":
        updates = [(f"updates[{i}].u", s.get("u")) for i, s in
                   enumerate(command.get("updates") or []) if isinstance(s, Mapping)]
    elif name.lower() == "findandmodify" and command.get("update") is not None:
        updates = [("update", command["update"])]
    for where, update in updates:
        if isinstance(update, list):
            yield from _literals(update, where)
        elif isinstance(update, Mapping) and update and str(next(iter(update)))[0] == "$":
            for operator, argument in update.items():
                if isinstance(argument, Mapping):
                    yield from ((f"{where}.{operator}.{k}", v) for k, v in argument.items())
        elif isinstance(update, Mapping):
            yield where, update


def _literals(value: Any, where: str) -> Iterator[tuple[str, Any]]:
    """``$literal`` payloads of a pipeline, each with the field path it is set at."""
    if isinstance(value, Mapping):
        if "$literal" in value and len(value) == 1:
            yield where, value["$literal"]
            return
        for key, item in value.items():
            yield from _literals(item, where if str(key).startswith("$") else f"{where}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _literals(item, where)


def _dollar_names(values: Iterator[tuple[str, Any]]) -> Iterator[str]:
    for where, value in values:
        yield from _dollar_names_in(value, where)


def _dollar_names_in(value: Any, where: str) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            if str(key).startswith("$"):
                yield f"{where}.{key}"
            elif key not in QUERY_FIELDS:
                yield from _dollar_names_in(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _dollar_names_in(item, f"{where}[{index}]")


#: The one audit of this test process (registered by ``tests/conftest.py``).
AUDIT = WireAudit()
