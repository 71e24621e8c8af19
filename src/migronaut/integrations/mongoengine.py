"""MongoEngine documents with a versioning contract (reference collections §3.5).

:func:`versioned_document` builds the abstract base class of a MongoEngine document of one
versioned collection. New documents are stamped with ``current`` and revision 0 and *inserted*
(never upserted over a stored one); a *loaded* document is written by ``save`` as a guarded
replace (:func:`~migronaut.versioning.replace_with_revision`) and by ``update`` as a guarded
update, at the revision it was loaded with — a stale write raises
:class:`~migronaut.errors.RevisionConflictError` with its reason. Every document read from the
database goes through the collection's upcaster (``_from_son``). Query-set writes
(``Model.objects(...).update(...)``, ``update_one``, ``modify``, ``upsert_one``), ``__raw__``
updates (operator documents and pipelines) included, bump the revision unless they write it,
and an operator upsert stamps the version on insert. ``pre_save``, ``pre_save_post_validation``
and ``post_save`` are sent as MongoEngine sends them. Not covered: writes through
``_get_collection()`` — add :func:`~migronaut.versioning.bump_revision` yourself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from migronaut.errors import ExtraMissingError

try:
    from mongoengine import Document, IntField, QuerySet, signals
    from mongoengine.queryset import transform
except ImportError as missing:  # without the extra: say which one to install
    raise ExtraMissingError.of("mongoengine", "migronaut.integrations.mongoengine",
                               missing) from missing

from migronaut.integrations._common import REVISION, VERSION, Contract
from migronaut.versioning.shapes import Shapes
from migronaut.versioning.upcaster import Newer, Step
from migronaut.versioning.updates import stamp_update, update_kind, writes_field
from migronaut.versioning.writers import (
    find_one_and_update_with_revision,
    replace_with_revision,
)

__all__ = ["VersionedQuerySet", "versioned_document"]


def _writes(update: Mapping[str, Any], name: str) -> bool:
    """Whether MongoEngine keyword updates write the field ``name`` (``set__name``, ``name``)."""
    return any(key == name or key.split("__")[1:2] == [name] for key in update)


class VersionedQuerySet(QuerySet):  # type: ignore[misc]
    """Query-set writes that bump the revision and stamp the version of upserted documents."""

    def _stamped(self, update: dict[str, Any], upsert: bool) -> dict[str, Any]:
        contract: Contract = self._document._migronaut
        if "__raw__" in update:
            return {**update, "__raw__": _stamped_raw(contract, update, upsert)}
        if contract.guarded and not _writes(update, REVISION):
            update = {**update, f"inc__{REVISION}": 1}
        if upsert and not _writes(update, VERSION):
            update = {**update, f"set_on_insert__{VERSION}": contract.spec.current}
        return update

    def update(self, upsert: bool = False, *args: Any, **update: Any) -> Any:
        options = {key: update.pop(key) for key in
                   ("multi", "write_concern", "read_concern", "full_result", "array_filters")
                   if key in update}
        return super().update(upsert, *args, **options, **self._stamped(update, upsert))

    def modify(self, upsert: bool = False, *args: Any, **update: Any) -> Any:
        options = {key: update.pop(key) for key in
                   ("full_response", "remove", "new", "array_filters") if key in update}
        if options.get("remove"):
            return super().modify(upsert, *args, **options, **update)
        return super().modify(upsert, *args, **options, **self._stamped(update, upsert))


def _stamped_raw(contract: Contract, update: Mapping[str, Any], upsert: bool) -> Any:
    """A ``__raw__`` update (stored field names) stamped like keyword updates: the revision
    bumped unless the raw update or the keywords beside it write it; an operator upsert gets
    the version on insert. A raw replacement is left alone (MongoEngine refuses it)."""
    raw = update["__raw__"]
    kind = update_kind(raw)
    if kind == "replacement":
        return raw
    revision, version = contract.spec.revision_field, contract.spec.field
    if revision is not None and not writes_field(raw, kind, revision) and \
            not _writes(update, REVISION):
        raw = stamp_update(raw, kind, revision_field=revision, field="", version=None)
    if upsert and kind == "operator" and not writes_field(raw, kind, version) and \
            not _writes(update, VERSION):
        raw = {**raw, "$setOnInsert": {**raw.get("$setOnInsert", {}),
                                       version: contract.spec.current}}
    return raw


class _Versioned:
    """The behaviour mixed into the generated base (MongoEngine's metaclass owns the fields)."""

    _migronaut: Contract

    @classmethod
    def _from_son(cls, son: Any, *args: Any, created: bool = False, **kwargs: Any) -> Any:
        if not created and son:
            son = cls._migronaut.upcaster.upcast(son)
        return super()._from_son(son, *args, created=created, **kwargs)  # type: ignore[misc]

    def _new(self) -> bool:
        return bool(self._created) or self.pk is None  # type: ignore[attr-defined]

    def _loaded(self) -> bool:
        return self._migronaut.guarded and not self._new()

    def save(self, *args: Any, **options: Any) -> Any:
        """Inserts a new document; replaces a loaded one at the revision it was loaded with
        (without revisions, MongoEngine's own save)."""
        if self._new():
            self._migronaut.stamp(self)
            options["force_insert"] = True
        elif self._loaded():
            return self._guarded_save(**options)
        return super().save(*args, **options)  # type: ignore[misc]

    def _guarded_save(self, *, validate: bool = True, clean: bool = True,
                      signal_kwargs: dict[str, Any] | None = None,
                      write_concern: Any = None, session: Any = None) -> Any:
        me: Any = self
        signal_kwargs = signal_kwargs or {}
        signals.pre_save.send(type(self), document=self, **signal_kwargs)
        if validate:
            me.validate(clean=clean)
        signals.pre_save_post_validation.send(type(self), document=self, created=False,
                                              **signal_kwargs)
        collection = type(self)._get_collection()  # type: ignore[attr-defined]
        if write_concern:
            from pymongo import WriteConcern

            collection = collection.with_options(write_concern=WriteConcern(**write_concern))
        expected = self._migronaut.expected(self)
        result = replace_with_revision(collection, me._object_key_son(), expected,
                                       me.to_mongo().to_dict(), session=session,
                                       **self._migronaut.writer_options())
        setattr(self, REVISION, result.revision)
        signals.post_save.send(type(self), document=self, created=False, **signal_kwargs)
        me._clear_changed_fields()
        return self

    def _object_key_son(self) -> dict[str, Any]:
        """The filter of this document: ``_id`` (plus the shard key, as MongoEngine adds)."""
        me: Any = self
        return dict(me._qs.filter(**me._object_key)._query)

    def update(self, **update: Any) -> int:
        """A partial update of a loaded document at the revision it was loaded with; the
        document is refreshed from the result."""
        if not self._loaded():
            return super().update(**update)  # type: ignore[misc, no-any-return]
        me: Any = self
        session = update.pop("session", None)
        raw = transform.update(type(self), **update)
        expected = self._migronaut.expected(self)
        after = find_one_and_update_with_revision(
            type(self)._get_collection(), self._object_key_son(),  # type: ignore[attr-defined]
            expected, raw, session=session, **self._migronaut.writer_options())
        fresh = type(self)._from_son(after)
        for name in me._fields:
            me._data[name] = fresh._data[name]
        me._clear_changed_fields()
        return 1


def versioned_document(
    shapes: Shapes, name: str, steps: Mapping[Any, Step] | None = None, *,
    newer: Newer = "throw",
) -> type[Document]:
    """The abstract MongoEngine base class for documents of the versioned collection ``name``
    of ``shapes`` (subclass it; its collection is ``name`` unless its ``meta`` says otherwise).
    ``steps`` are the upcaster's (see :meth:`Shapes.upcaster`)."""
    contract = Contract.of(shapes, name, steps, newer)
    attrs: dict[str, Any] = {
        "_migronaut": contract,
        VERSION: IntField(db_field=contract.spec.field, min_value=0),
        "meta": {"abstract": True, "collection": name, "queryset_class": VersionedQuerySet},
    }
    if contract.guarded:
        attrs[REVISION] = IntField(db_field=contract.spec.revision_field, min_value=0)
    return type(f"Versioned_{name}", (_Versioned, Document), attrs)
