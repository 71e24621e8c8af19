"""Queue executors: run migrations and background-migration lanes as jobs on a queue.

They sit above the public API (:class:`~migronaut.api.Migrator` and its
:class:`~migronaut.background.engine.BackgroundEngine`) like any user code: MongoDB keeps every
guarantee (the migration lock, leases, fenced checkpoints), the queue only carries work, so a lost
queue loses nothing a heal cannot bring back (reference background §6.4).
"""
