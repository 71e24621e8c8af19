"""Real Celery workers for the queue tests: a Redis database of this test run's own, RabbitMQ,
and worker processes started, killed (``kill -9``) and stopped like in production.

Redis and RabbitMQ are services on every development and CI machine. Where one is not running
the tests skip with a message naming what to start — or fail under
``MIGRONAUT_TEST_REQUIRE_TOOLS`` (CI), so CI never passes by skipping them.

Isolation: each pytest process takes a Redis database number of its own (a ``SET NX`` claim in
database 0, released at the end) and each test uses queue names of its own, so concurrent test
runs on one machine never see each other's jobs. A test may ``FLUSHDB`` its database (the queue
lost) without touching anyone else's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.tools import tool_unavailable

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
RABBIT_HOST, RABBIT_PORT = "127.0.0.1", 5672
RABBIT_URL = f"amqp://guest:guest@{RABBIT_HOST}:{RABBIT_PORT}//"
_CLAIM = "migronaut-test:redis-db:{}"


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require_redis() -> None:
    if not _reachable(REDIS_HOST, REDIS_PORT):
        tool_unavailable(f"needs Redis on {REDIS_HOST}:{REDIS_PORT}: start redis-server")


def require_rabbitmq() -> None:
    if not _reachable(RABBIT_HOST, RABBIT_PORT):
        tool_unavailable(f"needs RabbitMQ on {RABBIT_HOST}:{RABBIT_PORT} (guest/guest): start "
                         "rabbitmq-server")


def redis_client(db: int = 0) -> Any:
    import redis

    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)


@contextmanager
def claimed_redis_db() -> Iterator[int]:
    """A Redis database number (1–15) no other test run on this machine uses meanwhile."""
    require_redis()
    claims = redis_client(0)
    token = f"{os.getpid()}-{uuid.uuid4().hex}"
    for number in range(1, 16):
        if claims.set(_CLAIM.format(number), token, nx=True, ex=6 * 3600):
            break
    else:
        raise RuntimeError("every Redis database 1-15 is claimed by another test run")
    redis_client(number).flushdb()
    try:
        yield number
    finally:
        redis_client(number).flushdb()
        if claims.get(_CLAIM.format(number)) == token.encode():
            claims.delete(_CLAIM.format(number))


def queue_names() -> tuple[str, str]:
    """A migration queue and a background queue for one test."""
    queue = f"mq-{uuid.uuid4().hex[:10]}"
    return queue, f"{queue}-background"


@dataclass
class CeleryWorker:
    """One ``celery worker`` process in ``cwd`` (a project whose config names the queues)."""

    cwd: Path
    env: dict[str, str]
    queues: tuple[str, ...]
    app: str = "migronaut.celery"
    concurrency: int = 2
    pool: str = "threads"
    name: str = field(default_factory=lambda: f"w{uuid.uuid4().hex[:6]}")
    beat: bool = False
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self, *, timeout: float = 60.0) -> CeleryWorker:
        self.log_path = self.cwd / f"worker-{self.name}.log"
        args = [
            sys.executable, "-m", "celery", "-A", self.app, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-Q", ",".join(self.queues),
            "-n", f"{self.name}@%h", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-l", "INFO", *self.extra_args,
        ]
        if self.beat:
            args += ["-B", "-s", str(self.cwd / f"beat-{self.name}")]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, cwd=self.cwd, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with "
                                     f"{self.process.returncode}:\n{self.log()}")
            if " ready." in self.log():
                return self
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"worker {self.name} not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """``kill -9`` the worker and its pool processes (the whole process group)."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def stop(self, *, timeout: float = 90.0) -> int:
        """A warm shutdown (SIGTERM), waited for; the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"worker {self.name} did not stop in {timeout} s:\n"
                                     f"{self.log()}") from None
        return int(self.process.returncode)


@contextmanager
def workers(*started: CeleryWorker) -> Iterator[tuple[CeleryWorker, ...]]:
    """Kill every worker on the way out, whatever the test did; show their logs on failure."""
    try:
        yield started
    except BaseException:
        for worker in started:
            sys.stderr.write(f"--- log of worker {worker.name} ---\n{worker.log()[-8000:]}\n")
        raise
    finally:
        for worker in started:
            worker.kill()


@dataclass
class CeleryProject:
    """A test project served through Celery: its broker (a Redis database of this run's own, or
    RabbitMQ), queue names of its own, and workers started in the project directory with the
    ready app (``celery -A migronaut.celery``) reading the project's config."""

    path: Path
    base_env: dict[str, str]
    broker_url: str
    result_backend: str
    queue: str
    background_queue: str
    started: list[CeleryWorker] = field(default_factory=list)

    def env_variables(self) -> dict[str, str]:
        """The ``MIGRONAUT_CELERY_*`` variables that point a worker or producer at this test's
        broker and queues."""
        return {"MIGRONAUT_CELERY_BROKER_URL": self.broker_url,
                "MIGRONAUT_CELERY_RESULT_BACKEND": self.result_backend,
                "MIGRONAUT_CELERY_QUEUE": self.queue,
                "MIGRONAUT_CELERY_BACKGROUND_QUEUE": self.background_queue}

    def env(self, **extra: str) -> dict[str, str]:
        """A worker's environment: the project's, this test's broker and queues, ``extra``.

        A relative ``PYTHONPATH`` (``PYTHONPATH=src pytest``) is made absolute: workers start
        in the project directory, where it would point nowhere and they would import another
        checkout's migronaut."""
        env = {**self.base_env, **self.env_variables(), **extra}
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.pathsep.join(
                str(Path(entry).resolve()) if entry else entry
                for entry in env["PYTHONPATH"].split(os.pathsep))
        return env

    def worker(self, *, queues: tuple[str, ...] | None = None, start: bool = True,
               **options: Any) -> CeleryWorker:
        """A worker on both queues (or ``queues``), started unless ``start=False``; killed at
        the end of the test whatever happens."""
        worker = CeleryWorker(self.path, self.env(), queues or (self.queue,
                                                                self.background_queue),
                              **options)
        self.started.append(worker)
        return worker.start() if start else worker

    def app(self, **options: Any) -> Any:
        """An in-process producer: ``(app, installed)`` from ``create_app`` on this project."""
        from migronaut.executors.celery import create_app

        return create_app(cwd=self.path, **options)

    def kill_all(self) -> None:
        for worker in self.started:
            worker.kill()
