"""``up`` on a project served by Celery: the background migrations the run registered are
handed to the background queue at once, instead of waiting for the next heal (a worker start,
the verify tick, ``background enqueue``) — or the output says plainly that they were not, and
what to run.

Only with a ``celery`` table in the config: a project without one runs its background
migrations with ``background run``/``work``, and ``up`` says nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from migronaut.errors import MigronautError

if TYPE_CHECKING:
    from migronaut.api import Migrator
    from migronaut.cli.session import Session

__all__ = ["RegisteredHandoff"]

_BY_HAND = 'run "migronaut background enqueue" once a broker and workers are reachable'


class RegisteredHandoff:
    """Listens for ``background:registered`` while the run lasts; :meth:`send` enqueues what
    was registered (also after a failed run: what it registered is committed)."""

    def __init__(self, session: Session, migrator: Migrator, *, reason: str | None,
                 requested_by: str | None) -> None:
        self.session = session
        self.migrator = migrator
        self.reason = reason
        self.requested_by = requested_by
        self.registered: list[str] = []

    def _on_registered(self, event: dict[str, Any]) -> None:
        if event.get("status") != "withdrawn":
            self.registered.append(str(event.get("migration")))

    def __enter__(self) -> RegisteredHandoff:
        self.migrator.on("background:registered", self._on_registered)
        return self

    def __exit__(self, *exc: object) -> None:
        self.migrator.off("background:registered", self._on_registered)
        self.send()

    def send(self) -> None:
        """Enqueue a coordinator for each migration registered; never raises (``up`` did its
        work): a send that fails is reported with what to run instead."""
        names = list(dict.fromkeys(self.registered))
        self.registered = []
        if not names or self.migrator.config.celery is None:
            return
        out = self.session.out
        try:
            sent = self._enqueue(names)
        except MigronautError as error:
            out.warn(f"⚠ Background migration(s) {', '.join(names)} registered but not "
                     f"enqueued on Celery ({error.code}: {error.message}) — {_BY_HAND}")
            return
        except Exception as error:  # the broker's client: a refused connection, a timeout
            out.warn(f"⚠ Background migration(s) {', '.join(names)} registered but not "
                     f"enqueued on Celery ({type(error).__name__}: {error}) — {_BY_HAND}")
            return
        queued = {str(job["migration"]) for job in sent}
        for job in sent:
            out.info(f"⇉ {job['migration']}: a coordinator queued on Celery (task {job['id']})")
        for name in names:
            if name not in queued:
                out.info(f"✔ {name}: a live coordinator chain already serves it")

    def _enqueue(self, names: list[str]) -> list[dict[str, Any]]:
        try:
            import celery  # noqa: F401
        except ImportError:
            from migronaut.errors import ConfigInvalidError

            raise ConfigInvalidError(
                "the config has a celery table but the celery extra is not installed: pip "
                "install 'migronaut[celery]'", {"extra": "celery"}) from None
        from migronaut.api import executed_by
        from migronaut.executors.celery import create_app, enqueue_background

        options = self.session.options
        requested_by = self.requested_by or executed_by()
        _, installed = create_app(config=options.config_flags(), config_path=options.config)
        sent: list[dict[str, Any]] = []
        for name in names:
            sent += enqueue_background(installed, name, requested_by=requested_by,
                                       reason=self.reason, engine=self.migrator.background)
        return sent
