"""Human renderings of the fleet commands: the status summary and table, a run's live progress
and summary, the run records.

The live progress is fed by the fleet's events (``fleet:tenant:start``/``end``, emitted by the
scheduling thread): on a terminal one redrawn rich line (done / running / failed, ETA, the
slowest tenant now), elsewhere one plain line per finished tenant. Every tenant name and message
is passed through :func:`~migronaut._redact.sanitize_terminal`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut._redact import redact, sanitize_terminal
from migronaut.cli.output import CYAN, DIM, GREEN, RED, YELLOW, Output
from migronaut.cli.render import Cell, applied_at, table

if TYPE_CHECKING:
    from migronaut.fleet.api import Fleet
    from migronaut.fleet.runner import FleetResult
    from migronaut.fleet.runs import FleetRunRecord
    from migronaut.fleet.status import FleetStatus

__all__ = ["FleetProgress", "render_record", "render_result", "render_runs", "render_status"]

_STATE_STYLE = {"up-to-date": GREEN, "succeeded": GREEN, "pending": YELLOW, "failed": RED,
                "in-doubt": RED, "locked": YELLOW, "unreachable": RED, "started": CYAN,
                "skipped-locked": YELLOW, "skipped-budget": DIM, "skipped-canary": DIM,
                "skipped-stopped": DIM}


def _error_text(error: Mapping[str, Any] | None) -> str:
    """``CODE: message`` of a typed error; ``file: message`` of a failed migration (its
    changelog record stores no code)."""
    if not error:
        return ""
    head = error.get("code") or error.get("file")
    return sanitize_terminal(redact(f"{head}: {error.get('message')}"))


def render_status(status: FleetStatus, out: Output, *, show_all: bool) -> None:
    """The summary (count and percentage per state) and, with ``show_all`` or for tenants that
    are not up to date, the tenant × state table."""
    total = len(status.tenants)
    counts = status.counts()
    parts = [f"{n} {state} ({100 * n / total:.0f}%)" for state, n in counts.items()
             if n and total]
    out.info(f"Fleet: {total} tenant(s) — " + (", ".join(parts) or "none"))
    for cluster, error in status.unreachable_clusters.items():
        out.error(f"✖ cluster {sanitize_terminal(cluster)}: its tenants could not be listed — "
                  f"{_error_text(error)}")
    rows = [s for s in status.tenants if show_all or s.state != "up-to-date"]
    if not rows:
        return
    cells: list[list[Cell]] = [[
        (sanitize_terminal(s.tenant.name), None), (sanitize_terminal(s.tenant.cluster), None),
        (s.state, _STATE_STYLE.get(s.state)), (str(s.applied), None), (str(s.pending), None),
        (_error_text(s.error), None)] for s in rows]
    table(("Tenant", "Cluster", "State", "Applied", "Pending", "Error"), cells, out,
          shorten=("Error",))


def render_result(result: FleetResult, out: Output) -> None:
    """A run's summary line and one line per tenant that did not succeed."""
    counts = ", ".join(f"{n} {state}" for state, n in result.counts().items() if n)
    mark = "✔" if result.ok else "✖"
    line = (f"{mark} Fleet {result.command}: {len(result.outcomes)} tenant(s) — {counts or 'none'}"
            f" (run {result.run_id[:12]})")
    if result.ok:
        out.info(line)
    else:
        out.error(line)
    for outcome in result.failed:
        detail = _error_text(outcome.error)
        out.error(f"  • {sanitize_terminal(outcome.tenant.name)} ({outcome.state})"
                  + (f": {detail}" if detail else ""))
    for cluster, error in result.unreachable_clusters.items():
        out.error(f"  • cluster {sanitize_terminal(cluster)}: {_error_text(error)}")


def render_runs(records: Sequence[FleetRunRecord], out: Output) -> None:
    if not records:
        out.info("No fleet run recorded yet")
        return
    cells: list[list[Cell]] = []
    for record in records:
        counts = record.counts()
        done = sum(n for state, n in counts.items() if state in ("succeeded", "up-to-date"))
        bad = sum(n for state, n in counts.items()
                  if state not in ("succeeded", "up-to-date", "not-started", "started"))
        cells.append([(record.run_id[:12], None), (record.command, None),
                      (record.outcome, GREEN if record.outcome == "succeeded" else
                       YELLOW if record.outcome == "running" else RED),
                      (applied_at(record.started_at), None), (str(record.total), None),
                      (str(done), None), (str(bad), None),
                      (sanitize_terminal(f"{record.host}:{record.pid}"), None)])
    table(("Run", "Command", "Outcome", "Started", "Tenants", "Done", "Not done", "Where"),
          cells, out)


