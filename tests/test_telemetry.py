"""OpenTelemetry (reference core §10.5, §10.3; background §7.3): the spans and metrics of runs,
checked by name and attribute through the SDK's in-memory exporter and metric reader.

What a user observes: one ``migronaut.run`` span per run that got the lock, one
``migronaut.migration`` child per executed migration that is the *current* span while the hooks,
the body and the changelog write run (so pymongo commands nest under it), ERROR statuses with
redacted messages and ``error.type`` on failure, histograms with the reference's buckets, and the
lock counters. A tracer or meter that misbehaves never breaks a run nor runs its work twice.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode
from pymongo import monitoring

from helpers.engine import (
    CHANGELOG,
    LOCK_ID,
    LOCKS,
    applied,
    calls,
    hold_lock,
    make_migrator,
    records,
    write_simple,
)
from migronaut import (
    ConfigInvalidError,
    HookFailedError,
    LockAlreadyHeldError,
    LockLostError,
    MigrationExecutionFailedError,
    MigronautError,
    run_migrations,
)
from migronaut.observability.telemetry import BUCKETS

RUN = "migronaut.run"
MIGRATION = "migronaut.migration"


# ------------------------------------------------------------------------------- harness


@dataclass
class Point:
    attributes: dict[str, Any]
    count: int = 0  # histograms
    value: int = 0  # counters
    bounds: tuple[float, ...] = ()


@dataclass
class Otel:
    """An SDK tracer and meter whose output the test reads back."""

    exporter: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    reader: InMemoryMetricReader = field(default_factory=InMemoryMetricReader)

    def __post_init__(self) -> None:
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")
        self.meter = self.meter_provider.get_meter("test")

    def config(self, **extra: Any) -> dict[str, Any]:
        return {"tracer": self.tracer, "meter": self.meter, **extra}

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]

    def span(self, name: str) -> ReadableSpan:
        (found,) = self.spans(name)
        return found

    def metrics(self) -> dict[str, list[Point]]:
        out: dict[str, list[Point]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        out.setdefault(metric.name, []).append(Point(
                            dict(point.attributes or {}),
                            count=getattr(point, "count", 0),
                            value=getattr(point, "value", 0),
                            bounds=tuple(getattr(point, "explicit_bounds", ()) or ()),
                        ))
        return out


@pytest.fixture
def otel() -> Otel:
    return Otel()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def hex_id(span: ReadableSpan) -> str:
    return format(span.context.span_id, "016x")


class CurrentSpans(monitoring.CommandListener):
    """Which span was current when pymongo started each command (what instrumentation sees)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, Any, str, str]] = []
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        current = format(trace.get_current_span().get_span_context().span_id, "016x")
        with self._lock:
            self.commands.append((event.command_name, event.command.get(event.command_name),
                                  event.database_name, current))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def on(self, command: str, collection: str) -> list[str]:
        return [span for name, coll, _, span in self.commands
                if name == command and coll == collection]


#: A migration that stores the span current in its body (hex id; "0"*16 = none).
SPAN_RECORDING = """
{prefix}def up(ctx):
    from opentelemetry import trace
    span = format(trace.get_current_span().get_span_context().span_id, "016x")
    {wait}ctx.db["seen"].insert_one({{"where": "body", "span": span}}, session=ctx.session)

def down(ctx):
    pass
"""


def span_hook(where: str) -> Any:
    def hook(*args: Any) -> None:
        ctx = next(a for a in args if hasattr(a, "db"))
        span = format(trace.get_current_span().get_span_context().span_id, "016x")
        ctx.db["seen"].insert_one({"where": where, "span": span})

    return hook


def seen(db: Any) -> dict[str, str]:
    return {d["where"]: d["span"] for d in db["seen"].find()}


# ---------------------------------------------------------------------------- up success


