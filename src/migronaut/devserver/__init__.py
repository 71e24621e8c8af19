"""The embedded development endpoint: a local MongoDB-compatible server from ``mongoeco``.

This package owns the dev server: serving mongoeco's wire protocol with a layer in front that
answers the way ``mongod`` 7.0 does where migronaut, its tests and the official clients depend on
it, and running that server as a child process for tests, the demo and tooling. It is a
development convenience, never a production store (``docs/dev-server.md`` lists its limits).

Its modules, one job each:

* :mod:`~migronaut.devserver.serve` — :func:`serve` one server until SIGINT/SIGTERM, its URI,
  and :func:`main`, the ``python -m migronaut.devserver`` command line;
* :mod:`~migronaut.devserver.process` — :func:`start_subprocess` and :class:`DevServerProcess`:
  the server as a child process, its URI learnt from its first stdout line;
* :mod:`~migronaut.devserver.wire` — the layer in front of mongoeco's command executor;
* :mod:`~migronaut.devserver.mongod_rules` — what ``mongod`` refuses that mongoeco accepts, with
  ``mongod``'s codes (the test suite's wire audit applies the same rules);
* :mod:`~migronaut.devserver.catalog` — ``listIndexes``/``listCollections``/``createIndexes`` as
  ``mongod`` lists and keeps them, and the layer's refusals;
* :mod:`~migronaut.devserver.collmod` — ``collMod``, which mongoeco lacks;
* :mod:`~migronaut.devserver.search` — ``--search``: Atlas's search-index commands;
* :mod:`~migronaut.devserver.search_definition` — which search-index definitions Atlas fails to
  build;
* :mod:`~migronaut.devserver.failpoints` — ``--enable-test-commands``: ``failCommand``;
* :mod:`~migronaut.devserver.seed` — ``--seed DB.COLLECTION:N``: collections filled with small
  orders before the URI is printed;
* :mod:`~migronaut.devserver.mongoeco_internals` — the one module that reaches into mongoeco's
  private surface: the command executor's hooks, the indexed memory engine (``_id`` lookups,
  duplicate checks, ranges and counts that cost the same at any size), and the check of the
  mongoeco release line it was written against;
* :mod:`~migronaut.devserver.id_order` — ``_id`` values in mongod's order and equality, and the
  copy-on-write ordered index the indexed engine keeps beside each collection.

The names below are the package's surface; the submodules are internal and may change.

Invariant: importing ``migronaut.devserver`` imports neither mongoeco nor pymongo; :func:`serve`
imports them when it starts a server, in the process that serves.
"""

from __future__ import annotations

from migronaut.devserver.process import (
    PYTHON_ENV_VAR,
    DevServerProcess,
    default_python,
    start_subprocess,
)
from migronaut.devserver.seed import Seed, parse_seeds
from migronaut.devserver.serve import (
    DEFAULT_SEARCH_DELAY,
    build_uri,
    check_search_delay,
    main,
    parse_auth,
    serve,
)

__all__ = [
    "DEFAULT_SEARCH_DELAY",
    "PYTHON_ENV_VAR",
    "DevServerProcess",
    "Seed",
    "build_uri",
    "check_search_delay",
    "default_python",
    "main",
    "parse_auth",
    "parse_seeds",
    "serve",
    "start_subprocess",
]
