"""The engine of one database's background migrations, without the operator features.

:class:`EngineCore` composes the parts at the bottom of ``background/``'s engine: coordinator
steps and plan commits (:mod:`~migronaut.background.coordination.coordinator`), controls
(:mod:`~migronaut.background.coordination.controls`), requirements
(:mod:`~migronaut.background.state.requirements`), state reads
(:mod:`~migronaut.background.state.views`) and driving in this process
(:mod:`~migronaut.background.coordination.driving`), over the handles they share
(:mod:`~migronaut.background.coordination.handles`). The operator features — drift verification, dry
runs, the live watcher, the runner — work through it and sit above it; the façade
(:class:`~migronaut.background.engine.BackgroundEngine`) composes them. Nothing here imports them.

It never takes the migration lock and has no run id of its own: coordinator steps are serialised
per migration by the ``background:<name>`` lock, and everything else is a compare-and-set on the
stored state, so any number of engines in any number of processes can drive the same migration
(reference background §3, §2.5, §6.1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from migronaut.background.coordination.controls import ControlResult, Controls
from migronaut.background.coordination.coordinator import Answer, Coordinator
from migronaut.background.coordination.driving import Driver
from migronaut.background.coordination.handles import EngineHandles
from migronaut.background.state.requirements import Requirements
from migronaut.background.state.views import StateViews
from migronaut.core.context import Cancellation

if TYPE_CHECKING:
    from migronaut.background.lanes.slices import SliceResult
    from migronaut.background.planning.job import BackgroundJob

__all__ = ["EngineCore"]


class EngineCore(EngineHandles):
    """Coordinator, controls and views over one database's background migrations.

    Built with the keyword arguments of
    :class:`~migronaut.background.coordination.handles.EngineHandles`; each method hands the work to
    the part that owns it (``coordinator``, ``controls``, ``requirements``, ``views``, ``driver``).
    """

    # The parts, built on first use over the handles (so the constructor is
    # :class:`EngineHandles`' own, fully typed).
    @cached_property
    def requirements(self) -> Requirements:
        return Requirements(self)

    @cached_property
    def coordinator(self) -> Coordinator:
        return Coordinator(self, self.requirements)

    @cached_property
    def controls(self) -> Controls:
        return Controls(self, self.requirements)

    @cached_property
    def views(self) -> StateViews:
        return StateViews(self, self.requirements)

    @cached_property
    def driver(self) -> Driver:
        return Driver(self, self.coordinator, self.views)

    # -- the coordinator ------------------------------------------------------------------
    def coordinate(
        self, name: str, *, driver: str = "local", cancellation: Cancellation | None = None,
        ref: str | None = None, round: int | None = None,
    ) -> Answer:
        """One idempotent coordinator step under the ``background:<name>`` lock.

        ``ref`` (a queue task id) is recorded as ``coordinator.ref``; ``round`` is a queue
        chain's round (driver ``celery``: ``None`` starts a new chain, a stale round answers
        ``superseded``) — see :meth:`Coordinator.coordinate`.
        """
        return self.coordinator.coordinate(name, driver=driver, cancellation=cancellation,
                                           ref=ref, round=round)

    def glance(self, name: str, *, round: int | None = None) -> Answer | None:
        """What a coordinator step would answer when two reads without the lock can tell
        (finished, paused, or lanes at work on every partition they could take), else ``None``
        — see :meth:`Coordinator.glance`."""
        return self.coordinator.glance(name, round=round)

    # -- lanes ----------------------------------------------------------------------------
    def run_slice(
        self,
        name: str,
        *,
        slice_ms: int | None = None,
        cancellation: Cancellation | None = None,
        ref: str | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> SliceResult:
        """One lane slice of ``name`` (reference background §4.1): claim, batches, settle.

        ``state`` is the migration's state when the caller has just read it; ``ref`` (a queue
        task id) prefixes the lease owner, so a lease says which task holds it. A migration
        that is not being processed answers its outcome without loading the file; otherwise
        ``CHECKSUM_MISMATCH``/``MIGRATION_FILE_NOT_FOUND`` when the file is not the pinned
        one, and a failed slice raises after counting the failure on its partition.
        """
        import uuid

        from pymongo.errors import PyMongoError

        from migronaut.background.batches.failures import wrap
        from migronaut.background.lanes.slices import run_slice, settled_outcome

        if state is None:
            try:
                state = self.store.get(name)
            except PyMongoError as error:  # (a timeout, a lost connection): typed, as a slice's
                raise wrap(name, error) from error
        settled = settled_outcome(state)
        if settled is not None:
            return settled
        assert state is not None
        owner = uuid.uuid4().hex if ref is None else f"{ref}:{uuid.uuid4().hex[:12]}"
        return run_slice(
            store=self.store, job=self.job(state), db=self.db, owner=owner, ttl_ms=self.ttl_ms,
            cancellation=cancellation or Cancellation(), slice_ms=slice_ms, emit=self.emit,
            logger=self.logger, telemetry=self.telemetry, state=state,
        )

    def supports_transactions(self) -> bool:
        """Whether the server runs transactions (see :meth:`Coordinator.supports_transactions`)."""
        return self.coordinator.supports_transactions()

    def version_hint(self, job: BackgroundJob) -> Any:
        """The version index ``{field: 1, _id: 1}`` when it exists (warned once when missing)."""
        return self.coordinator.version_hint(job)

    def fail_state(self, name: str, reason: str) -> None:
        self.coordinator.fail_state(name, reason)

    # -- requires -------------------------------------------------------------------------
    def requirement_status(self, required: str, changelog: Any = None) -> str:
        return self.requirements.requirement_status(required, changelog)

    def unmet(self, requires: Sequence[str], changelog: Any = None) -> list[dict[str, str]]:
        return self.requirements.unmet(requires, changelog)

    def try_unblock(self, state: Mapping[str, Any]) -> dict[str, Any]:
        return self.requirements.try_unblock(state)

    def on_completed(self, name: str) -> None:
        """A forward migration completed: unblock the migrations waiting for it."""
        self.requirements.on_completed(name)

    # -- controls -------------------------------------------------------------------------
    def control(
        self,
        name: str,
        action: str,
        *,
        requested_by: str | None = None,
        reason: str | None = None,
        from_start: bool = False,
        wait: bool = False,
        wait_timeout_s: float = 120.0,
    ) -> ControlResult:
        """pause / resume / cancel / retry (reference §2.5), each a CAS with history."""
        return self.controls.control(
            name, action, requested_by=requested_by, reason=reason, from_start=from_start,
            wait=wait, wait_timeout_s=wait_timeout_s)

    def repin(self, name: str, *, requested_by: str | None = None,
              reason: str | None = None, changelog: Any = None) -> ControlResult:
        """Adopt the file as it is now: store its checksum and spec; replan when matching
        changes."""
        return self.controls.repin(name, requested_by=requested_by, reason=reason,
                                   changelog=changelog)

    def unlock(
        self, name: str, *, requested_by: str | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        """Force-release the coordinator lock and every lease (holders are fenced); the state's
        history records who did it and why."""
        return self.controls.unlock(name, requested_by=requested_by, reason=reason)

    def would_change(self, name: str, action: str) -> tuple[str, bool]:
        """``(status, changes)``: what ``action`` on ``name`` would do now, without doing it.

        An unregistered ``name`` is ``NOT_APPLIED`` and an action its status does not allow is
        ``BACKGROUND_CONFLICT`` — what :meth:`control` itself would raise (a confirmation
        prompt asks only when something would change). ``retry`` of a completed migration
        reopens it.
        """
        from migronaut.background.state.fields import transition

        status = str(self.store.require(name)["status"])
        effective = "reopen" if action == "retry" and status == "completed" else action
        return status, transition(name, status, effective)[1]

    # -- views ----------------------------------------------------------------------------
    def ready(self) -> None:
        """Connect and check the state collections' indexes (fail fast on a bad URI)."""
        self.store.ready()

    def state(self, name: str) -> dict[str, Any] | None:
        """The stored state document of ``name`` (read on the primary), or ``None``."""
        return self.store.get(name)

    def require(self, name: str) -> dict[str, Any]:
        """The stored state of ``name``; ``NOT_APPLIED`` (exit 9) when it is not registered."""
        return self.store.require(name)

    def states(self, statuses: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Every stored state (or those in ``statuses``), oldest registration first."""
        return self.store.all(statuses)

    def status(self, name: str | None = None, *, invalid_rows: bool = False
               ) -> list[dict[str, Any]]:
        """The ``BackgroundStatus`` view of ``name`` (or of every registered one), with live
        lease counts and rolled-up totals — what ``background status --json`` prints. A state
        it cannot read is ``STATE_INVALID`` (``invalid_rows``: a row saying so, see
        :meth:`StateViews.status`)."""
        return self.views.status(name, invalid_rows=invalid_rows)

    def view(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The ``BackgroundStatus`` view (reference background §6.2)."""
        return self.views.view(state)

    def partitions_view(self, name: str) -> list[dict[str, Any]]:
        """Every partition of ``name``, newest generation first, then by sequence — what
        ``background status NAME --partitions --json`` prints (``NOT_APPLIED`` when ``name`` is
        not registered)."""
        return self.views.partitions_view(name)

    def runnable(self) -> list[dict[str, Any]]:
        """Blocked/pending/running migrations a worker should serve, oldest first."""
        return self.views.runnable()

    def stalled(self, quiet_ms: int, *, name: str | None = None,
                coordinator: bool = True) -> list[str]:
        """Running migrations with no live lease and no sign of life for ``quiet_ms`` (server
        time) — what a queue's takeover restarts. See :meth:`StateViews.stalled`."""
        return self.views.stalled(quiet_ms, name=name, coordinator=coordinator)

    def chains(self, names: Sequence[str]) -> dict[str, bool]:
        """Of ``names``, those whose queue coordinator chain recorded a heartbeat, and whether
        it is live (server time) — see :meth:`StateViews.chains`."""
        return self.views.chains(names)

    def failing(self, name: str) -> bool:
        """Whether an open partition of ``name`` counts failed slices in a row (a lane may be
        in a retry back-off) — see :meth:`StateViews.failing`."""
        return self.views.failing(name)

    def renew_chain(self, name: str, *, round: int, ref: str, ttl_ms: int) -> bool:
        """Renew the heartbeat of ``name``'s coordinator chain of ``round`` (task ``ref``) for
        ``ttl_ms`` — see :meth:`BackgroundStore.renew_chain`."""
        return self.store.renew_chain(name, round=round, ref=ref, ttl_ms=ttl_ms)

    # -- driving --------------------------------------------------------------------------
    def drive(
        self,
        name: str,
        *,
        concurrency: int = 1,
        until_done: bool = True,
        cancellation: Cancellation | None = None,
        driver: str = "local",
        slice_ms: int | None = None,
        inline: bool = False,
        raise_if_busy: bool = False,
    ) -> dict[str, Any]:
        """Coordinate and run lanes until the migration settles (reference §6.1 runBackground).

        ``raise_if_busy`` (``run --once``): another process holding the coordinator lock is
        ``LOCK_ALREADY_HELD`` instead of a wait.
        """
        return self.driver.drive(
            name, concurrency=concurrency, until_done=until_done, cancellation=cancellation,
            driver=driver, slice_ms=slice_ms, inline=inline, raise_if_busy=raise_if_busy)
