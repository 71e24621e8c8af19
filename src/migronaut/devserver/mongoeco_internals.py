"""Every reach of the dev server into mongoeco's private surface, in one module.

mongoeco's public API serves the wire protocol (``mongoeco.wire``), stores data
(``mongoeco.engines``) and raises ``mongoeco.errors``; the layer in front of it
(:mod:`migronaut.devserver.wire`) needs more than that:

* :class:`CommandHooks` — the server's command executor (``server._executor``): its two steps
  ``_build_request_context`` and ``execute_prepared``, which the layer replaces and calls; its
  command list (``_surface.supports_command``); its engine (``_client._engine``); and mongoeco's
  request context (``WireRequestContext``: its fields read, a served command swapped in with
  ``dataclasses.replace``);
* :func:`set_collection_options` — a collection's stored options, which mongoeco has no command
  to change (the memory engine's option store and lock, the SQLite engine's connection, lock
  and worker, ``mongoeco.core.json_compat``);
* :func:`apply_pipeline` — mongoeco's aggregation pipeline over documents in memory
  (``mongoeco.core.aggregation.stages``).

Invariants:

* No other module of migronaut names a private mongoeco attribute or module; mongoeco's private
  modules are imported here lazily, when first used.
* :data:`SUPPORTED` names the mongoeco release lines this module was written against;
  :func:`check_version` refuses any other before a server starts (unless
  ``MIGRONAUT_DEVSERVER_ANY_MONGOECO=1``), and a hooked attribute that is not where it is
  expected is a :class:`~migronaut.errors.ConfigInvalidError` when the server is built, never an
  ``AttributeError`` in the middle of a command. ``tests/test_devserver_internals.py`` checks
  each name on the installed mongoeco.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from migronaut.devserver.catalog import Refused
from migronaut.errors import ConfigInvalidError

__all__ = [
    "ANY_VERSION_ENV_VAR",
    "SUPPORTED",
    "CommandHooks",
    "Request",
    "apply_pipeline",
    "check_version",
    "installed_version",
    "set_collection_options",
]

#: The mongoeco release lines (``major.minor``) this module was written against and tested with.
SUPPORTED: Final = ("4.11",)
#: Set to ``1`` to serve with a mongoeco outside :data:`SUPPORTED` (at your own risk).
ANY_VERSION_ENV_VAR: Final = "MIGRONAUT_DEVSERVER_ANY_MONGOECO"

#: mongoeco's execution of a prepared request context (``execute_prepared``).
Execute = Callable[[Any], Awaitable[Any]]
#: mongoeco's build of a request context from a command body (``_build_request_context``).
Prepare = Callable[..., Any]


def installed_version() -> str:
    """The installed mongoeco's version (``"unknown"`` when its metadata cannot be read)."""
    try:
        return importlib.metadata.version("mongoeco")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def check_version() -> None:
    """Refuse a mongoeco whose ``major.minor`` is not in :data:`SUPPORTED`: its internals may
    have moved. ``MIGRONAUT_DEVSERVER_ANY_MONGOECO=1`` skips the check."""
    if os.environ.get(ANY_VERSION_ENV_VAR, "").strip() == "1":
        return
    version = installed_version()
    if ".".join(version.split(".")[:2]) in SUPPORTED:
        return
    supported = ", ".join(f"{line}.x" for line in SUPPORTED)
    raise ConfigInvalidError(
        f"the dev server supports mongoeco {supported}, not the installed {version} "
        f"(pip install 'migronaut[embedded]' installs a supported one; "
        f"{ANY_VERSION_ENV_VAR}=1 serves with it anyway)",
        {"mongoeco": version, "supported": supported},
    )


@dataclasses.dataclass(frozen=True)
class Request:
    """What the layer reads of a request context mongoeco prepared.

    ``command`` is the very dict mongoeco runs: the layer's changes to it are what runs.
    """

    name: Any
    command: dict[str, Any]
    db: str
    connection: Any
    starts_transaction: bool