def test_spans_and_metrics_of_a_successful_up(project: Any, db: Any, otel: Otel) -> None:
    write_simple(project, "0001_a", "0002_b")
    telemetry = otel.config(attributes={"service.name": "billing", "deploy": 42})
    with make_migrator(project, telemetry=telemetry) as migrator:
        migrator.up()
    run_id = records(db)["0001_a.py"]["runId"]

    run = otel.span(RUN)
    assert run.parent is None and run.status.status_code is StatusCode.UNSET
    run_attrs = attrs(run)
    assert isinstance(run_attrs.pop("migronaut.lock.acquire_ms"), int)
    assert run_attrs == {
        "service.name": "billing", "deploy": 42, "db.namespace": db.name,
        "migronaut.run.id": run_id, "migronaut.run.command": "up",
        "migronaut.run.direction": "up", "migronaut.run.applied": 2,
        "migronaut.run.reverted": 0, "migronaut.run.skipped": 0, "migronaut.run.total": 2,
    }
    migrations = otel.spans(MIGRATION)
    assert [attrs(s)["migronaut.migration.name"] for s in migrations] == ["0001_a.py", "0002_b.py"]
    for index, span in enumerate(migrations):
        assert parent_id(span) == run.context.span_id
        assert span.context.trace_id == run.context.trace_id
        assert span.status.status_code is StatusCode.UNSET and not span.events
        assert attrs(span) == {
            "service.name": "billing", "deploy": 42, "db.namespace": db.name,
            "migronaut.migration.name": ["0001_a.py", "0002_b.py"][index],
            "migronaut.migration.direction": "up", "migronaut.migration.batch": 1,
            "migronaut.migration.index": index, "migronaut.migration.total": 2,
            "migronaut.migration.transaction": False, "migronaut.run.id": run_id,
        }
        assert run.start_time <= span.start_time and span.end_time <= run.end_time

    metrics = otel.metrics()
    common = {"service.name": "billing", "deploy": 42, "db.namespace": db.name}
    (run_point,) = metrics["migronaut.run.duration"]
    assert run_point.attributes == {**common, "migronaut.run.command": "up",
                                    "migronaut.run.direction": "up"}
    assert run_point.count == 1 and run_point.bounds == BUCKETS
    (migration_point,) = metrics["migronaut.migration.duration"]
    # file names are never metric attributes
    assert migration_point.attributes == {**common, "migronaut.migration.direction": "up"}
    assert migration_point.count == 2 and migration_point.bounds == BUCKETS
    (acquire,) = metrics["migronaut.lock.acquire.duration"]
    assert acquire.attributes == common and acquire.count == 1
    assert "migronaut.lock.refused" not in metrics and "migronaut.lock.lost" not in metrics


def test_skipped_migrations_are_counted_on_the_run_span(
    project: Any, db: Any, otel: Otel
) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, telemetry=otel.config()) as migrator:
        migrator.up()
        otel.exporter.clear()
        migrator.up("0001_a.py")  # already applied: skipped, not executed
    assert otel.spans(MIGRATION) == []
    run = attrs(otel.span(RUN))
    assert (run["migronaut.run.applied"], run["migronaut.run.skipped"],
            run["migronaut.run.total"]) == (0, 1, 1)


def test_a_baseline_run_span_counts_the_migrations_it_marked_applied(
    project: Any, db: Any, otel: Otel
) -> None:
    write_simple(project, "0001_a", "0002_b", "0003_c")
    with make_migrator(project, telemetry=otel.config()) as migrator:
        migrator.baseline("0002_b.py")
    assert otel.spans(MIGRATION) == []  # nothing ran
    run = attrs(otel.span(RUN))
    assert run["migronaut.run.command"] == "baseline"
    assert (run["migronaut.run.applied"], run["migronaut.run.reverted"],
            run["migronaut.run.skipped"], run["migronaut.run.total"]) == (2, 0, 1, 2)
    assert calls(db) == []


