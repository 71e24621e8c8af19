"""Enqueueing background work: heals (one coordinator per runnable migration, takeovers for
stalled ones), one named migration, and the deduplicated sends the tasks fan out with
(reference background §6.4 "Heals").

Deduplication. Celery has no job ids that absorb a second send, so this module keeps a ledger in
the result backend: before a task with a deterministic id is sent, its state is set to
``QUEUED``; a send whose id is already live (``QUEUED``, ``RECEIVED``, ``STARTED``, ``RETRY``) is
skipped. A chain that continues itself sends itself again under the same id, marked ``QUEUED``
first (:func:`send_queued`), and writes its result only when it ends, so a live coordinator
chain absorbs a heal and a live lane slot absorbs a second fan-out. The ledger is only an
optimisation: correctness stays in MongoDB (the coordinator lock, rounds, leases), so a lost
ledger (``FLUSHDB``) or a stale one (a killed worker's task left ``QUEUED``) costs at most a
duplicate task or a takeover with a new round — never a document migrated twice.

Liveness. Whether a coordinator chain is alive is MongoDB's to say, not the ledger's: a running
chain renews a heartbeat on the migration's state (``chain.until``, a short TTL, as leases do).
A heal skips a migration whose chain's heartbeat is live, and takes over one whose heartbeat
expired even while the ledger still calls the dead chain's task live. An entry the ledger cannot
read (garbage another client wrote) is unknown, never an error: the send goes out and MongoDB's
rounds and leases sort out a duplicate.

Tenants. A fleet tenant's jobs carry its ``tenant`` and ``cluster`` and their ids are scoped by
them (``<queue>:<cluster>:<tenant>:bg-…``): two tenants' migrations of one name never share a
chain, a lane slot or a ledger entry, and a worker runs the job against that tenant's database.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from migronaut.background.state.fields import stored_round, understood
from migronaut.errors import NotAppliedError
from migronaut.executors.celery.installation import has_result_backend
from migronaut.executors.celery.payloads import VERSION, fragment
from migronaut.fleet.tenants import Tenant

if TYPE_CHECKING:
    from migronaut.background.engine import BackgroundEngine
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["coordinator_id", "enqueue_background", "lane_id", "send_once", "send_queued",
           "take_over_dead_chains", "takeover_id", "tenant_fields", "tenant_of"]

#: Result-backend states of a task that is queued, running or waiting for its countdown.
LIVE_STATES = frozenset({"QUEUED", "RECEIVED", "STARTED", "RETRY"})
QUEUED = "QUEUED"
#: What reading a ledger entry that is not a Celery result raises (garbage bytes, JSON that is
#: not a result's meta): the entry is unknown, not a failed command.
_UNREADABLE: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError, AttributeError)

logger = logging.getLogger("migronaut")


def tenant_of(payload: dict[str, Any]) -> Tenant | None:
    """The fleet tenant a checked coordinator or lane payload names; ``None``: the worker's own
    database."""
    if "tenant" not in payload:
        return None
    return Tenant(str(payload["tenant"]), str(payload["cluster"]))


def _scope(queue: str, tenant: Tenant | None) -> str:
    """What a job id starts with: the queue, then the tenant's cluster and name for a tenant's
    job (fragments never hold ``:``, so no tenant's id can equal another's or a plain one)."""
    if tenant is None:
        return queue
    return f"{queue}:{fragment(tenant.cluster)}:{fragment(tenant.name)}"


def coordinator_id(queue: str, migration: str, tenant: Tenant | None = None) -> str:
    """The id of a migration's coordinator chain on the background ``queue`` (a heal is
    absorbed by a live one). Ids are namespaced by queue (queue names never hold ``:``): two
    deployments sharing a result backend under queues of their own never absorb each other's
    sends — and by ``tenant``, for a fleet tenant's migration."""
    return f"{_scope(queue, tenant)}:bg-{fragment(migration)}"


def takeover_id(queue: str, migration: str, round: int, tenant: Tenant | None = None) -> str:
    """The id of the takeover of a stalled chain of ``round`` (one takeover per round)."""
    return f"{_scope(queue, tenant)}:bg-{fragment(migration)}-t{round}"


