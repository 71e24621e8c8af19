"""What both ODM integrations share: the contract of one collection and its loaded state.

Invariant: a document counts as *stored* only when it came from the database (or was inserted
through the integration); only a stored document is written under the revision guard, with the
revision it was loaded with — a new one is inserted, never upserted over someone else's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from migronaut.declared.versioning import VersioningSpec
from migronaut.versioning.fields import revision_of
from migronaut.versioning.shapes import Shapes
from migronaut.versioning.upcaster import Newer, Step, Upcaster

__all__ = ["REVISION", "VERSION", "Contract", "merge_updates"]

#: The Python names of the two fields on a document class (the MongoDB names are the declared
#: ``field`` and ``revision_field``).
VERSION, REVISION = "shape_version", "revision"


@dataclass(frozen=True)
class Contract:
    """One versioned collection as an ODM document class sees it."""

    name: str
    spec: VersioningSpec
    upcaster: Upcaster

    @classmethod
    def of(cls, shapes: Shapes, name: str, steps: Mapping[Any, Step] | None,
           newer: Newer) -> Contract:
        """The contract of ``name`` in ``shapes``; the upcaster is built (and its steps checked)
        here, when the document class is defined, not when an old document first shows up."""
        return cls(name, shapes.get(name), shapes.upcaster(name, steps or {}, newer=newer))

    @property
    def guarded(self) -> bool:
        return self.spec.revision_field is not None

    def writer_options(self) -> dict[str, Any]:
        """The field names every guarded write of this collection uses."""
        return {"field": self.spec.field, "revision_field": self.spec.revision_field}

    def expected(self, document: Any) -> int:
        """The revision a loaded document was read at (0 for a legacy one without it)."""
        return revision_of({REVISION: getattr(document, REVISION)}, REVISION)

    def stamp(self, document: Any) -> None:
        """Sets version ``current`` and revision 0 on a new document where they are unset."""
        if getattr(document, VERSION) is None:
            setattr(document, VERSION, self.spec.current)
        if self.guarded and getattr(document, REVISION) is None:
            setattr(document, REVISION, 0)


def merge_updates(updates: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Several operator updates as one (``{"$set": a}, {"$set": b}`` → ``{"$set": a | b}``)."""
    merged: dict[str, Any] = {}
    for update in updates:
        for operator, spec in update.items():
            if isinstance(spec, Mapping) and isinstance(merged.get(operator), dict):
                merged[operator].update(spec)
            else:
                merged[operator] = dict(spec) if isinstance(spec, Mapping) else spec
    return merged
