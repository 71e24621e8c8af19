"""``examples/celery-service``: the script that starts a worker with beat and the web service,
which enqueues ``up`` at deploy — run end to end against the test's database and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import migronaut
from helpers.celery_worker import queue_names
from migronaut import Migrator

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "celery-service"


def test_the_celery_service_example_deploys_through_the_queue(
    project: Any, redis_db: int, tmp_path: Path
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    queue, background = queue_names()
    redis = f"redis://127.0.0.1:6379/{redis_db}"
    src = str(Path(migronaut.__file__).resolve().parents[1])  # this checkout's package
    env = {**project.env(), "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
           "MIGRONAUT_CELERY_BROKER_URL": redis, "MIGRONAUT_CELERY_RESULT_BACKEND": redis,
           "MIGRONAUT_CELERY_QUEUE": queue, "MIGRONAUT_CELERY_BACKGROUND_QUEUE": background,
           "TMPDIR": str(scratch)}
    done = subprocess.run(["bash", str(EXAMPLE / "run.sh")], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deploy: applied 2 migration(s) through the queue" in done.stdout
    assert '/health 200 {"pending": [], "applied": ["20260101090000_create_products.py", ' \
           '"20260101090100_seed_products.py"]}' in done.stdout
    assert '"sku": "CAP-1"' in done.stdout
    with Migrator(cwd=EXAMPLE) as migrator:
        rows = migrator.status()
        assert [r.status for r in rows] == ["applied", "applied"]
        assert {r.requested_by for r in rows} == {"celery-service"}
    assert list(scratch.iterdir()) == []  # the script cleaned up after itself