class CommandHooks:
    """mongoeco's wire command executor, as the layer hooks it (before the server starts).

    Raises :class:`~migronaut.errors.ConfigInvalidError` when the executor or either step the
    layer replaces is not where mongoeco 4.11 keeps it.
    """

    def __init__(self, server: Any) -> None:
        executor: Any = getattr(server, "_executor", None)
        original: Execute | None = getattr(executor, "execute_prepared", None)
        prepare: Prepare | None = getattr(executor, "_build_request_context", None)
        if executor is None or original is None or prepare is None:
            raise ConfigInvalidError("the dev server does not support this mongoeco version "
                                     "(its command executor moved)")
        self._executor = executor
        self._surface: Any = getattr(executor, "_surface", None)
        #: mongoeco's own execution of a request context: the command as mongoeco runs it.
        self.original_execute: Execute = original
        #: mongoeco's own build of a request context: ``prepare(body, connection=..., ...)``.
        self.prepare: Prepare = prepare
        #: The storage engine (memory or SQLite) behind the server; ``None`` when not found.
        self.engine: Any = getattr(getattr(executor, "_client", None), "_engine", None)

    def supports_command(self, name: str) -> bool:
        """Whether mongoeco serves command ``name`` (``True`` when it cannot say)."""
        return self._surface is None or bool(self._surface.supports_command(name))

    def install(self, build_request_context: Prepare, execute_prepared: Execute) -> None:
        """Put the layer's two steps in place of mongoeco's (which stay reachable as
        :attr:`prepare` and :attr:`original_execute`)."""
        self._executor._build_request_context = build_request_context
        self._executor.execute_prepared = execute_prepared

    def served_context(self, carrier: dict[str, Any], name: str | None, command: dict[str, Any],
                       **options: Any) -> Any:
        """A context for a command the layer serves itself (mongoeco would refuse it): built
        for a ``ping`` that carries the body's session and transaction fields (``carrier``),
        then naming ``name`` with ``command``."""
        context = self.prepare({"ping": 1, **carrier}, **options)
        return dataclasses.replace(context, command_name=name, command_document=command)

    @staticmethod
    def request(context: Any) -> Request | None:
        """What the layer reads of ``context``; ``None`` when it carries no command document
        (mongoeco runs it untouched)."""
        command = getattr(context, "command_document", None)
        if not isinstance(command, dict):
            return None
        raw_body = getattr(context, "raw_body", None) or {}
        return Request(name=getattr(context, "command_name", None), command=command,
                       db=context.db_name, connection=getattr(context, "connection", None),
                       starts_transaction=bool(raw_body.get("startTransaction")))


async def set_collection_options(
    engine: Any, db: str, coll: str, options: dict[str, Any]
) -> None:
    """Replace a collection's stored options in mongoeco's memory or SQLite engine (it has no
    public way to); its validation reads them on every write."""
    store = getattr(engine, "_collection_options", None)
    if isinstance(store, dict):
        async with engine._get_lock(db, coll):
            store.setdefault(db, {})[coll] = dict(options)
        return
    if hasattr(engine, "_run_blocking") and hasattr(engine, "_require_connection"):
        from mongoeco.core.json_compat import json_dumps_compact

        encoded = json_dumps_compact(options, sort_keys=True)

        def write() -> None:
            with engine._lock:
                connection = engine._require_connection(None)
                connection.execute(
                    "UPDATE collections SET options_json = ? WHERE db_name = ? AND coll_name = ?",
                    (encoded, db, coll))
                connection.commit()

        await engine._run_blocking(write)
        return
    raise Refused(115, "CommandNotSupported",
                  "collMod: this mongoeco engine cannot change collection options")


def apply_pipeline(documents: Iterable[dict[str, Any]],
                   pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run aggregation ``pipeline`` over ``documents`` in memory, as mongoeco runs stages."""
    from mongoeco.core.aggregation.stages import apply_pipeline as run_stages

    return list(run_stages(documents, pipeline))
