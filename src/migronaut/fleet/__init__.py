"""Fleets: one command over many tenant databases, each with its own changelog, lock and
background state, on one or several clusters.

- ``config``: the ``[fleet]`` table parsed into a :class:`~migronaut.fleet.config.FleetConfig`
- ``tenants``: who the tenants are (a list, a pattern over ``listDatabases``, a registry
  collection, a callable), validated before anything runs
- ``clients``: one client per cluster, shared by every tenant on it
- ``status``: each tenant's state, read through the ordinary ``status`` command
- ``schedule``: ordering, canary stage, failure budget, per-cluster caps (pure, reusable by a
  queue coordinator)
- ``runs``: the fleet run record in the admin database
- ``api``: :class:`~migronaut.fleet.api.Fleet` and :class:`~migronaut.fleet.api.AsyncFleet`

This package sits beside :mod:`migronaut.api`: it drives one ordinary
:class:`~migronaut.api.Migrator` per tenant, so ``migronaut --db TENANT up`` and a fleet run see
the same truth.
"""
