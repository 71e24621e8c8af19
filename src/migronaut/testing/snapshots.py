"""Snapshots of a database's user data, and a readable diff between two of them.

A snapshot holds, per collection: its kind and creation options (validators, collation, capped
size, view pipeline…), its indexes by name, and every document keyed by ``_id``. It is what
"the same data" means for the reversibility helpers.

Invariants and decisions:

* migronaut's own collections (changelog, lock, background state: the configured names and any
  name starting with ``_migronaut_``) and ``system.*`` collections are never part of a snapshot.
* Documents are matched by ``_id`` (its BSON encoding, so ``1`` and ``Int64(1)`` are different
  ids), never by position. Values are compared as BSON (:func:`bson_equal`: ``1``, ``1.0`` and
  ``Int64(1)`` differ, ``True`` is not ``1``). The top-level field order of a document is not
  compared (``$rename`` and ``$set`` move fields to the end, and no query sees the difference);
  the field order of embedded documents is (an exact-match query on a sub-document does).
* A collection that exists on one side only but is empty, has only the ``_id`` index and no
  options counts as absent: MongoDB creates such a collection implicitly on the first insert, so
  a ``down`` that deletes what ``up`` inserted has undone it.
* A view's documents are not read (they derive from its source collections); its definition is
  compared.

Snapshots hold every document in memory: they are meant for test databases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from migronaut._names import OWN_PREFIX

if TYPE_CHECKING:
    from pymongo.collection import Collection
    from pymongo.database import Database

    from migronaut.api import Migrator

__all__ = ["CollectionSnapshot", "DatabaseSnapshot", "snapshot"]

#: Longest document or value shown in a diff line.
_SHOWN_CHARS: Final = 400
#: Index fields that describe the server's storage, not the index a migration asked for.
_INDEX_NOISE: Final = frozenset({"v", "ns"})


@dataclass(frozen=True, eq=False)
class CollectionSnapshot:
    """One collection: ``kind`` (``collection``/``view``), creation options, indexes, documents.

    ``documents`` maps the BSON encoding of each ``_id`` to the document, in ``_id`` order.
    """

    name: str
    kind: str = "collection"
    options: Mapping[str, Any] = field(default_factory=dict)
    indexes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    documents: Mapping[bytes, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def implicit(self) -> bool:
        """Empty, only the ``_id`` index, no options: indistinguishable from no collection."""
        return (
            self.kind == "collection"
            and not self.documents
            and not self.options
            and set(self.indexes) <= {"_id_"}
        )


@dataclass(frozen=True, eq=False)
class DatabaseSnapshot:
    """The user data of one database at one moment. ``==`` means :meth:`diff` finds nothing."""

    database: str
    collections: Mapping[str, CollectionSnapshot]

    def diff(
        self, other: DatabaseSnapshot, *, labels: tuple[str, str] = ("before", "after")
    ) -> str | None:
        """A readable account of how ``other`` differs from this snapshot, or ``None``.

        The first differing collection (in name order) is described in full: options, indexes,
        document counts and the first differing document (in ``_id`` order) on both sides. The
        other differing collections are listed by name. ``labels`` name the two sides.
        """
        width = max(len(label) for label in labels)
        sides = (labels[0].ljust(width), labels[1].ljust(width))
        differing: list[str] = []
        details: list[str] = []
        for name in sorted(set(self.collections) | set(other.collections)):
            lines = _collection_diff(
                name, self.collections.get(name), other.collections.get(name), labels, sides
            )
            if lines:
                differing.append(name)
                if not details:
                    details = lines
        if not differing:
            return None
        if len(differing) > 1:
            rest = differing[1:]
            details.append(
                f"{len(rest)} more collection(s) differ: " + ", ".join(repr(n) for n in rest)
            )
        return "\n".join(details)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DatabaseSnapshot):
            return NotImplemented
        return self.diff(other) is None

    __hash__ = None  # type: ignore[assignment]


def snapshot(
    target: Migrator | Database[dict[str, Any]], *, exclude: Iterable[str] = ()
) -> DatabaseSnapshot:
    """Capture the user data of a database (a pymongo ``Database``, or a ``Migrator``'s).

    ``exclude`` names more collections to leave out. Given a ``Migrator``, its configured
    changelog, lock and background collection names are left out too, whatever they are called.
    """
    db, skipped = _database_of(target)
    skipped.update(exclude)
    collections: dict[str, CollectionSnapshot] = {}
    for info in db.list_collections():
        name = info["name"]
        if name in skipped or name.startswith((OWN_PREFIX, "system.")):
            continue
        kind, options = collection_kind(info)
        if kind == "view":
            collections[name] = CollectionSnapshot(name, kind, options)
            continue
        collection = db[name]
        documents = {_id_key(doc["_id"]): doc for doc in collection.find().sort("_id", 1)}
        collections[name] = CollectionSnapshot(
            name, kind, options, index_specs(collection), documents
        )
    return DatabaseSnapshot(db.name, collections)


def collection_kind(info: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(kind, options)`` of a ``listCollections`` entry (a view may be reported as a
    collection with a ``viewOn`` option)."""
    options = dict(info.get("options") or {})
    kind = info.get("type") or "collection"
    return ("view" if "viewOn" in options else kind), options


def index_specs(collection: Collection[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The indexes of a collection by name, as ``createIndexes`` takes them (no ``v``/``ns``)."""
    return {
        spec["name"]: {k: v for k, v in spec.items() if k not in _INDEX_NOISE}
        for spec in collection.list_indexes()
    }


def _database_of(target: Any) -> tuple[Database[dict[str, Any]], set[str]]:
    """The database, and the names of migronaut's collections in it under ``target``'s config."""
    from pymongo.database import Database

    if isinstance(target, Database):
        return target, set()
    from migronaut.background.state.store import BackgroundStore

    config, db = target.config, target.db
    background = BackgroundStore(db, collection=config.background_collection, ensure_indexes=False)
    own = {config.migrations_collection, config.lock_collection, config.converge_log_collection,
           *background.own_collections}
    return db, own


def _id_key(value: Any) -> bytes:
    """A hashable, exact key for an ``_id`` of any BSON type (documents included)."""
    import bson

    return bson.encode({"_id": value})


# ------------------------------------------------------------------------------------ diff


def _values_equal(a: Any, b: Any) -> bool:
    """BSON equality, ignoring only the top-level key order of two documents."""
    from migronaut.background.lanes.diff import bson_equal

    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(bson_equal(a[k], b[k]) for k in a)
    return bson_equal(a, b)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def _collection_diff(
    name: str,
    a: CollectionSnapshot | None,
    b: CollectionSnapshot | None,
    labels: tuple[str, str],
    sides: tuple[str, str],
) -> list[str]:
    if a is None or b is None:
        present = a if a is not None else b
        assert present is not None
        if present.implicit:
            return []
        where = labels[0] if a is not None else labels[1]
        indexes = ", ".join(n for n in present.indexes if n != "_id_") or "none besides _id"
        what = "view" if present.kind == "view" else "collection"
        return [
            f"{what} {name!r} exists only {where} "
            f"({len(present.documents)} document(s); indexes: {indexes})"
        ]
    lines: list[str] = []
    if a.kind != b.kind or not _values_equal(dict(a.options), dict(b.options)):
        lines += [
            f"collection {name!r}: options differ",
            f"  {sides[0]}: {a.kind} {_shown(dict(a.options))}",
            f"  {sides[1]}: {b.kind} {_shown(dict(b.options))}",
        ]
    for index in sorted(set(a.indexes) | set(b.indexes)):
        spec_a, spec_b = a.indexes.get(index), b.indexes.get(index)
        if spec_a is None or spec_b is None:
            where, spec = (labels[0], spec_a) if spec_b is None else (labels[1], spec_b)
            lines.append(f"collection {name!r}: index {index!r} exists only {where}: "
                         f"{_shown(dict(spec or {}))}")
        elif not _values_equal(spec_a, spec_b):
            lines += [
                f"collection {name!r}: index {index!r} differs",
                f"  {sides[0]}: {_shown(dict(spec_a))}",
                f"  {sides[1]}: {_shown(dict(spec_b))}",
            ]
    lines += _documents_diff(name, a.documents, b.documents, labels, sides)
    return lines


def _documents_diff(
    name: str,
    a: Mapping[bytes, Mapping[str, Any]],
    b: Mapping[bytes, Mapping[str, Any]],
    labels: tuple[str, str],
    sides: tuple[str, str],
) -> list[str]:
    changed, only_a, only_b = _split(a, b, _values_equal)
    if not (changed or only_a or only_b):
        return []
    counts = _describe((changed, only_a, only_b), labels, lambda keys: str(len(keys)))
    total = len(a.keys() | b.keys())
    lines = [f"collection {name!r}: documents differ ({counts}, of {total})"]
    # the first difference in _id order: side A is in _id order, the ids only on B come after
    differing = {*changed, *only_a}
    first = next((key for key in a if key in differing), None)
    if first is None:
        first = only_b[0]
    doc_a, doc_b = a.get(first), b.get(first)
    shown_id = (doc_a if doc_a is not None else doc_b or {}).get("_id")
    lines.append(f"  first difference, _id {_shown(shown_id)}:")
    lines.append(f"    {sides[0]}: {_shown(dict(doc_a)) if doc_a is not None else '(absent)'}")
    lines.append(f"    {sides[1]}: {_shown(dict(doc_b)) if doc_b is not None else '(absent)'}")
    if doc_a is not None and doc_b is not None:
        from migronaut.background.lanes.diff import bson_equal

        fields = _split(doc_a, doc_b, bson_equal)
        names = _describe(fields, labels, lambda keys: ", ".join(map(repr, keys)), sep="; ")
        lines.append(f"    fields: {names}")
    return lines


def _split(
    a: Mapping[Any, Any], b: Mapping[Any, Any], equal: Callable[[Any, Any], bool]
) -> tuple[list[Any], list[Any], list[Any]]:
    """The keys whose values differ, the keys only in ``a``, the keys only in ``b``."""
    changed = [key for key in a if key in b and not equal(a[key], b[key])]
    return changed, [key for key in a if key not in b], [key for key in b if key not in a]


def _describe(
    keys: tuple[list[Any], list[Any], list[Any]],
    labels: tuple[str, str],
    show: Callable[[list[Any]], str],
    sep: str = ", ",
) -> str:
    """``"<changed> changed, <only a> only <label a>, <only b> only <label b>"`` without the
    empty parts, each list of keys rendered by ``show``."""
    suffixes = ("changed", f"only {labels[0]}", f"only {labels[1]}")
    return sep.join(f"{show(k)} {suffix}" for k, suffix in zip(keys, suffixes, strict=True) if k)
