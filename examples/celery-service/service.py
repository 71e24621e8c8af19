"""A tiny shop service (stdlib ``http.server``) that applies its migrations through Celery at
deploy time, then serves.

    python service.py --port 8000 [--deploy-timeout 120]

At start ("deploy") it enqueues ``up`` on the migration queue — one job per pending migration —
and waits for the workers to apply them; a failed migration stops the deploy with its code and
message. Then it serves ``GET /health`` (the migration status) and ``GET /products``.
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from migronaut import Migrator, MigronautError
from migronaut.celery import create_app, enqueue_up

HERE = Path(__file__).resolve().parent


def deploy(timeout: float) -> None:
    """Enqueue ``up`` and wait for the workers: the service starts on the schema it expects."""
    _, installed = create_app(cwd=HERE)
    handle = enqueue_up(installed, requested_by="celery-service", reason="deploy")
    if handle.waiting:
        print(f"deploy: {handle.waiting['migration']} waits for background migrations",
              flush=True)
    results = handle.wait(timeout)
    applied = [row["file"] for result in results for row in result.get("results", [])
               if row["status"] == "applied"]
    print(f"deploy: applied {len(applied)} migration(s) through the queue "
          f"{installed.settings.queue!r}: {', '.join(applied) or 'none'}", flush=True)


class Handler(BaseHTTPRequestHandler):
    migrator: Migrator

    def do_GET(self) -> None:
        if self.path == "/health":
            rows = self.migrator.status()
            body: Any = {"pending": [r.file for r in rows if r.status != "applied"],
                         "applied": [r.file for r in rows if r.status == "applied"]}
            status = 200 if not body["pending"] else 503
        elif self.path == "/products":
            body = list(self.migrator.db.products.find({}, {"_id": 0}).sort("sku", 1))
            status = 200
        else:
            body, status = {"error": "not found"}, 404
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--deploy-timeout", type=float, default=120.0)
    options = parser.parse_args()
    try:
        deploy(options.deploy_timeout)
    except MigronautError as error:
        print(f"deploy failed: {error.code}: {error.message}", file=sys.stderr, flush=True)
        return error.exit_code
    with Migrator(cwd=HERE) as migrator:
        Handler.migrator = migrator
        server = ThreadingHTTPServer(("127.0.0.1", options.port), Handler)
        print(f"serving on http://127.0.0.1:{server.server_address[1]}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
