"""Document versioning for application code: shape versions, revisions, guarded writes.

The runtime side of a collection's ``versioning`` block (reference collections §3.4): a
registry that stamps new documents (:func:`define_shapes`), optimistic-concurrency writers that
apply only at the revision the caller read and say why they missed
(:func:`update_with_revision` and friends, :func:`retry_on_conflict`), :func:`bump_revision`
for unguarded writes, and the in-memory :class:`Upcaster`. Sync functions take a pymongo
``Collection``; the ``a…`` variants an ``AsyncCollection``.

This module is a library for the application, not part of the tool: importing it loads
neither the engine nor the driver (pinned by a test).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migronaut.declared.versioning import VersioningSpec
from migronaut.errors import (
    ConfigInvalidError,
    MigronautError,
    RevisionConflictError,
    ShapeVersionError,
)
from migronaut.versioning.bound import BoundWriters
from migronaut.versioning.fields import exact_filter, is_version, revision_of
from migronaut.versioning.guards import RevisionResult
from migronaut.versioning.shapes import Shapes, define_shapes, resolve_versioning
from migronaut.versioning.upcaster import Newer, Step, Upcaster
from migronaut.versioning.updates import bump_revision
from migronaut.versioning.writers import (
    afind_one_and_update_with_revision,
    areplace_with_revision,
    aretry_on_conflict,
    aupdate_with_revision,
    find_one_and_update_with_revision,
    replace_with_revision,
    retry_on_conflict,
    update_with_revision,
)

__all__ = [
    "BoundWriters",
    "ConfigInvalidError",
    "MigronautError",
    "RevisionConflictError",
    "RevisionResult",
    "ShapeVersionError",
    "Shapes",
    "Upcaster",
    "VersioningSpec",
    "afind_one_and_update_with_revision",
    "areplace_with_revision",
    "aretry_on_conflict",
    "aupdate_with_revision",
    "bump_revision",
    "define_shapes",
    "exact_filter",
    "find_one_and_update_with_revision",
    "is_version",
    "replace_with_revision",
    "retry_on_conflict",
    "revision_of",
    "upcaster",
    "update_with_revision",
]


def upcaster(
    source: VersioningSpec | Mapping[str, Any] | Any, steps: Mapping[Any, Step], *,
    newer: Newer = "throw",
) -> Upcaster:
    """An :class:`Upcaster` for a collection definition (dict, ``.py`` definition module or
    loaded definition) or a bare ``versioning`` block; ``steps`` maps each source version to a
    synchronous ``doc → doc`` function."""
    name, spec = resolve_versioning(source)
    return Upcaster(spec, steps, newer=newer, collection=name)