def render_record(record: FleetRunRecord, out: Output) -> None:
    counts = ", ".join(f"{n} {state}" for state, n in record.counts().items() if n)
    out.info(sanitize_terminal(
        f"Fleet run {record.run_id}: {record.command}, {record.outcome}, started "
        f"{applied_at(record.started_at)} on {record.host} (pid {record.pid}) — {counts}"))
    cells: list[list[Cell]] = [[
        (sanitize_terminal(e.name), None), (sanitize_terminal(e.cluster), None),
        (e.state, _STATE_STYLE.get(e.state)), (str(e.changed), None),
        (applied_at(e.started_at), None), (applied_at(e.ended_at), None),
        (_error_text(e.error), None)] for e in record.tenants]
    if cells:
        table(("Tenant", "Cluster", "State", "Changed", "Started", "Ended", "Error"), cells, out,
              shorten=("Error",))


class FleetProgress:
    """The live progress of a fleet run, fed by its events (a listener for ``*``)."""

    def __init__(self, out: Output, command: str) -> None:
        self.out = out
        self.command = command
        self._lock = threading.Lock()
        self._total = 0
        self._done = 0
        self._failed = 0
        self._running: dict[str, float] = {}
        self._started = time.monotonic()
        self._live: Any = None
        self._tty = _tty(out) and not out.json_mode

    def attach(self, fleet: Fleet) -> None:
        fleet.on("fleet:start", self._on_start)
        fleet.on("fleet:tenant:start", self._on_tenant_start)
        fleet.on("fleet:tenant:end", self._on_tenant_end)

    def _on_start(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self._total = int(payload.get("tenants", 0))
            self._started = time.monotonic()
        if self._tty:
            self._open()  # outside the lock: the live view's thread reads the counts under it

    def _on_tenant_start(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self._running[str(payload["tenant"])] = time.monotonic()
        self._refresh()

    def _on_tenant_end(self, payload: dict[str, Any]) -> None:
        with self._lock:
            self._running.pop(str(payload["tenant"]), None)
            self._done += 1
            if payload.get("state") not in ("succeeded", "up-to-date"):
                self._failed += 1
        if not self._tty and not self.out.json_mode:
            self._line(payload)
        self._refresh()

    def _refresh(self) -> None:
        live = self._live
        if live is not None:
            live.refresh()

    def _open(self) -> None:
        from rich.live import Live

        from migronaut.cli.render import console

        self.out.spinner.stop()
        stream = self.out.stream_for(20)
        view = self

        class _View:
            def __rich__(self) -> str:
                return view.summary()

        self._live = Live(_View(), console=console(self.out, stream, stream),
                          refresh_per_second=4, transient=True)
        self._live.start()

    def summary(self) -> str:
        """``12/500 done · 8 running · 1 failed · ETA 1m 20s · slowest now: t_42 (14s)``."""
        with self._lock:
            done, total, failed = self._done, self._total, self._failed
            running = dict(self._running)
        elapsed = time.monotonic() - self._started
        parts = [f"fleet {self.command}: {done}/{total} done", f"{len(running)} running",
                 f"{failed} not ok"]
        if done and total > done:
            parts.append(f"ETA {_duration(elapsed / done * (total - done))}")
        if running:
            name, since = min(running.items(), key=lambda item: item[1])
            parts.append(f"slowest now: {sanitize_terminal(name)} "
                         f"({_duration(time.monotonic() - since)})")
        return " · ".join(parts)

    def _line(self, payload: Mapping[str, Any]) -> None:
        state = str(payload.get("state"))
        tenant = sanitize_terminal(str(payload.get("tenant")))
        took = payload.get("durationMs")
        timing = f" in {took}ms" if isinstance(took, int) else ""
        if state in ("succeeded", "up-to-date"):
            changed = payload.get("changed") or 0
            what = f"{changed} changed" if changed else state
            self.out.info(f"✔ [{self._done}/{self._total}] {tenant}: {what}{timing}")
        else:
            detail = _error_text(payload.get("error"))
            self.out.warn(f"✖ [{self._done}/{self._total}] {tenant}: {state}"
                          + (f" — {detail}" if detail else ""))

    def close(self) -> None:
        with self._lock:
            live, self._live = self._live, None
        if live is not None:
            live.stop()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m"


def _tty(out: Output) -> bool:
    try:
        return bool(out.stream_for(20).isatty())
    except (AttributeError, ValueError, OSError):
        return False
