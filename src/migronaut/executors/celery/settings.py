"""The Celery executor's options, from ``install(app, **options)``, the ``celery`` table of the
migronaut config and ``MIGRONAUT_CELERY_*`` variables, checked like every other config key.

Precedence: keyword arguments > environment > the config table > defaults. An unknown key or a bad
value is ``CONFIG_INVALID`` naming ``celery.<key>`` and where it came from (reference background
§6.4's option rules, BullMQ's names turned into Celery's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from migronaut._suggest import suggest
from migronaut._values import int_within
from migronaut.errors import ConfigInvalidError

__all__ = ["DEFAULT_QUEUE", "ENV", "NULLABLE", "RANGES", "CelerySettings", "resolve_settings"]

DEFAULT_QUEUE = "migronaut"
#: Environment variables read for the keys a deployment sets per machine.
ENV = {
    "broker_url": "MIGRONAUT_CELERY_BROKER_URL",
    "result_backend": "MIGRONAUT_CELERY_RESULT_BACKEND",
    "queue": "MIGRONAUT_CELERY_QUEUE",
    "background_queue": "MIGRONAUT_CELERY_BACKGROUND_QUEUE",
}


@dataclass(frozen=True)
class CelerySettings:
    """What the tasks, the producer and the ready app need to know.

    ``slice_ms`` bounds one lane task's work (a lane task ends after a slice and re-enqueues
    itself), so it must stay well under the broker's visibility timeout — ``create_app`` sets that
    timeout to ``visibility_timeout_s`` and ``resolve_settings`` refuses a slice that would not
    fit five times into it.

    ``chain_ttl_ms`` is how long a coordinator chain counts as live past its next run's
    countdown without renewing its heartbeat in MongoDB: a dead chain is taken over after about
    that long. It must exceed ``slice_ms`` (a pool busy with lane slices can hold the chain's
    next run back by one slice).
    """

    broker_url: str | None = None
    result_backend: str | None = None
    queue: str = DEFAULT_QUEUE
    background_queue: str | None = None  # None: "<queue>-background"
    slice_ms: int = 20_000
    poll_interval_ms: int = 5_000
    stall_ms: int = 900_000
    chain_ttl_ms: int = 60_000
    verify_interval_ms: int | None = 600_000
    max_lane_retries: int = 8
    sync_interval_s: int | None = None
    lock_wait_timeout_ms: int | None = None
    visibility_timeout_s: int = 3_600

    @property
    def background_queue_name(self) -> str:
        return self.background_queue or f"{self.queue}-background"


_KEYS = {f.name for f in fields(CelerySettings)}
#: (minimum, maximum) of each integer key; ``None`` allowed where the default is ``None`` or the
#: key can be switched off.
RANGES: dict[str, tuple[int, int]] = {
    "slice_ms": (1, 3_600_000),
    "poll_interval_ms": (10, 2**31 - 1),
    "stall_ms": (1_000, 2**31 - 1),
    "chain_ttl_ms": (1_000, 2**31 - 1),
    "verify_interval_ms": (1_000, 2**31 - 1),
    "max_lane_retries": (0, 100),
    "sync_interval_s": (1, 86_400 * 7),
    "lock_wait_timeout_ms": (1, 2**31 - 1),
    "visibility_timeout_s": (5, 86_400 * 7),
}
NULLABLE = {"broker_url", "result_backend", "background_queue", "verify_interval_ms",
             "sync_interval_s", "lock_wait_timeout_ms"}


def _invalid(key: str, message: str, origin: str) -> ConfigInvalidError:
    return ConfigInvalidError(f"Invalid config: celery.{key} {message} (from {origin})",
                              {"key": f"celery.{key}", "origin": origin})


def _checked(key: str, value: Any, origin: str) -> Any:
    if key not in _KEYS:
        close = suggest(key, _KEYS)
        hint = f" (did you mean '{close}'?)" if close else ""
        raise _invalid(key, f"is not a known option{hint}", origin)
    if value is None or (value is False and key in ("verify_interval_ms", "sync_interval_s")):
        if key not in NULLABLE:
            raise _invalid(key, "must be set", origin)
        return None
    if key in RANGES:
        low, high = RANGES[key]
        if not int_within(value, low, high):
            raise _invalid(key, f"must be an integer from {low} to {high}, got {value!r}", origin)
        return value
    if not isinstance(value, str) or not value.strip():
        raise _invalid(key, f"must be a non-empty string, got {value!r}", origin)
    if key in ("queue", "background_queue") and (":" in value or value != value.strip()):
        raise _invalid(key, f"must be a queue name without ':' or surrounding spaces, got "
                       f"{value!r}", origin)
    return value


def resolve_settings(
    table: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> CelerySettings:
    """Merge the config ``table``, the environment and ``options`` (highest) into settings."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    if table is not None and not isinstance(table, Mapping):
        raise _invalid("*", "the celery config must be a table/object", "config")
    for key, value in (table or {}).items():
        values[str(key)] = _checked(str(key), value, "config")
    for key, variable in ENV.items():
        if env.get(variable, "").strip():
            values[key] = _checked(key, env[variable].strip(), variable)
    for key, value in (options or {}).items():
        values[str(key)] = _checked(str(key), value, "argument")
    settings = replace(CelerySettings(), **values)
    if settings.background_queue_name == settings.queue:
        raise _invalid("background_queue", "must differ from celery.queue (migration jobs must "
                       "never wait behind background work)", "config")
    if settings.slice_ms * 5 > settings.visibility_timeout_s * 1000:
        raise _invalid("slice_ms", f"must fit five times into the broker's visibility timeout "
                       f"({settings.visibility_timeout_s} s), got {settings.slice_ms} ms",
                       "config")
    if settings.chain_ttl_ms <= settings.slice_ms:
        raise _invalid("chain_ttl_ms", f"must exceed celery.slice_ms ({settings.slice_ms} ms: a "
                       f"pool busy with lane slices can hold a coordinator's next run back that "
                       f"long), got {settings.chain_ttl_ms} ms", "config")
    return settings