@pytest.mark.parametrize("mode", ["plain", "timeout", "async", "transaction"])
def test_the_migration_span_is_current_in_hooks_body_and_changelog_write(
    project: Any, db: Any, otel: Otel, mode: str
) -> None:
    """Driver instrumentation sees our span: the body, hooks and the changelog write all run
    with the migration span current — also when the body runs on the timeout thread or as a
    coroutine, and inside a transaction."""
    prefix = "async " if mode == "async" else ""
    extra = {"timeout": "timeout_ms = 30_000\n\n", "transaction": "use_transaction = True\n\n"}
    project.write_migration("0001_traced", extra.get(mode, "") + SPAN_RECORDING.format(
        prefix=prefix, wait="await " if mode == "async" else ""))
    listener = CurrentSpans()
    hooks = {"before_all": span_hook("before_all"), "before_each": span_hook("before_each"),
             "after_each": span_hook("after_each"), "after_all": span_hook("after_all")}
    with make_migrator(project, telemetry=otel.config(), hooks=hooks,
                       client_options={"event_listeners": [listener]}) as migrator:
        migrator.up()
    run, migration = hex_id(otel.span(RUN)), hex_id(otel.span(MIGRATION))
    assert seen(db) == {"before_all": run, "before_each": migration, "body": migration,
                        "after_each": migration, "after_all": run}
    assert set(listener.on("insert", "seen")) == {run, migration}
    writes = listener.on("update", CHANGELOG)  # mark_applied is an upsert
    assert writes and set(writes) == {migration}
    assert attrs(otel.span(MIGRATION))["migronaut.migration.transaction"] is (
        mode == "transaction")
    # the lock acquire ran before the run span existed; a renewal confirming the lock runs in
    # the span of the step it precedes (the run's between migrations, the migration's before
    # its changelog write when the body took long enough for one to be due), the heartbeat's
    # in none
    lock_writes = listener.on("update", LOCKS)
    assert lock_writes[0] == "0" * 16, lock_writes
    assert set(lock_writes) <= {run, migration, "0" * 16}, (lock_writes, run, migration)


# ------------------------------------------------------------------------------- failure


def test_a_failed_migration_sets_error_status_and_error_type(
    project: Any, db: Any, otel: Otel
) -> None:
    write_simple(project, "0001_a")
    project.write_migration("0002_fail", """
        def up(ctx):
            raise RuntimeError("no route to mongodb://u:Pw0rdLeak@h " + "x" * 3000)

        def down(ctx):
            pass
    """)
    with (
        make_migrator(project, telemetry=otel.config()) as migrator,
        pytest.raises(MigrationExecutionFailedError),
    ):
        migrator.up()
    ok, failed = otel.spans(MIGRATION)
    assert ok.status.status_code is StatusCode.UNSET and "error.type" not in attrs(ok)
    assert failed.status.status_code is StatusCode.ERROR
    message = failed.status.description or ""
    assert message.startswith(
        "Migration up failed: 0002_fail.py, line 3: RuntimeError: no route to")
    assert "Pw0rdLeak" not in message and "mongodb://u:****@h" in message
    assert len(message) == 1024 and message.endswith("…")
    assert attrs(failed)["error.type"] == "MIGRATION_EXECUTION_FAILED"
    assert not failed.events  # no exception events
    run = otel.span(RUN)
    assert run.status.status_code is StatusCode.ERROR and not run.events
    assert "Pw0rdLeak" not in (run.status.description or "")
    assert attrs(run)["error.type"] == "MIGRATION_EXECUTION_FAILED"
    assert (attrs(run)["migronaut.run.applied"], attrs(run)["migronaut.run.total"]) == (1, 2)

    metrics = otel.metrics()
    by_error = {p.attributes.get("error.type"): p.count
                for p in metrics["migronaut.migration.duration"]}
    assert by_error == {None: 1, "MIGRATION_EXECUTION_FAILED": 1}
    (run_point,) = metrics["migronaut.run.duration"]
    assert run_point.attributes["error.type"] == "MIGRATION_EXECUTION_FAILED"


def test_a_failing_hook_fails_the_migration_span_with_hook_failed(
    project: Any, db: Any, otel: Otel
) -> None:
    write_simple(project, "0001_a")

    def before_each(*args: Any) -> None:
        raise ValueError("hook bug")

    with make_migrator(project, telemetry=otel.config(),
                       hooks={"before_each": before_each}) as migrator, \
            pytest.raises(HookFailedError):
        migrator.up()
    migration = otel.span(MIGRATION)
    assert attrs(migration)["error.type"] == "HOOK_FAILED"
    assert "hook bug" in (migration.status.description or "")
    assert calls(db) == []


# ----------------------------------------------------------------------------- down, redo


