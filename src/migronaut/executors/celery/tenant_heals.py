"""Heals that reach fleet tenants: a worker's start-up heal, its verify tick and its chain watch
look at every tenant a fleet run handed background work to, not only the worker's own database.

A fleet tenant task that enqueues its tenant's background migrations also records the tenant in a
small registry beside the fleet run records (``<runs_collection>_background`` in the fleet's
``admin_db``): one document per tenant, ``{_id: {cluster, tenant}, cluster, tenant, mark, at}``.
A heal reads the registry (one query) and heals each listed tenant through its own engine, as
the tenant task did: coordinators for what is runnable, a takeover for a dead chain. So a tenant
chain whose worker was killed is taken over by any surviving worker, without another ``fleet
enqueue up``. An entry leaves once its tenant has nothing runnable; the delete matches the
``mark`` it read, so a tenant handed new work meanwhile (a new ``mark``) stays listed.

Fail closed: an entry this module did not write (its fields of the wrong type) is skipped with a
warning naming it, never guessed at; a tenant the fleet no longer lists is dropped (a task never
touches a database outside the fleet). Nothing here raises: the next heal tries again.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from migronaut.errors import QueueJobInvalidError
from migronaut.executors.celery.failures import outbound_error
from migronaut.fleet.tenants import Tenant

if TYPE_CHECKING:
    from pymongo.collection import Collection

    from migronaut.executors.celery.context import FleetWorker
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["heal_tenants", "registry", "remember_tenant"]

logger = logging.getLogger("migronaut")

#: How many listed tenants one heal looks at (the oldest first); the rest wait for the next.
HEAL_LIMIT = 1000


def registry(worker: FleetWorker) -> Collection[dict[str, Any]]:
    """The registry of tenants with background work, beside the fleet run records."""
    fleet = worker.fleet()
    runs = fleet.run_store().collection
    return runs.database[f"{fleet.fleet_config.runs_collection}_background"]


def _key(tenant: Tenant) -> dict[str, str]:
    return {"cluster": tenant.cluster, "tenant": tenant.name}


def remember_tenant(worker: FleetWorker, tenant: Tenant) -> None:
    """List ``tenant`` as having background work (a new ``mark``: a heal that read the old one
    does not drop it)."""
    registry(worker).update_one(
        {"_id": _key(tenant)},
        {"$set": {"cluster": tenant.cluster, "tenant": tenant.name, "mark": uuid.uuid4().hex},
         "$currentDate": {"at": True}},
        upsert=True)


def heal_tenants(installed: MigronautCelery, *, dead_only: bool = False) -> list[dict[str, Any]]:
    """Heal every listed tenant (``dead_only``: only take over dead chains, as the chain watch
    does); what was sent. Nothing when the worker's config declares no ``[fleet]``."""
    from migronaut.executors.celery.background_producer import (
        enqueue_background,
        take_over_dead_chains,
    )

    worker = installed.context.fleet()
    if not worker.has_fleet():
        return []
    try:
        listed = registry(worker)
        entries = list(listed.find({}, sort=[("at", 1)], limit=HEAL_LIMIT))
    except Exception as error:
        logger.warning("⚠ the fleet's background registry cannot be read (%s) — tenant chains "
                       "are healed at the next look", outbound_error(error).message)
        return []
    sent: list[dict[str, Any]] = []
    for entry in entries:
        cluster, name, mark = entry.get("cluster"), entry.get("tenant"), entry.get("mark")
        if not (isinstance(cluster, str) and isinstance(name, str) and isinstance(mark, str)):
            logger.warning("⚠ the fleet's background registry holds an entry it did not write "
                           "(_id %r) — skipped", entry.get("_id"))
            continue
        tenant = Tenant(name, cluster)
        try:
            with worker.engine(cluster, name) as engine:
                if dead_only:
                    sent += take_over_dead_chains(installed, engine, tenant=tenant)
                else:
                    sent += enqueue_background(installed, engine=engine, tenant=tenant)
                done = not engine.runnable()
        except QueueJobInvalidError as error:
            logger.warning("⚠ %s — dropped from the fleet's background registry", error.message)
            done = True
        except Exception as error:
            logger.warning("⚠ tenant %s: its background heal failed (%s) — the next heal "
                           "retries", name, outbound_error(error).message)
            continue
        if done:
            try:
                listed.delete_one({"_id": entry["_id"], "mark": mark})
            except Exception as error:
                logger.debug("tenant %s: its registry entry stays (%s)", name,
                             outbound_error(error).message)
    return sent
