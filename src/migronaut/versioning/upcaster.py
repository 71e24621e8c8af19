"""The upcaster: old document shapes upgraded in memory, step by step (reference §3.4.4).

Invariant: it never writes, and there are no on-read hooks — a read never turns into a write.
Every version from ``min`` to ``current − 1`` has a step (checked when it is built, not when an
old document first shows up); a step's result is a fresh document, the caller's is untouched.
The same steps rewrite stored documents eagerly: :meth:`Upcaster.step` is a background
migration's ``migrate``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Literal

from migronaut._values import is_int
from migronaut.declared.versioning import VersioningSpec
from migronaut.errors import ShapeVersionError
from migronaut.versioning.fields import version_of
from migronaut.versioning.updates import refuse

__all__ = ["Step", "Upcaster"]

Step = Callable[[dict[str, Any]], Any]
Newer = Literal["throw", "keep"]


def _source_version(key: Any) -> int | None:
    """A step key as a version: an int, or a canonical decimal string (``"1"``, not ``"01"``)."""
    if is_int(key):
        return key if key >= 0 else None
    if isinstance(key, str) and key.isdigit() and key.isascii() and str(int(key)) == key:
        return int(key)
    return None


def _copy(value: Any) -> Any:
    """A deep copy of the document's own structure (dicts, lists); other values are shared —
    BSON values and datetimes are immutable."""
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


class Upcaster:
    """Upgrades documents of one versioned collection to ``current`` in memory."""

    def __init__(
        self, spec: VersioningSpec, steps: Mapping[Any, Step], *, newer: Newer = "throw",
        collection: str | None = None,
    ) -> None:
        if newer not in ("throw", "keep"):
            raise refuse(f"newer must be 'throw' or 'keep' (got {newer!r})", "newer")
        if not isinstance(steps, Mapping):
            raise refuse("steps must be a mapping {source version: function}", "steps")
        resolved: dict[int, Step] = {}
        for key, step in steps.items():
            source = _source_version(key)
            if source is None:
                raise refuse(f"Step key {key!r} is not a version (a non-negative integer or "
                             "its decimal string)", f"steps.{key}")
            if source >= spec.current:
                raise refuse(f"Step {source} → {source + 1} goes past current "
                             f"({spec.current})", f"steps.{key}")
            if not callable(step):
                raise refuse(f"Step {source} is not a function", f"steps.{key}")
            if inspect.iscoroutinefunction(step):
                raise refuse(f"Step {source} is async: steps must be synchronous",
                             f"steps.{key}")
            resolved[source] = step
        missing = [v for v in range(spec.min, spec.current) if v not in resolved]
        if missing:
            raise refuse("Missing step(s) for supported version(s) "
                         + ", ".join(map(str, missing))
                         + f" (every version from min {spec.min} to current − 1 needs one)",
                         "steps")
        self._spec = spec
        self._steps = resolved
        self._newer = newer
        self._collection = collection
        #: The contract's numbers, for callers: the version upcast documents end at, the
        #: oldest still allowed, and the version field.
        self.current, self.min, self.field = spec.current, spec.min, spec.field

    def _version(self, doc: Any) -> int:
        return version_of(doc, self._spec.field, self._spec.current, self._collection)

    def _error(self, reason: str, version: int, message: str) -> ShapeVersionError:
        context: dict[str, Any] = {"reason": reason, "version": version,
                                   "current": self._spec.current}
        if self._collection is not None:
            context["collection"] = self._collection
        return ShapeVersionError(message, context)

    def needs_upcast(self, doc: Any) -> bool:
        """Whether ``doc`` is older than ``current`` (an invalid version raises)."""
        return self._version(doc) < self._spec.current

    def upcast(self, doc: Any) -> Any:
        """``doc`` at ``current``: the same object when already current, a new one when
        upgraded; a newer document raises ``newer`` (or comes back as is with
        ``newer='keep'``)."""
        version = self._version(doc)
        if version == self._spec.current:
            return doc
        if version > self._spec.current:
            if self._newer == "keep":
                return doc
            raise self._error("newer", version, f"Document shape version {version} is newer "
                              f"than this release knows ({self._spec.current})")
        return self._run(_copy(doc), version, self._spec.current)

    def _run(self, doc: dict[str, Any], start: int, to: int) -> dict[str, Any]:
        for source in range(start, to):
            step = self._steps.get(source)
            if step is None:
                raise self._error("below-min", start, f"Document shape version {start} is "
                                  f"older than the oldest this release upgrades "
                                  f"({min(self._steps, default=self._spec.min)})")
            result = step(doc)
            if inspect.isawaitable(result) or not isinstance(result, dict):
                if inspect.iscoroutine(result):
                    result.close()
                raise self._error("invalid", source, f"Step {source} returned "
                                  f"{type(result).__name__}, not a document")
            result[self._spec.field] = source + 1
            doc = result
        return doc

    def step(self, source: int, to: int | None = None) -> Callable[..., dict[str, Any]]:
        """A function upgrading a document from ``source`` to ``to`` (default ``source + 1``),
        fit to be a background migration's ``migrate(doc, ctx)``."""
        target = source + 1 if to is None else to
        if not is_int(source) or source < 0 \
                or not isinstance(target, int) or not source < target <= self._spec.current:
            raise refuse(f"step({source!r}, {to!r}) is not a forward range within current "
                         f"({self._spec.current})", "step")
        missing = [v for v in range(source, target) if v not in self._steps]
        if missing:
            raise refuse(f"No step for version(s) {', '.join(map(str, missing))}", "step")

        def migrate(doc: dict[str, Any], ctx: Any = None) -> dict[str, Any]:
            return self._run(_copy(doc), source, target)

        migrate.__name__ = migrate.__qualname__ = f"upcast_{source}_to_{target}"
        return migrate