def test_down_and_redo_spans(project: Any, db: Any, otel: Otel) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, telemetry=otel.config()) as migrator:
        migrator.up()
        otel.exporter.clear()
        migrator.down()
        run = otel.span(RUN)
        assert (attrs(run)["migronaut.run.command"], attrs(run)["migronaut.run.direction"],
                attrs(run)["migronaut.run.reverted"]) == ("down", "down", 1)
        (down,) = otel.spans(MIGRATION)
        assert attrs(down)["migronaut.migration.direction"] == "down"
        assert parent_id(down) == run.context.span_id
        migrator.up()
        otel.exporter.clear()
        migrator.redo()
    run = otel.span(RUN)
    assert attrs(run)["migronaut.run.command"] == "redo"
    assert "migronaut.run.direction" not in attrs(run)  # redo has no single direction
    assert (attrs(run)["migronaut.run.applied"], attrs(run)["migronaut.run.reverted"]) == (1, 1)
    spans = otel.spans(MIGRATION)
    assert [attrs(s)["migronaut.migration.direction"] for s in spans] == ["down", "up"]
    assert {parent_id(s) for s in spans} == {run.context.span_id}
    redo_points = [p for p in otel.metrics()["migronaut.run.duration"]
                   if p.attributes["migronaut.run.command"] == "redo"]
    assert len(redo_points) == 1 and "migronaut.run.direction" not in redo_points[0].attributes


def test_a_run_without_the_lock_says_so(project: Any, db: Any, otel: Otel) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, telemetry=otel.config()) as migrator:
        migrator.up(no_lock=True)
    run = attrs(otel.span(RUN))
    assert run["migronaut.lock.skipped"] is True and "migronaut.lock.acquire_ms" not in run
    assert "migronaut.lock.acquire.duration" not in otel.metrics()


# ----------------------------------------------------------------------------------- lock


def test_a_refused_lock_emits_no_span_and_counts_a_refusal(
    project: Any, db: Any, otel: Otel
) -> None:
    write_simple(project, "0001_a")
    hold_lock(db)
    with make_migrator(project, telemetry=otel.config(attributes={"team": "core"})) as migrator:
        with pytest.raises(LockAlreadyHeldError):
            migrator.up()
        with pytest.raises(LockAlreadyHeldError):
            migrator.down()
    assert otel.spans() == []
    metrics = otel.metrics()
    refused = {p.attributes["migronaut.run.command"]: p for p in metrics["migronaut.lock.refused"]}
    assert set(refused) == {"up", "down"}
    assert refused["up"].value == 1
    assert refused["up"].attributes == {"team": "core", "db.namespace": db.name,
                                        "migronaut.run.command": "up"}
    assert "migronaut.run.duration" not in metrics
    assert calls(db) == []


def test_a_lost_lock_is_counted_once_and_ends_the_run_span_with_the_reason(
    project: Any, db: Any, otel: Otel
) -> None:
    project.write_migration("0001_loses_lock", """
        def up(ctx):
            ctx.db["_migronaut_locks"].delete_one({"_id": "migronaut_lock"})
            ctx.cancellation.wait(20)  # bounded: until the heartbeat notices the loss

        def down(ctx):
            pass
    """)
    write_simple(project, "0002_b")
    with (
        make_migrator(project, lock_ttl_seconds=2, telemetry=otel.config()) as migrator,
        pytest.raises(LockLostError),
    ):
        migrator.up()
    run = otel.span(RUN)
    assert attrs(run)["migronaut.lock.lost_reason"] == "another run reclaimed it"
    assert attrs(run)["error.type"] == "LOCK_LOST"
    assert run.status.status_code is StatusCode.ERROR
    assert [attrs(s)["migronaut.migration.name"] for s in otel.spans(MIGRATION)] == [
        "0001_loses_lock.py"]
    (lost,) = otel.metrics()["migronaut.lock.lost"]
    assert lost.value == 1
    assert lost.attributes["migronaut.lock.lost_reason"] == "another run reclaimed it"
    assert calls(db) == []


def test_run_migrations_records_the_lock_wait(project: Any, db: Any, otel: Otel) -> None:
    """A holder whose lock goes stale (by our 60 s TTL) 1 s from now: the waiting process gets
    it, applies, and records one wait with outcome ``acquired``."""
    write_simple(project, "0001_a")
    hold_lock(db, age_ms=59_000)
    summary = run_migrations(uri=project.uri, db_name=project.db_name, cwd=project.path,
                             env_file=False, on_lock_held="wait", lock_poll_interval_ms=100,
                             telemetry=otel.config())
    assert summary.waited and applied(db) == ["0001_a.py"]
    metrics = otel.metrics()
    (wait,) = metrics["migronaut.lock.wait.duration"]
    assert wait.count == 1 and wait.attributes["migronaut.lock.wait.outcome"] == "acquired"
    assert sum(p.value for p in metrics["migronaut.lock.refused"]) == summary.attempts - 1
    assert len(otel.spans(RUN)) == 1  # refused attempts have no span


