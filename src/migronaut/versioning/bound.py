"""The guarded writers bound to one collection's field names (``shapes.occ(name)``).

Invariant: a bound writer always uses the declared ``field``/``revision_field``; passing other
names is refused rather than silently guarding the wrong field.
"""

from __future__ import annotations

from typing import Any

from migronaut.versioning import writers
from migronaut.versioning.guards import RevisionResult
from migronaut.versioning.updates import bump_revision, refuse

__all__ = ["BoundWriters"]


class BoundWriters:
    """:mod:`migronaut.versioning`'s writers with ``field`` and ``revision_field`` fixed."""

    __slots__ = ("field", "revision_field")

    def __init__(self, field: str, revision_field: str) -> None:
        self.field = field
        self.revision_field = revision_field

    def _names(self, options: dict[str, Any]) -> dict[str, Any]:
        for key, declared in (("field", self.field), ("revision_field", self.revision_field)):
            if options.get(key, declared) != declared:
                raise refuse(f"{key} {options[key]!r} differs from the declared {declared!r}",
                             key)
        return {**options, "field": self.field, "revision_field": self.revision_field}

    def update_with_revision(self, collection: Any, filter: Any, expected_revision: int,
                             update: Any, **options: Any) -> RevisionResult:
        return writers.update_with_revision(collection, filter, expected_revision, update,
                                            **self._names(options))

    def replace_with_revision(self, collection: Any, filter: Any, expected_revision: int,
                              replacement: Any, **options: Any) -> RevisionResult:
        return writers.replace_with_revision(collection, filter, expected_revision,
                                             replacement, **self._names(options))

    def find_one_and_update_with_revision(self, collection: Any, filter: Any,
                                          expected_revision: int, update: Any,
                                          **options: Any) -> Any:
        return writers.find_one_and_update_with_revision(
            collection, filter, expected_revision, update, **self._names(options))

    async def aupdate_with_revision(self, collection: Any, filter: Any, expected_revision: int,
                                    update: Any, **options: Any) -> RevisionResult:
        return await writers.aupdate_with_revision(collection, filter, expected_revision,
                                                   update, **self._names(options))

    async def areplace_with_revision(self, collection: Any, filter: Any,
                                     expected_revision: int, replacement: Any,
                                     **options: Any) -> RevisionResult:
        return await writers.areplace_with_revision(collection, filter, expected_revision,
                                                    replacement, **self._names(options))

    async def afind_one_and_update_with_revision(self, collection: Any, filter: Any,
                                                 expected_revision: int, update: Any,
                                                 **options: Any) -> Any:
        return await writers.afind_one_and_update_with_revision(
            collection, filter, expected_revision, update, **self._names(options))

    def bump_revision(self, update: Any) -> Any:
        return bump_revision(update, revision_field=self.revision_field)