def lane_id(queue: str, migration: str, registration: str, generation: int, round: int,
            lane: int, tenant: Tenant | None = None) -> str:
    """The id of lane slot ``lane`` of a generation in a round: a redelivered coordinator
    fans out the same ids, so it never doubles the lanes."""
    return (f"{_scope(queue, tenant)}:bgl-{fragment(migration)}-{fragment(registration)}"
            f"-g{generation}-r{round}-l{lane}")


def _has_ledger(installed: MigronautCelery) -> bool:
    return has_result_backend(installed.app)


def is_live(installed: MigronautCelery, task_id: str) -> bool | None:
    """Whether the ledger says ``task_id`` is queued, running or waiting for its countdown;
    ``None`` when its entry cannot be read (logged, and the entry cleared): unknown, so
    MongoDB decides."""
    if not _has_ledger(installed):
        return False
    from kombu.exceptions import DecodeError

    unreadable: tuple[type[BaseException], ...] = (DecodeError, *_UNREADABLE)
    try:
        state = installed.app.AsyncResult(task_id).state
    except unreadable as error:
        logger.warning("⚠ the result backend's entry for task %s cannot be read (%s) — treated "
                       "as unknown and cleared: MongoDB's rounds and leases decide", task_id,
                       type(error).__name__)
        # (the backend reads an entry back before it overwrites it: a send's mark needs it gone)
        installed.app.backend.forget(task_id)
        return None
    return str(state) in LIVE_STATES


def send_once(
    installed: MigronautCelery, kind: str, payload: dict[str, Any], task_id: str, *,
    countdown: float | None = None,
) -> bool:
    """Send a ``kind`` task with ``task_id`` on the background queue unless the ledger calls
    that id live (an unreadable entry does not); whether it was sent (see
    :func:`send_queued`)."""
    if is_live(installed, task_id):
        return False
    send_queued(installed, kind, payload, task_id, countdown=countdown)
    return True


def send_queued(
    installed: MigronautCelery, kind: str, payload: dict[str, Any], task_id: str, *,
    countdown: float | None = None,
) -> None:
    """Mark ``task_id`` ``QUEUED`` in the ledger, then send it (the mark is forgotten if the
    send fails): how a deduplicated send goes out, and how a running task continues as itself —
    its id stays live from this mark until it writes its result."""
    ledger = _has_ledger(installed)
    if ledger:
        installed.app.backend.store_result(task_id, None, QUEUED)
    try:
        installed.app.send_task(
            installed.task_name(kind), args=[payload], task_id=task_id,
            queue=installed.settings.background_queue_name, countdown=countdown or None)
    except BaseException:
        if ledger:
            installed.app.backend.forget(task_id)
        raise


def tenant_fields(tenant: Tenant | None) -> dict[str, str]:
    """The payload fields naming ``tenant`` (none for the worker's own database)."""
    return {} if tenant is None else {"tenant": tenant.name, "cluster": tenant.cluster}


def _coordinator_payload(migration: str, *, takeover: bool = False,
                         requested_by: str | None = None, reason: str | None = None,
                         tenant: Tenant | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"v": VERSION, "kind": "background", "migration": migration,
                               **tenant_fields(tenant)}
    if takeover:
        payload["takeover"] = True
    if requested_by:
        payload["requestedBy"] = requested_by[:128]
    if reason:
        payload["reason"] = reason[:512]
    return payload