def test_run_migrations_records_a_timed_out_wait(project: Any, db: Any, otel: Otel) -> None:
    write_simple(project, "0001_a")
    hold_lock(db, ttl_ms=600_000)
    with pytest.raises(LockAlreadyHeldError):
        run_migrations(uri=project.uri, db_name=project.db_name, cwd=project.path,
                       env_file=False, on_lock_held="wait", lock_poll_interval_ms=50,
                       lock_wait_timeout_ms=300, telemetry=otel.config())
    (wait,) = otel.metrics()["migronaut.lock.wait.duration"]
    assert wait.attributes["migronaut.lock.wait.outcome"] == "timeout"
    assert otel.spans() == [] and calls(db) == []


# --------------------------------------------------------------- misbehaving SDK objects


class Explodes:
    """Any attribute is a callable that raises (a broken tracer, span, meter or instrument)."""

    def __getattr__(self, name: str) -> Any:
        def boom(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"sdk bug in {name}")

        return boom


class SpanRaisesOnEverything:
    """``start_span`` works, the span it returns raises on every call."""

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        return Explodes()

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("migronaut never hands its work to the tracer")


class ReturnsNothing:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return None

    def create_counter(self, *args: Any, **kwargs: Any) -> Any:
        return object()  # no add()


class InstrumentsExplode:
    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return Explodes()

    def create_counter(self, *args: Any, **kwargs: Any) -> Any:
        return Explodes()


BROKEN = {
    "tracer raises": {"tracer": Explodes()},
    "spans raise": {"tracer": SpanRaisesOnEverything()},
    "nothing returned": {"tracer": ReturnsNothing(), "meter": ReturnsNothing()},
    "meter raises": {"meter": Explodes()},
    "instruments raise": {"meter": InstrumentsExplode()},
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_tracer_or_meter_never_breaks_a_run(project: Any, db: Any, broken: str) -> None:
    write_simple(project, "0001_a", "0002_b")
    project.write_migration("0003_fails", """
        def up(ctx):
            raise RuntimeError("real failure")

        def down(ctx):
            pass
    """)
    telemetry = BROKEN[broken]
    with make_migrator(project, telemetry=telemetry) as migrator:
        with pytest.raises(MigrationExecutionFailedError, match="real failure"):
            migrator.up()
        assert calls(db) == ["0001_a", "0002_b"]  # each body ran exactly once
        (project.path / "migrations" / "0003_fails.py").unlink()
        assert [r.status for r in migrator.down()] == ["reverted", "reverted"]
        hold_lock(db)
        with pytest.raises(LockAlreadyHeldError):
            migrator.up()
        db[LOCKS].delete_one({"_id": LOCK_ID})
    assert calls(db) == ["0001_a", "0002_b", "0002_b", "0001_a"]
    assert applied(db) == [] and db[LOCKS].count_documents({}) == 0


# ------------------------------------------------------------------- configuration shapes


def test_an_object_with_tracer_meter_and_attributes_is_accepted(
    project: Any, db: Any, otel: Otel
) -> None:
    write_simple(project, "0001_a")
    config = SimpleNamespace(tracer=otel.tracer, meter=None, attributes={"region": "eu"})
    with make_migrator(project, telemetry=config) as migrator:
        migrator.up()
    assert attrs(otel.span(RUN))["region"] == "eu"
    assert otel.metrics() == {}  # no meter: no metrics


def test_a_meter_alone_records_metrics_without_spans(project: Any, db: Any, otel: Otel) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, telemetry={"meter": otel.meter}) as migrator:
        migrator.up()
    assert otel.spans() == []
    assert otel.metrics()["migronaut.migration.duration"][0].count == 1


@pytest.fixture(scope="module")
def global_otel() -> Iterator[Otel]:
    """The process-wide providers, set once (OpenTelemetry refuses to replace them)."""
    from opentelemetry import metrics

    found = Otel()
    trace.set_tracer_provider(found.tracer_provider)
    metrics.set_meter_provider(found.meter_provider)
    if trace.get_tracer_provider() is not found.tracer_provider:
        pytest.skip("another global tracer provider is already set in this process")
    yield found


