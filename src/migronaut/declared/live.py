"""What the server has, as typed state the converge planner compares against (reference §2.4).

The executor reads a collection with one ``listCollections`` entry and one ``listIndexes``
listing (plus, when relevant, the shard key, the version-floor probe and the search-index list)
and hands the raw documents to :func:`live_collection`. Invariant: nothing here talks to a
database, and every normalization the comparison relies on happens once, here — ``_id_`` and a
clustered index are never part of the live indexes, boolean options stored as ``True``/``1``
read as ``True`` (anything else as absent), ``v``/``ns``/``background`` are never compared.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from migronaut.declared.indexes import KeyPairs

__all__ = [
    "BOOLEAN_OPTIONS",
    "LiveCollection",
    "LiveIndex",
    "ServerCapabilities",
    "VersionFloor",
    "live_collection",
    "live_index",
]

#: Index options the server may store as ``True`` or ``1``; anything else means "not set".
BOOLEAN_OPTIONS = ("unique", "sparse", "hidden", "prepareUnique")
#: Listing fields that are bookkeeping, not part of what an index is (never shown nor compared).
_NOT_OPTIONS = ("v", "ns", "background", "key", "name")


@dataclass(frozen=True)
class ServerCapabilities:
    """What the server can change in place (§2.4.4); ``version`` ``None`` = unknown, which
    allows only ``hidden`` and TTL-value changes."""

    version: tuple[int, int, int] | None = None

    def _at_least(self, major: int, minor: int) -> bool:
        return self.version is not None and self.version[:2] >= (major, minor)

    @property
    def can_add_ttl(self) -> bool:
        """``collMod`` adds ``expireAfterSeconds`` to an index (5.1+)."""
        return self._at_least(5, 1)

    @property
    def can_make_unique(self) -> bool:
        """``prepareUnique`` → ``unique`` enforces uniqueness (7.0+; 6.0 was seen not to)."""
        return self._at_least(7, 0)


@dataclass(frozen=True)
class VersionFloor:
    """The version-floor probe's answer (§3.3.4): are documents below ``min`` left?
    ``below`` is ``"unknown"`` when the probe could not run (``error`` says why)."""

    min: int
    below: bool | Literal["unknown"]
    error: str | None = None


@dataclass(frozen=True)
class LiveIndex:
    """One listed secondary index. ``options`` are its listed options without ``v``, ``ns``,
    ``background``; booleans normalized to ``True`` (or left out)."""

    name: str
    key: KeyPairs
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The listing as the server gave it (minus ``v``/``ns``/``background``/``clustered``):
    #: what a failed rebuild re-creates.
    spec: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_text(self) -> bool:
        return any(direction == "text" for _, direction in self.key)

    @property
    def unique(self) -> bool:
        return bool(self.options.get("unique"))

    def value(self) -> dict[str, Any]:
        """The row's ``from`` value: ``{key, name, …options}`` as listed (a fresh copy)."""
        return {"key": dict(self.key), "name": self.name,
                **{name: copy.deepcopy(value) for name, value in self.spec.items()
                   if name not in ("key", "name")}}


@dataclass(frozen=True)
class LiveCollection:
    """One declared collection as the server has it; ``exists`` False for a missing one."""

    name: str
    exists: bool = False
    #: ``listCollections`` ``type``: ``collection``, ``view``, ``timeseries``.
    type: str = "collection"
    options: Mapping[str, Any] = field(default_factory=dict)
    indexes: tuple[LiveIndex, ...] = ()
    #: The collection's shard key behind a mongos (``None``: not sharded or unknown).
    shard_key: Mapping[str, Any] | None = None
    version_floor: VersionFloor | None = None
    #: Raw ``$listSearchIndexes`` documents, ``None`` when not read.
    search_indexes: tuple[Mapping[str, Any], ...] | None = None

    @property
    def default_collation(self) -> Mapping[str, Any] | None:
        """The collection's default collation, which an index declared without one gets."""
        collation = self.options.get("collation")
        return collation if isinstance(collation, Mapping) else None

    def validator_state(self) -> dict[str, Any] | None:
        """``{validator, validationLevel, validationAction}`` with the server defaults filled,
        or ``None`` when the collection has no validator (absent, ``None`` or ``{}``)."""
        validator = self.options.get("validator")
        if not validator:
            return None
        return {"validator": copy.deepcopy(dict(validator)),
                "validationLevel": self.options.get("validationLevel") or "strict",
                "validationAction": self.options.get("validationAction") or "error"}


def _direction(value: Any) -> int | str:
    """A listed key direction: strings as listed, numbers by sign (``1.0``, ``Int64(-1)``)."""
    if isinstance(value, str):
        return value
    return -1 if value < 0 else 1


def live_index(document: Mapping[str, Any]) -> LiveIndex | None:
    """One ``listIndexes`` document as a :class:`LiveIndex`; ``None`` for ``_id_`` and a
    clustered index, which converge never lists, compares or drops."""
    name = document.get("name")
    if name == "_id_" or document.get("clustered") or not isinstance(name, str):
        return None
    key = tuple((str(field_name), _direction(direction))
                for field_name, direction in dict(document.get("key") or {}).items())
    options: dict[str, Any] = {}
    for option, value in document.items():
        if option in _NOT_OPTIONS or option == "clustered":
            continue
        if option in BOOLEAN_OPTIONS:
            if value is True or (not isinstance(value, bool) and value == 1):
                options[option] = True
            continue
        options[option] = copy.deepcopy(value)
    spec = {option: copy.deepcopy(value) for option, value in document.items()
            if option not in ("v", "ns", "background", "clustered")}
    return LiveIndex(name=name, key=key, options=options, spec=spec)


def live_collection(
    name: str,
    info: Mapping[str, Any] | None,
    indexes: Sequence[Mapping[str, Any]] = (),
    *,
    shard_key: Mapping[str, Any] | None = None,
    version_floor: VersionFloor | None = None,
    search_indexes: Sequence[Mapping[str, Any]] | None = None,
) -> LiveCollection:
    """The live state from the ``listCollections`` entry (``None``: the collection is missing)
    and the ``listIndexes`` documents; the other facts pass through."""
    if info is None:
        return LiveCollection(name=name, exists=False)
    parsed = tuple(index for index in (live_index(doc) for doc in indexes) if index is not None)
    return LiveCollection(
        name=name, exists=True, type=str(info.get("type") or "collection"),
        options=copy.deepcopy(dict(info.get("options") or {})), indexes=parsed,
        shard_key=shard_key, version_floor=version_floor,
        search_indexes=None if search_indexes is None else tuple(search_indexes),
    )