def enqueue_background(
    installed: MigronautCelery,
    migration: str | None = None,
    *,
    stall_ms: int | None = None,
    requested_by: str | None = None,
    reason: str | None = None,
    engine: BackgroundEngine | None = None,
    tenant: Tenant | None = None,
) -> list[dict[str, Any]]:
    """Enqueue coordinators: for ``migration``, or (a heal) for every runnable one.

    A chain whose heartbeat in MongoDB is live absorbs its migration's coordinator, and so does
    one the ledger calls live that has not run a step yet (still queued). A chain the ledger
    calls live whose heartbeat expired is dead (its worker was killed): a takeover coordinator
    is sent, which starts a new round — the dead chain, if its message ever comes back, is
    superseded at its next step. So is a ``running`` migration with no heartbeat, no live lease
    and no sign of life for ``stall_ms`` (default the settings'). ``engine`` is the background
    engine to read states through (default this thread's worker engine); with ``tenant`` (a
    fleet tenant, ``engine`` its database's) the coordinators are that tenant's jobs. A named
    migration that is not registered is ``NOT_APPLIED``.

    Returns ``[{migration, id, takeover?}]``, one entry per coordinator task sent.
    """
    if tenant is not None and engine is None:
        raise TypeError("a tenant's coordinators are enqueued through the tenant's engine")
    engine = engine if engine is not None else installed.context.engine()
    quiet_ms = installed.settings.stall_ms if stall_ms is None else stall_ms
    if migration is not None:
        state = engine.state(migration)
        if state is None:
            raise NotAppliedError(
                f"Background migration {migration} is not registered — run up first",
                {"migration": migration})
        understood(state)  # a status it does not know is STATE_INVALID, not "nothing to do"
        names = [migration] if state.get("status") in ("blocked", "pending", "running") else []
        stalled = set(engine.stalled(quiet_ms, name=migration))
    else:
        names = [str(row["migration"]) for row in engine.runnable()]
        stalled = set(engine.stalled(quiet_ms))
    return _send_coordinators(installed, engine, names, engine.chains(names), stalled,
                              quiet_ms, requested_by=requested_by, reason=reason, tenant=tenant)


def take_over_dead_chains(installed: MigronautCelery, engine: BackgroundEngine | None = None,
                          *, tenant: Tenant | None = None) -> list[dict[str, Any]]:
    """The worker's watch: a coordinator — a takeover while the ledger still calls the dead
    chain live — for each runnable migration whose chain's heartbeat in MongoDB expired, and
    nothing else (a migration nobody enqueued is a heal's business). With ``tenant`` (its
    ``engine``): that fleet tenant's chains."""
    engine = engine if engine is not None else installed.context.engine()
    names = [str(row["migration"]) for row in engine.runnable()]
    chains = engine.chains(names)
    dead = [name for name in names if chains.get(name) is False]
    return _send_coordinators(installed, engine, dead, chains, set(),
                              installed.settings.stall_ms, tenant=tenant)


def _send_coordinators(
    installed: MigronautCelery, engine: BackgroundEngine, names: list[str],
    chains: dict[str, bool], stalled: set[str], quiet_ms: int, *,
    requested_by: str | None = None, reason: str | None = None, tenant: Tenant | None = None,
) -> list[dict[str, Any]]:
    """For each of ``names``: nothing while its chain is live (``chains``: MongoDB's
    heartbeats), its coordinator unless the ledger calls that live, else a takeover when the
    chain is dead or the migration ``stalled``."""
    queue = installed.settings.background_queue_name
    sent: list[dict[str, Any]] = []
    for name in names:
        if chains.get(name):  # a live chain serves it: MongoDB says so
            continue
        chain = coordinator_id(queue, name, tenant)
        if not is_live(installed, chain):  # not in the ledger, finished, or unreadable
            payload = _coordinator_payload(name, requested_by=requested_by, reason=reason,
                                           tenant=tenant)
            send_queued(installed, "background", payload, chain)
            sent.append({"migration": name, "id": chain, **tenant_fields(tenant)})
            continue
        if name not in chains and name not in stalled:
            continue  # queued, not started yet: nothing says it is dead
        state = engine.state(name) or {}
        takeover = takeover_id(queue, name, stored_round(state), tenant)
        payload = _coordinator_payload(name, takeover=True, requested_by=requested_by,
                                       reason=reason, tenant=tenant)
        if send_once(installed, "background", payload, takeover):
            if name in chains:
                engine.logger.warning(
                    "⚠ %s: its coordinator chain stopped renewing its heartbeat (its worker "
                    "is gone) — a takeover coordinator is queued", name)
            else:
                engine.logger.warning(
                    "⚠ %s looks stalled (no lease, no progress for %d ms) — a takeover "
                    "coordinator is queued", name, quiet_ms)
            sent.append({"migration": name, "id": takeover, "takeover": True,
                         **tenant_fields(tenant)})
    return sent