def test_telemetry_true_uses_the_global_providers(
    project: Any, db: Any, global_otel: Otel
) -> None:
    write_simple(project, "0001_a")
    global_otel.exporter.clear()
    with make_migrator(project, telemetry=True) as migrator:
        migrator.up()
    run = global_otel.span(RUN)
    assert run.instrumentation_scope is not None
    assert run.instrumentation_scope.name == "migronaut"
    assert attrs(run)["db.namespace"] == db.name
    assert "migronaut.run.duration" in global_otel.metrics()


BAD_CONFIG = [
    ({"tracer": object()}, "telemetry.tracer", "must be an OpenTelemetry tracer"),
    ({"meter": "prometheus"}, "telemetry.meter", "must be an OpenTelemetry meter"),
    ({"exporter": 1}, "telemetry.exporter", "unknown key"),
    ({"attributes": {"migronaut.run.id": "x"}}, "telemetry.attributes.migronaut.run.id",
     "cannot be overridden"),
    ({"attributes": {"db.namespace": "x"}}, "telemetry.attributes.db.namespace",
     "cannot be overridden"),
    ({"attributes": {"team": ["a"]}}, "telemetry.attributes.team", "must be a string, number"),
    ({"attributes": {"team": None}}, "telemetry.attributes.team", "must be a string, number"),
    ({"attributes": {f"k{i}": i for i in range(21)}}, "telemetry.attributes", "at most 20"),
    ({"attributes": ["team"]}, "telemetry.attributes", "must be a mapping"),
    ("yes", "telemetry", "must be True, or a mapping or object"),
]


def test_telemetry_true_without_the_api_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from migronaut.observability import telemetry as module

    monkeypatch.setattr(module, "_api_modules", None)
    monkeypatch.setattr(module, "_api_missing", True)  # as if opentelemetry-api were absent
    with pytest.raises(ConfigInvalidError) as info:
        module.resolve_telemetry(True, namespace="app")
    assert info.value.message == (
        "Invalid configuration: telemetry.tracer: True needs the OpenTelemetry API: "
        "pip install 'migronaut[otel]'")


@pytest.mark.parametrize(("value", "path", "problem"), BAD_CONFIG)
def test_a_bad_telemetry_value_fails_closed_before_anything_is_written(
    project: Any, db: Any, value: Any, path: str, problem: str
) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, telemetry=value) as migrator, \
            pytest.raises(ConfigInvalidError) as info:
        migrator.up()
    error = info.value
    assert error.code == "CONFIG_INVALID" and error.exit_code == 6
    assert error.message.startswith(f"Invalid configuration: {path}: ")
    assert problem in error.message
    assert error.context["issues"][0]["path"] == path
    assert calls(db) == [] and db[CHANGELOG].count_documents({}) == 0
    assert db[LOCKS].count_documents({}) == 0


def test_a_bad_telemetry_value_in_the_config_module_exits_6(project: Any, cli: Any) -> None:
    write_simple(project, "0001_a")
    (project.path / "migronaut_config.py").write_text(textwrap.dedent("""
        config = {"telemetry": {"tracer": "jaeger"}}
    """), encoding="utf-8")
    result = cli("up", "--json")
    assert result.exit_code == 6
    assert result.json["error"]["code"] == "CONFIG_INVALID"
    assert "telemetry.tracer" in result.json["error"]["message"]


def test_the_config_module_passes_telemetry(project: Any, db: Any, cli: Any) -> None:
    """``migronaut_config.py`` builds its own provider; the CLI run reports to it."""
    write_simple(project, "0001_a")
    (project.path / "migronaut_config.py").write_text(textwrap.dedent("""
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        EXPORTER = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))

        def config():
            EXPORTER.clear()
            return {"telemetry": {"tracer": provider.get_tracer("app"),
                                  "attributes": {"service.name": "billing"}}}
    """), encoding="utf-8")
    result = cli("up")
    assert result.exit_code == 0, result.stderr
    module = next(m for k, m in sys.modules.items()
                  if k.startswith("migronaut_config_") and getattr(m, "EXPORTER", None)
                  and m.__file__ == str((project.path / "migronaut_config.py").resolve()))
    names = [(s.name, dict(s.attributes or {}).get("service.name"))
             for s in module.EXPORTER.get_finished_spans()]
    assert names == [(MIGRATION, "billing"), (RUN, "billing")]


