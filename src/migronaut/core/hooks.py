"""Lifecycle hooks (``before_all``, ``after_all``, ``before_each``, ``after_each``, ``on_error``).

Hooks run inside the flow and can fail it: a raising hook (``sys.exit()`` included) becomes
``HOOK_FAILED``, except ``on_error`` (logged, never masks the original error) and ``after_all``
after a failed run (warned). Hooks come from ``migronaut_config.py`` as a :class:`Hooks` object
or a mapping.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from migronaut.core._calls import call_user, escaped
from migronaut.errors import ConfigInvalidError, HookFailedError, MigronautError, describe_exception

__all__ = ["HOOK_NAMES", "Hooks", "call_hook", "normalise_hooks"]

HookFn = Callable[..., Any]


@dataclass(frozen=True)
class Hooks:
    """Lifecycle hooks; each may be a plain function or ``async def``.

    ``before_all(ctx)``, ``after_all(ctx, summary)``, ``before_each(name, ctx, info)``,
    ``after_each(name, duration_ms, ctx, info)``, ``on_error(name, error, ctx)``; ``summary`` is
    ``{"success", "applied", "direction"}`` and ``info`` is ``{"direction", "index", "total"}``.
    """

    before_all: HookFn | None = None
    after_all: HookFn | None = None
    before_each: HookFn | None = None
    after_each: HookFn | None = None
    on_error: HookFn | None = None


HOOK_NAMES = tuple(f.name for f in fields(Hooks))


def normalise_hooks(value: Any) -> Hooks:
    if value is None:
        return Hooks()
    if isinstance(value, Hooks):
        return value
    if isinstance(value, Mapping):
        source: Mapping[str, Any] = value
    else:
        source = {name: getattr(value, name, None) for name in HOOK_NAMES}
    unknown = [k for k in source if k not in HOOK_NAMES]
    bad = [k for k in HOOK_NAMES if source.get(k) is not None and not callable(source.get(k))]
    if unknown or bad:
        path = f"hooks.{(unknown or bad)[0]}"
        problem = "unknown hook" if unknown else "must be a function"
        raise ConfigInvalidError(
            f"Invalid configuration: {path}: {problem} (hooks are {', '.join(HOOK_NAMES)})",
            {"issues": [{"path": path, "message": problem}]},
        )
    return Hooks(**{k: source.get(k) for k in HOOK_NAMES})


def call_hook(hooks: Hooks, name: str, *args: Any) -> None:
    """Run one hook; a failure becomes ``HOOK_FAILED`` naming the hook."""
    fn = getattr(hooks, name)
    if fn is None:
        return
    try:
        call_user(fn, *args)
    except MigronautError:
        raise
    except BaseException as error:
        if not isinstance(error, Exception) and not escaped(error):
            raise  # a real Ctrl-C under Python's own SIGINT handler
        raise HookFailedError(
            f"The {name} hook failed: {describe_exception(error)}",
            {"hook": name},
            cause=error,
        ) from error
