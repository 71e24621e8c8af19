"""Coordination and running: the coordinator's idempotent steps under the ``background:<name>``
lock, the operator's controls, the handles every part of one database's engine shares, the outage
budget, and driving one migration's lanes in this process."""
