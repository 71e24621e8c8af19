"""OpenTelemetry spans and metrics of runs, migrations and background work.

Reference core §10.5 and background §7.3. Telemetry is optional and off by default: without a
``telemetry`` config value nothing here imports ``opentelemetry`` and every hook in the run flow
is a call on a no-op object. With one, spans and metrics go through the tracer and meter the user
configured (``opentelemetry-api``, the ``otel`` extra), or through the global providers for
``telemetry=True``.

Invariants:

* **Telemetry never changes the work.** Every call into a tracer, span, meter or instrument is
  guarded: whatever it raises is logged at debug level (logger ``migronaut.telemetry``) and
  dropped. migronaut never hands its work to the tracer — no SDK callback or context manager
  wraps it. Spans are started with ``tracer.start_span`` and made *current* through the context
  API (``context.attach``/``detach``), so the work runs exactly once, in migronaut's own frame,
  whatever the tracer does, and driver spans (pymongo instrumentation) nest under ours.
* **Failures are a status, not an event.** A failed span gets status ``ERROR`` with the redacted
  message (credentials and duplicate-key values masked, at most 1024 characters) and
  ``error.type`` = the migronaut error code, else the exception's class name, else ``_OTHER``;
  no exception events are recorded. Success leaves the status unset.
* **Every span and point carries** ``db.namespace`` (the database name) and the user's
  ``attributes`` (at most 20 scalars, which can never override migronaut's own keys). Migration
  file names are span attributes only, never metric attributes (unbounded cardinality).
* **Background lanes pay nothing when telemetry is off.** The slice span is one no-op ``with`` per
  slice; the background metrics are derived from the background events the lanes emit anyway
  (:meth:`Telemetry.observe_background` wraps the engine's emitter only when a meter is set).
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

from migronaut._redact import redact
from migronaut._version import __version__
from migronaut.errors import ConfigInvalidError, MigronautError, describe_exception
from migronaut.observability.telemetry_values import telemetry_issue, telemetry_parts

__all__ = [
    "BUCKETS",
    "DISABLED",
    "NO_RUN",
    "RunTrace",
    "Scope",
    "Telemetry",
    "error_type",
    "resolve_telemetry",
    "status_message",
]

#: Histogram bucket boundaries in seconds (reference core §10.5).
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
STATUS_MESSAGE_MAX = 1024
SCOPE = "migronaut"

#: Histograms (seconds, :data:`BUCKETS`): name -> description.
HISTOGRAMS: Mapping[str, str] = {
    "migronaut.run.duration": "Duration of a run that got the lock, lock acquisition included",
    "migronaut.migration.duration": "Duration of one migration: hooks, body and changelog write",
    "migronaut.lock.acquire.duration": "Time to acquire the migration lock",
    "migronaut.lock.wait.duration": "Time run_migrations waited for a lock held elsewhere",
    "migronaut.converge.search.wait.duration": "Time converge waited for search index builds",
    "migronaut.background.slice.duration": "Duration of one background slice (one held lease)",
    "migronaut.background.batch.duration": "Work latency of one background batch "
                                           "(read, transforms, writes)",
    "migronaut.fleet.tenant.duration": "Duration of one tenant of a fleet run",
}
#: Counters: name -> (unit, description).
COUNTERS: Mapping[str, tuple[str, str]] = {
    "migronaut.lock.refused": ("{refusal}", "Runs refused because another run held the lock"),
    "migronaut.lock.lost": ("{loss}", "Runs that lost the migration lock mid-run"),
    "migronaut.background.documents": ("{document}", "Documents handled by background batches"),
    "migronaut.background.throttled": ("{change}", "Adaptive throttle changes"),
    "migronaut.background.drift.detected": ("{finding}", "Old-shape documents found after "
                                                         "completion"),
    "migronaut.background.transaction.retried": ("{retry}", "Retried background transactions"),
    "migronaut.background.lease.lost": ("{loss}", "Partition leases lost by a lane"),
    "migronaut.background.leases.reclaimed": ("{lease}", "Expired partition leases reclaimed"),
}

Scalar = str | bool | int | float
Emit = Callable[[str, dict[str, Any]], None]
_T = TypeVar("_T")

_log = logging.getLogger("migronaut.telemetry")
_api_modules: tuple[ModuleType, ModuleType] | None = None
_api_missing = False


# ----------------------------------------------------------------------------- helpers


def _guarded(what: str, call: Callable[[], _T]) -> _T | None:
    """Call into the SDK; a failure is logged at debug level and becomes ``None``."""
    try:
        return call()
    except Exception as error:  # the SDK is the user's: it never breaks the work
        _log.debug("telemetry: %s failed: %s", what, describe_exception(error))
        return None


def _api() -> tuple[ModuleType, ModuleType] | None:
    """``(opentelemetry.trace, opentelemetry.context)``, or ``None`` without the API."""
    global _api_modules, _api_missing
    if _api_modules is None and not _api_missing:
        try:  # by name: opentelemetry is a namespace package, typed only where installed
            trace = importlib.import_module("opentelemetry.trace")
            context = importlib.import_module("opentelemetry.context")
        except ImportError:
            _api_missing = True
        else:
            _api_modules = (trace, context)
    return _api_modules


def error_type(error: BaseException) -> str:
    """The ``error.type`` attribute: our error code, else the class name, else ``_OTHER``."""
    if isinstance(error, MigronautError):
        return error.code
    return type(error).__name__ or "_OTHER"


def status_message(error: BaseException) -> str:
    """The span status message: redacted message and cause, at most 1024 characters."""
    if isinstance(error, MigronautError):
        text = error.message
        cause = error.context.get("cause")
        if isinstance(cause, str) and cause and cause not in text:
            text = f"{text} (cause: {cause})"
    else:
        text = describe_exception(error)
    text = redact(text)
    if len(text) > STATUS_MESSAGE_MAX:
        text = text[: STATUS_MESSAGE_MAX - 1] + "…"
    return text


def _scalars(values: Mapping[str, Any]) -> dict[str, Scalar]:
    """Attributes without the ``None`` values (OpenTelemetry rejects them)."""
    return {k: v for k, v in values.items() if v is not None}


# --------------------------------------------------------------------------- spans


class Scope:
    """A span that is current while a ``with`` block runs; this base does nothing."""

    def __enter__(self) -> Scope:
        return self

    def __exit__(self, exc_type: object, error: BaseException | None, tb: object) -> None:
        return None

    def set(self, attributes: Mapping[str, Any], *, metric: bool = False) -> None:
        """Add span attributes (``metric``: to the duration point's attributes too)."""

    def fail(self, error: BaseException) -> None:
        """End with an ERROR status for a failure that is returned, not raised."""


_NO_SCOPE = Scope()


class _LiveScope(Scope):
    """One span migronaut started and made current; closed once, never swallows an error."""

    def __init__(
        self,
        telemetry: Telemetry,
        name: str,
        attributes: Mapping[str, Any],
        *,
        parent: _LiveScope | None = None,
        histogram: str | None = None,
        metric_attributes: Mapping[str, Any] | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._name = name
        self._attributes = telemetry.attributes(attributes)
        self._parent = parent
        self._histogram = histogram
        self._metric_attributes = dict(metric_attributes or {})
        self._span: Any = None
        self._token: Any = None
        self._started = 0.0
        self._failure: BaseException | None = None

    def open(self) -> None:
        self._started = time.monotonic()
        tracer = self._telemetry.tracer
        if tracer is None:
            return
        api = _api()
        options: dict[str, Any] = {"attributes": self._attributes}
        parent = self._parent._span if self._parent is not None else None
        if api is not None and parent is not None:
            options["context"] = _guarded("set_span_in_context",
                                          lambda: api[0].set_span_in_context(parent))
        self._span = _guarded("start_span", lambda: tracer.start_span(self._name, **options))
        if self._span is not None and api is not None:
            span = self._span
            self._token = _guarded(
                "context.attach", lambda: api[1].attach(api[0].set_span_in_context(span))
            )

    def set(self, attributes: Mapping[str, Any], *, metric: bool = False) -> None:
        values = _scalars(attributes)
        if metric:
            self._metric_attributes.update(values)
        span = self._span
        if span is not None:
            _guarded("span.set_attributes", lambda: span.set_attributes(values))

    def fail(self, error: BaseException) -> None:
        self._failure = error

    def close(self, error: BaseException | None) -> None:
        error = error if error is not None else self._failure
        span, self._span = self._span, None
        token, self._token = self._token, None
        api = _api()
        if token is not None and api is not None:
            _guarded("context.detach", lambda: api[1].detach(token))
        if span is not None:
            if error is not None:
                kind, message = error_type(error), status_message(error)
                _guarded("span.set_attribute", lambda: span.set_attribute("error.type", kind))
                if api is not None:
                    trace = api[0]
                    _guarded("span.set_status", lambda: span.set_status(
                        trace.Status(trace.StatusCode.ERROR, message)))
            _guarded("span.end", lambda: span.end())
        if self._histogram is not None:
            points = dict(self._metric_attributes)
            if error is not None:
                points["error.type"] = error_type(error)
            self._telemetry.record(self._histogram, time.monotonic() - self._started, points)

    def __enter__(self) -> _LiveScope:
        self.open()
        return self

    def __exit__(self, exc_type: object, error: BaseException | None, tb: object) -> None:
        self.close(error)
        return None


class RunTrace:
    """The ``migronaut.run`` span and metrics of one run that got the lock; this base (used when
    telemetry is off) does nothing."""

    def migration(
        self, name: str, direction: str, *, batch: int | None, index: int, total: int
    ) -> Scope:
        """The ``migronaut.migration`` span, current during hooks, body and changelog write."""
        return _NO_SCOPE

    def migration_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Attributes learnt once the migration file is loaded (``.transaction``)."""

    def lock_lost(self, reason: str) -> None:
        """Count a lost lock once per run (heartbeat and deadline may both report it)."""

    def end(
        self,
        error: BaseException | None,
        *,
        applied: int,
        reverted: int,
        skipped: int,
        total: int,
        duration_s: float,
    ) -> None:
        """End the span after the lock release, with the counts; record the run duration."""


NO_RUN = RunTrace()


class _LiveRunTrace(RunTrace):
    def __init__(
        self,
        telemetry: Telemetry,
        *,
        run_id: str,
        command: str,
        direction: str | None,
        acquire_ms: int | None,
    ) -> None:
        self._telemetry = telemetry
        self._run_id = run_id
        self._points = _scalars({"migronaut.run.command": command,
                                 "migronaut.run.direction": direction})
        self._lost_reason: str | None = None
        self._lost_lock = threading.Lock()
        self._current: _LiveScope | None = None
        lock = {"migronaut.lock.skipped": True} if acquire_ms is None else \
            {"migronaut.lock.acquire_ms": acquire_ms}
        self._scope = _LiveScope(telemetry, "migronaut.run", {
            "migronaut.run.id": run_id, **self._points, **lock,
        })
        self._scope.open()

    def migration(
        self, name: str, direction: str, *, batch: int | None, index: int, total: int
    ) -> Scope:
        scope = _LiveScope(
            self._telemetry, "migronaut.migration", {
                "migronaut.migration.name": name, "migronaut.migration.direction": direction,
                "migronaut.migration.batch": batch, "migronaut.migration.index": index,
                "migronaut.migration.total": total, "migronaut.run.id": self._run_id,
            },
            parent=self._scope, histogram="migronaut.migration.duration",
            metric_attributes={"migronaut.migration.direction": direction},
        )
        self._current = scope
        return scope

    def migration_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._current is not None:
            self._current.set(attributes)

    def lock_lost(self, reason: str) -> None:
        with self._lost_lock:
            if self._lost_reason is not None:
                return
            self._lost_reason = reason
        self._telemetry.add("migronaut.lock.lost", 1, {"migronaut.lock.lost_reason": reason})

    def end(
        self,
        error: BaseException | None,
        *,
        applied: int,
        reverted: int,
        skipped: int,
        total: int,
        duration_s: float,
    ) -> None:
        self._current = None
        self._scope.set({
            "migronaut.run.applied": applied, "migronaut.run.reverted": reverted,
            "migronaut.run.skipped": skipped, "migronaut.run.total": total,
            "migronaut.lock.lost_reason": self._lost_reason,
        })
        self._scope.close(error)
        points = dict(self._points)
        if error is not None:
            points["error.type"] = error_type(error)
        self._telemetry.record("migronaut.run.duration", duration_s, points)


# ------------------------------------------------------------------------ the facade


class Telemetry:
    """The resolved ``telemetry`` of one migrator: a tracer and/or a meter and the attributes
    every span and point carries. :data:`DISABLED` is the instance used when none is set."""

    def __init__(
        self,
        *,
        tracer: Any = None,
        meter: Any = None,
        attributes: Mapping[str, Scalar] | None = None,
        namespace: str | None = None,
    ) -> None:
        self.tracer = tracer
        self.meter = meter
        self.enabled = tracer is not None or meter is not None
        common: dict[str, Scalar] = dict(attributes or {})
        if namespace:
            common["db.namespace"] = namespace
        self._common = common
        self._instruments: dict[str, Any] = {}

    def attributes(self, ours: Mapping[str, Any]) -> dict[str, Scalar]:
        """The user's attributes, ``db.namespace`` and ours (ours win; ``None`` dropped)."""
        return {**self._common, **_scalars(ours)}

    # -- metrics ----------------------------------------------------------------------------
    def _instrument(self, name: str) -> Any:
        instrument = self._instruments.get(name)
        if instrument is None and self.meter is not None:
            meter = self.meter
            if name in HISTOGRAMS:
                instrument = _guarded(f"create_histogram({name})", lambda: _histogram(
                    meter, name, HISTOGRAMS[name]))
            else:
                unit, description = COUNTERS[name]
                instrument = _guarded(f"create_counter({name})", lambda: meter.create_counter(
                    name, unit=unit, description=description))
            if instrument is not None:
                self._instruments[name] = instrument
        return instrument

    def record(self, name: str, seconds: float, attributes: Mapping[str, Any]) -> None:
        histogram = self._instrument(name)
        if histogram is not None:
            points = self.attributes(attributes)
            _guarded(f"{name}.record", lambda: histogram.record(seconds, attributes=points))

    def add(self, name: str, value: int, attributes: Mapping[str, Any]) -> None:
        counter = self._instrument(name)
        if counter is not None:
            points = self.attributes(attributes)
            _guarded(f"{name}.add", lambda: counter.add(value, attributes=points))

    # -- runs --------------------------------------------------------------------------------
    def start_run(
        self, run_id: str, command: str, direction: str | None, *, acquire_ms: int | None
    ) -> RunTrace:
        """Open the run span (current until :meth:`RunTrace.end`); ``acquire_ms`` is ``None``
        for a run without the lock."""
        if not self.enabled:
            return NO_RUN
        if acquire_ms is not None:
            self.record("migronaut.lock.acquire.duration", acquire_ms / 1000, {})
        return _LiveRunTrace(self, run_id=run_id, command=command, direction=direction,
                             acquire_ms=acquire_ms)

    def lock_refused(self, command: str) -> None:
        """A run never got the lock: no span, one ``migronaut.lock.refused``."""
        if self.meter is not None:
            self.add("migronaut.lock.refused", 1, {"migronaut.run.command": command})

    def lock_wait(self, seconds: float, outcome: str) -> None:
        """``run_migrations(on_lock_held="wait")`` waited: ``acquired``, ``timeout``,
        ``aborted`` or ``failed``."""
        if self.meter is not None:
            self.record("migronaut.lock.wait.duration", seconds,
                        {"migronaut.lock.wait.outcome": outcome})

    def search_wait(self, seconds: float, outcome: str) -> None:
        """``converge`` waited for search index builds: ``ready``, ``failed``, ``timeout``,
        ``unreadable`` or ``aborted``."""
        if self.meter is not None:
            self.record("migronaut.converge.search.wait.duration", seconds,
                        {"migronaut.converge.search.wait.outcome": outcome})

    # -- background ----------------------------------------------------------------------------
    def background_slice(
        self, name: str, *, partition: str, generation: int, slot: int, run_id: str | None
    ) -> Scope:
        """``migronaut.background.slice``: one per held lease, current around its batches."""
        if not self.enabled:
            return _NO_SCOPE
        return _LiveScope(self, "migronaut.background.slice", {
            "migronaut.migration.name": name, "migronaut.background.partition": partition,
            "migronaut.background.generation": generation,
            "migronaut.background.slot": slot,
            "migronaut.run.id": run_id,
        }, histogram="migronaut.background.slice.duration",
            metric_attributes={"migronaut.background.slice.outcome": "error"})  # until set

    def fleet_tenant(self, tenant: str, cluster: str, command: str, run_id: str) -> Scope:
        """``migronaut.fleet.tenant``: one per tenant of a fleet run, current around the
        tenant's ordinary command (its ``migronaut.run`` span is a child)."""
        if not self.enabled:
            return _NO_SCOPE
        return _LiveScope(self, "migronaut.fleet.tenant", {
            "db.namespace": tenant, "migronaut.fleet.cluster": cluster,
            "migronaut.fleet.command": command, "migronaut.fleet.run.id": run_id,
        }, histogram="migronaut.fleet.tenant.duration",
            metric_attributes={"migronaut.fleet.command": command})

    def background_coordinate(self, name: str, *, driver: str) -> Scope:
        """``migronaut.background.coordinate``: one per step that held the coordinator lock."""
        if self.tracer is None:
            return _NO_SCOPE
        return _LiveScope(self, "migronaut.background.coordinate", {
            "migronaut.migration.name": name, "migronaut.background.driver": driver,
        })

    def leases_reclaimed(self, count: int) -> None:
        if self.meter is not None and count:
            self.add("migronaut.background.leases.reclaimed", count, {})

    def observe_background(self, emit: Emit) -> Emit:
        """``emit`` itself without a meter; else an emitter that also derives the background
        metrics from the events (batches, throttle changes, drift, lost leases)."""
        if self.meter is None:
            return emit

        def observed(event: str, payload: dict[str, Any]) -> None:
            try:
                self._background_event(event, payload)
            except Exception as error:  # a malformed payload never stops the event
                _log.debug("telemetry: %s not measured: %s", event, describe_exception(error))
            emit(event, payload)

        return observed

    def _background_event(self, event: str, payload: Mapping[str, Any]) -> None:
        if event == "background:batch":
            latency = payload.get("latencyMs")
            if isinstance(latency, (int, float)):
                self.record("migronaut.background.batch.duration", latency / 1000, {})
            counters = payload.get("counters") or {}
            for outcome in ("migrated", "skipped", "failed"):
                count = counters.get(outcome)
                if isinstance(count, int) and count > 0:
                    self.add("migronaut.background.documents", count,
                             {"migronaut.background.documents.outcome": outcome})
            retries = counters.get("txnRetries")
            if isinstance(retries, int) and retries > 0:
                self.add("migronaut.background.transaction.retried", retries,
                         {"migronaut.background.retry.reason": "transient"})
        elif event == "background:throttle":
            self.add("migronaut.background.throttled", 1,
                     {"migronaut.background.throttle.reason": payload.get("reason")})
        elif event == "background:drift":
            self.add("migronaut.background.drift.detected", 1, {
                "migronaut.background.drift.source": payload.get("source"),
                "migronaut.background.drift.action": payload.get("action"),
            })
        elif event == "background:lease:lost":
            self.add("migronaut.background.lease.lost", 1, {})


DISABLED = Telemetry()


def _histogram(meter: Any, name: str, description: str) -> Any:
    """A histogram in seconds with our buckets; older APIs (< 1.25) lack the advisory, so they
    get the SDK's default buckets unless the application configures a View."""
    try:
        return meter.create_histogram(name, unit="s", description=description,
                                      explicit_bucket_boundaries_advisory=list(BUCKETS))
    except TypeError:
        return meter.create_histogram(name, unit="s", description=description)


# ------------------------------------------------------------------------ configuration


def _invalid(path: str, problem: str) -> ConfigInvalidError:
    return ConfigInvalidError(
        f"Invalid configuration: {path}: {problem}",
        {"issues": [{"path": path, "message": problem}]},
    )


def _provider(kind: str, value: Any) -> Any:
    """A tracer/meter object (checked by the config), ``None``, or the global one for ``True``."""
    if value is None or value is False:
        return None
    if value is True:
        api = _api()
        if api is None:
            raise _invalid(f"telemetry.{kind}", "True needs the OpenTelemetry API: "
                           "pip install 'migronaut[otel]'")
        if kind == "tracer":
            return api[0].get_tracer(SCOPE, __version__)
        metrics = importlib.import_module("opentelemetry.metrics")
        return metrics.get_meter(SCOPE, __version__)
    return value


def resolve_telemetry(value: Any, *, namespace: str | None) -> Telemetry:
    """The ``telemetry`` config value as a :class:`Telemetry`; ``CONFIG_INVALID`` on a bad one.

    Accepted: ``None``/``False`` (off), ``True`` (the global tracer and meter provider, named
    ``migronaut``), or a mapping / object with ``tracer``, ``meter`` (an object, or ``True`` for
    the global one) and ``attributes``.
    """
    issue = telemetry_issue(value)
    if issue is not None:
        raise _invalid(*issue)
    parts = telemetry_parts(value)
    if not parts:
        return DISABLED
    # user attributes leave the process on every span and point: redacted like everything else
    attributes: dict[str, Scalar] = {
        key: redact(item) if isinstance(item, str) else item
        for key, item in (parts.get("attributes") or {}).items()
    }
    tracer = _provider("tracer", parts.get("tracer"))
    meter = _provider("meter", parts.get("meter"))
    if tracer is None and meter is None:
        return DISABLED
    return Telemetry(tracer=tracer, meter=meter, attributes=attributes, namespace=namespace)
