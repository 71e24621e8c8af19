"""The Celery executor's set-up: its options, job payloads, task ids and a real worker that
starts with the ready app (``celery -A migronaut.celery worker``) on the test's Redis."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from migronaut import ConfigInvalidError, QueueJobInvalidError
from migronaut.executors.celery.payloads import fragment, validate
from migronaut.executors.celery.settings import resolve_settings
from migronaut.executors.celery.signals import REDIS_BRPOP_TIMEOUT_S


def test_defaults_name_two_queues() -> None:
    settings = resolve_settings({}, {}, environ={})
    assert (settings.queue, settings.background_queue_name) == ("migronaut",
                                                                "migronaut-background")


def test_precedence_is_options_then_environment_then_config() -> None:
    environ = {"MIGRONAUT_CELERY_QUEUE": "from-env"}
    assert resolve_settings({"queue": "from-file"}, {}, environ).queue == "from-env"
    assert resolve_settings({"queue": "from-file"}, {"queue": "arg"}, environ).queue == "arg"
    assert resolve_settings({"queue": "from-file"}, {}, {}).queue == "from-file"


@pytest.mark.parametrize(("table", "options", "key", "words"), [
    ({"slice_msx": 5}, {}, "celery.slice_msx", "did you mean 'slice_ms'"),
    ({}, {"slice_ms": 0}, "celery.slice_ms", "from 1 to 3600000"),
    ({}, {"slice_ms": True}, "celery.slice_ms", "integer"),
    ({"max_lane_retries": 101}, {}, "celery.max_lane_retries", "from 0 to 100"),
    ({"queue": "a:b"}, {}, "celery.queue", "without ':'"),
    ({"queue": "q", "background_queue": "q"}, {}, "celery.background_queue", "must differ"),
    ({"slice_ms": 3_600_000}, {}, "celery.slice_ms", "visibility timeout"),
    ({"broker_url": ""}, {}, "celery.broker_url", "non-empty string"),
    ({"chain_ttl_ms": 20_000}, {}, "celery.chain_ttl_ms", "must exceed celery.slice_ms"),
    ({}, {"chain_ttl_ms": 999}, "celery.chain_ttl_ms", "from 1000 to"),
])
def test_bad_options_are_config_invalid(table: dict[str, Any], options: dict[str, Any],
                                        key: str, words: str) -> None:
    with pytest.raises(ConfigInvalidError) as caught:
        resolve_settings(table, options, {})
    assert caught.value.context["key"] == key
    assert words in caught.value.message
    assert caught.value.exit_code == 6


def test_a_bad_environment_variable_is_named() -> None:
    with pytest.raises(ConfigInvalidError) as caught:
        resolve_settings({}, {}, {"MIGRONAUT_CELERY_QUEUE": "a:b"})
    assert caught.value.context["origin"] == "MIGRONAUT_CELERY_QUEUE"


def test_payloads_are_checked_against_their_kind() -> None:
    good = {"v": 1, "kind": "background", "migration": "001_x.py", "round": 2}
    assert validate("background", good) == good
    cases = [
        ({**good, "v": 2}, "newer than this worker"),
        ({**good, "v": "1"}, "integer v"),
        ({**good, "kind": "background-lane"}, "must carry kind"),
        ({**good, "surprise": 1}, "'surprise' is not a known field"),
        ({**good, "migration": "../x.py"}, "bare migration file name"),
        ({"v": 1, "kind": "background"}, "'migration' is required"),
        ({**good, "round": 0}, "from 1 to"),
    ]
    for data, words in cases:
        with pytest.raises(QueueJobInvalidError) as caught:
            validate("background", data)
        assert words in caught.value.message, data
        assert caught.value.exit_code == 25
    with pytest.raises(QueueJobInvalidError, match="not a job kind"):
        validate("nonsense", {"v": 1, "kind": "nonsense"})


def test_fragments_are_reversible_and_collision_free() -> None:
    assert fragment("001_add-x.py") == "001_add-x.py"
    assert fragment("a b") == "a~20b"
    assert fragment("é~") == "~C3A9~7E"
    assert fragment("a~20b") != fragment("a b")


def test_the_ready_app_starts_a_worker_on_both_queues(celery_project: Any) -> None:
    worker = celery_project.worker(concurrency=1)
    app, installed = celery_project.app()
    destination = [f"{worker.name}@{socket.gethostname()}"]
    replies = app.control.ping(destination=destination, timeout=5.0)
    assert replies, worker.log()
    assert installed.settings.queue == celery_project.queue
    assert f"{celery_project.queue}" in worker.log()
    assert f"{celery_project.background_queue}" in worker.log()
    # the worker's consumer waits REDIS_BRPOP_TIMEOUT_S in each BRPOP; this process (a producer,
    # a control client) keeps kombu's default
    conf = app.control.inspect(destination=destination, timeout=5.0).conf() or {}
    worker_options = next(iter(conf.values()), {}).get("broker_transport_options") or {}
    assert worker_options.get("polling_interval") == REDIS_BRPOP_TIMEOUT_S, conf
    assert "polling_interval" not in app.conf.broker_transport_options
    assert worker.stop() == 0


class _Worker:
    def __init__(self, app: Any, use_eventloop: bool) -> None:
        self.app, self.use_eventloop = app, use_eventloop


def test_only_the_ready_apps_event_loop_worker_on_redis_polls_less(tmp_path: Any) -> None:
    """A green pool's worker (no event loop) and a control client would sleep between empty
    polls with the option set, another app's worker and a non-Redis broker keep theirs."""
    from celery import signals

    from migronaut.executors.celery import create_app

    config = {"uri": "mongodb://127.0.0.1:9/unused", "db_name": "unused"}

    def app(broker: str) -> Any:
        made, _ = create_app(config=config, cwd=tmp_path, broker_url=broker,
                             result_backend="cache+memory://")
        return made

    redis_app, green_app, other_app = (app("redis://127.0.0.1:6379/15") for _ in range(3))
    memory_app = app("memory://")
    signals.worker_init.send(sender=_Worker(redis_app, use_eventloop=True))
    signals.worker_init.send(sender=_Worker(green_app, use_eventloop=False))
    signals.worker_init.send(sender=_Worker(memory_app, use_eventloop=True))
    assert redis_app.conf.broker_transport_options["polling_interval"] == REDIS_BRPOP_TIMEOUT_S
    for unchanged in (green_app, other_app, memory_app):
        assert "polling_interval" not in unchanged.conf.broker_transport_options
    # the visibility timeout the app was built with stays
    assert redis_app.conf.broker_transport_options["visibility_timeout"] == \
        other_app.conf.broker_transport_options["visibility_timeout"]


def test_two_apps_in_one_process_each_run_their_own_installation(tmp_path: Any) -> None:
    """A web process may hold a producer's app beside another: each app's task names must
    reach its own installation (its queues, its config), never the first app's."""
    from migronaut.executors.celery import create_app

    config = {"uri": "mongodb://127.0.0.1:9/unused", "db_name": "unused"}
    first_app, first = create_app(config=config, cwd=tmp_path, queue="qa",
                                  broker_url="memory://", result_backend="cache+memory://")
    second_app, second = create_app(config=config, cwd=tmp_path, queue="qb",
                                    broker_url="memory://", result_backend="cache+memory://")
    assert first.tasks and set(first.tasks) == set(second.tasks)
    for kind in first.tasks:
        name = first.task_name(kind)
        # (app.task returns a proxy: compare the functions the names reach)
        assert _body(first_app.tasks[name]) is _body(first.tasks[kind]), kind
        assert _body(second_app.tasks[name]) is _body(second.tasks[kind]), kind
        assert _body(first.tasks[kind]) is not _body(second.tasks[kind]), kind


def _body(task: Any) -> Any:
    return getattr(task.run, "__func__", task.run)