# ------------------------------------------------------------------------------ not traced


def test_read_only_commands_are_not_traced(project: Any, db: Any, otel: Otel) -> None:
    write_simple(project, "0001_a")
    with make_migrator(project, telemetry=otel.config()) as migrator:
        migrator.status()
        migrator.pending()
        migrator.dry_run("up")
        migrator.lock_info()
    assert otel.spans() == [] and otel.metrics() == {}


def test_opentelemetry_is_never_imported_without_telemetry(project: Any, db: Any) -> None:
    """``migronaut --help``, ``import migronaut`` and a whole run without a ``telemetry`` value
    never import opentelemetry (start-up time; the extra is optional)."""
    write_simple(project, "0001_a")
    code = textwrap.dedent(f"""
        import sys
        import migronaut
        from migronaut.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        assert "opentelemetry" not in sys.modules, "imported by --help"
        with migronaut.Migrator(uri={project.uri!r}, db_name={project.db_name!r},
                                cwd={str(project.path)!r}, env_file=False) as migrator:
            migrator.up()
        sys.stderr.write(repr(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.endswith("[]")
    assert applied(db) == ["0001_a.py"]


# ------------------------------------------------------------------------------ background

BACKGROUND = """
def migrate(doc, ctx):
    doc["active"] = True
    return doc

background = {
    "collection": "users",
    "from": 0,
    "to": 1,
    "migrate": migrate,
    "batch_size": 25,
    "pause_ms": 0,
    "slice_ms": 1000,
    "max_parallel": 2,
    "adaptive": False,
    "partitions": {"min_partition_docs": 50},
}
"""


def test_background_slices_and_batches_are_traced_and_measured(
    project: Any, db: Any, otel: Otel
) -> None:
    """Inline mode: coordinator steps and slices nest under the migration span (lanes run in a
    copy of the caller's context), each slice span is current while its batches read and write,
    and the batch, document and slice metrics add up to what was migrated."""
    db.users.insert_many([{"n": i} for i in range(120)])
    db.users.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_users_v1", BACKGROUND)
    listener = CurrentSpans()
    with make_migrator(project, telemetry=otel.config(), background_inline=True,
                       client_options={"event_listeners": [listener]}) as migrator:
        migrator.up()
    assert db.users.count_documents({"__v": 1, "active": True}) == 120

    migration = otel.span(MIGRATION)
    coordinates = otel.spans("migronaut.background.coordinate")
    slices = otel.spans("migronaut.background.slice")
    assert coordinates and slices
    for span in coordinates + slices:
        assert parent_id(span) == migration.context.span_id
        assert attrs(span)["migronaut.migration.name"] == "0001_users_v1.py"
        assert attrs(span)["db.namespace"] == db.name
    assert attrs(coordinates[-1])["migronaut.background.next"] == "done"
    assert attrs(coordinates[-1])["migronaut.background.status"] == "completed"
    slice_ids = {hex_id(s) for s in slices}
    for span in slices:
        values = attrs(span)
        assert values["migronaut.background.slice.outcome"] in ("exhausted", "yielded")
        assert isinstance(values["migronaut.background.partition"], str)
        assert isinstance(values["migronaut.background.slot"], int)
        assert span.status.status_code is StatusCode.UNSET
    assert sum(attrs(s).get("migronaut.background.slice.migrated", 0) for s in slices) == 120
    reads = listener.on("find", "users")  # the planner's samples, then the batches
    writes = listener.on("update", "users")
    assert set(writes) <= slice_ids and slice_ids <= set(reads)
    assert set(reads) <= slice_ids | {hex_id(s) for s in coordinates}

    metrics = otel.metrics()
    (documents,) = metrics["migronaut.background.documents"]
    assert documents.value == 120
    assert documents.attributes == {"db.namespace": db.name,
                                    "migronaut.background.documents.outcome": "migrated"}
    batches = sum(attrs(s).get("migronaut.background.slice.batches", 0) for s in slices)
    (batch,) = metrics["migronaut.background.batch.duration"]
    assert batch.count == batches >= 120 // 25 and batch.bounds == BUCKETS
    outcomes = {p.attributes["migronaut.background.slice.outcome"]: p.count
                for p in metrics["migronaut.background.slice.duration"]}
    assert sum(outcomes.values()) == len(slices)
    for points in metrics.values():  # file names are never metric attributes
        assert all("migronaut.migration.name" not in p.attributes for p in points)


def test_a_slice_over_its_error_budget_ends_with_an_error_status(
    project: Any, db: Any, otel: Otel
) -> None:
    db.users.insert_many([{"n": i} for i in range(40)])
    db.users.create_index([("__v", 1), ("_id", 1)])
    project.write_migration("0001_users_v1", BACKGROUND.replace(
        'doc["active"] = True', 'if doc["n"] == 5:\n        raise ValueError("bad row")\n'
        '    doc["active"] = True').replace('"max_parallel": 2,', '"max_parallel": 1,'))
    with make_migrator(project, telemetry=otel.config(), background_inline=True) as migrator, \
            pytest.raises(MigronautError) as info:
        migrator.up()
    assert info.value.code == "BACKGROUND_FAILED"
    failed = [s for s in otel.spans("migronaut.background.slice")
              if attrs(s)["migronaut.background.slice.outcome"] == "failed"]
    assert len(failed) == 1
    assert failed[0].status.status_code is StatusCode.ERROR
    assert attrs(failed[0])["error.type"] == "BACKGROUND_FAILED"
    assert "bad row" in (failed[0].status.description or "")
    points = {p.attributes["migronaut.background.slice.outcome"]: p.attributes.get("error.type")
              for p in otel.metrics()["migronaut.background.slice.duration"]}
    assert points["failed"] == "BACKGROUND_FAILED"
    assert attrs(otel.span(RUN))["error.type"] == "BACKGROUND_FAILED"


def test_background_events_become_metrics(otel: Otel) -> None:
    """The background metrics derived from the events the lanes and watchers emit anyway; the
    events themselves still reach the listeners unchanged."""
    from migronaut.observability.telemetry import Telemetry

    telemetry = Telemetry(meter=otel.meter, namespace="app")
    received: list[str] = []
    emit = telemetry.observe_background(lambda event, payload: received.append(event))
    emit("background:batch", {"partition": "p", "latencyMs": 40.5, "batchSize": 10,
                              "counters": {"migrated": 7, "skipped": 2, "failed": 1,
                                           "txnRetries": 3}})
    emit("background:batch", {"partition": "p", "latencyMs": "bad", "counters": None})
    emit("background:throttle", {"reason": "slow", "batchSize": 5, "pauseMs": 10})
    emit("background:drift", {"collection": "users", "source": "poll", "action": "reopened"})
    emit("background:lease:lost", {"partition": "p"})
    emit("background:slice:start", {"partition": "p"})
    telemetry.leases_reclaimed(2)
    assert received == ["background:batch", "background:batch", "background:throttle",
                        "background:drift", "background:lease:lost", "background:slice:start"]

    def values(name: str) -> dict[tuple[tuple[str, Any], ...], int]:
        return {tuple(sorted((k, v) for k, v in p.attributes.items() if k != "db.namespace")):
                p.value or p.count for p in metrics[name]}

    metrics = otel.metrics()
    assert values("migronaut.background.batch.duration") == {(): 1}
    assert values("migronaut.background.documents") == {
        (("migronaut.background.documents.outcome", "migrated"),): 7,
        (("migronaut.background.documents.outcome", "skipped"),): 2,
        (("migronaut.background.documents.outcome", "failed"),): 1,
    }
    assert values("migronaut.background.transaction.retried") == {
        (("migronaut.background.retry.reason", "transient"),): 3}
    assert values("migronaut.background.throttled") == {
        (("migronaut.background.throttle.reason", "slow"),): 1}
    assert values("migronaut.background.drift.detected") == {
        (("migronaut.background.drift.action", "reopened"),
         ("migronaut.background.drift.source", "poll")): 1}
    assert values("migronaut.background.lease.lost") == {(): 1}
    assert values("migronaut.background.leases.reclaimed") == {(): 2}
    assert all(p.attributes["db.namespace"] == "app" for ps in metrics.values() for p in ps)


def test_without_a_meter_the_background_emitter_is_not_wrapped() -> None:
    from migronaut.observability.telemetry import DISABLED, Telemetry

    def emit(event: str, payload: dict[str, Any]) -> None:
        pass

    assert DISABLED.observe_background(emit) is emit
    assert Telemetry(tracer=trace.NoOpTracer()).observe_background(emit) is emit
