"""The commands: one plain function per verb, over a :class:`~migronaut.core.workspace.Workspace`.

Alembic's ``command.py`` for migronaut: :class:`~migronaut.api.Migrator` is a façade whose methods
hand their work to these functions, and the CLI (:mod:`migronaut.cli.commands`) calls the façade —
so API and CLI cannot drift.

- ``migrate``: ``up``, ``down``, ``redo`` (locked runs) and ``dry-run`` (their preview)
- ``adopt``: ``import``, ``baseline``
- ``status``: ``status`` (and ``list``)
- ``lock``: the lock's status, ``unlock``
- ``logs``: recorded runs and their log lines
- ``audit``: the read-only health checks
- ``create``: a new migration file
- ``startup``: ``run_migrations``, applying at start-up and waiting for a peer's lock
- ``background``: the background engine, wired into ``up``/``down``

This layer sits above :mod:`migronaut.core`, :mod:`migronaut.background` and
:mod:`migronaut.observability` and below :mod:`migronaut.api`; nothing below imports it
(``tests/test_architecture.py``).
"""
