"""The web dashboard (extra ``dashboard``): migrations, the lock, runs, audit, drift and
background migrations in a browser, over the public API — it keeps no state of its own, so it is
right after any restart and on any replica.

``create_app()`` returns a Starlette (ASGI) application; ``migronaut dashboard`` serves it with
uvicorn, and it mounts in an application of your own::

    from migronaut.dashboard import create_app

    app.mount("/migrations", create_app(config={"uri": ..., "db_name": ...}))
"""

from __future__ import annotations

from migronaut.dashboard.app import create_app

__all__ = ["create_app"]
