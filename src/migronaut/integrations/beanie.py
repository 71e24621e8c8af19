"""Beanie documents with a versioning contract (reference collections §3.5, for Beanie ≥ 2).

:func:`versioned_document` builds the base class of a Beanie document of one versioned
collection. Its documents are stamped with ``current`` and revision 0 on ``insert``/``save``/
``insert_many``; a *loaded* document is written by ``save``/``replace`` as a guarded replace
(:func:`~migronaut.versioning.areplace_with_revision`) and by ``update``/``set``/``inc`` as a
guarded update, both at the revision it was loaded with, so a stale write raises
:class:`~migronaut.errors.RevisionConflictError` with its reason; and every document read from the
database goes through the collection's upcaster first. Query-level updates
(``Model.find(...).update(...)``, ``update_many``, ``set``, ``inc``, ``upsert``,
``Model.find_one(...).update(...)``, ``Model.update_all``) bump the revision unless they write
it, and an upsert stamps the version of the document it inserts — through Beanie's own hook, the
document's ``_find_many_query_class``/``_find_one_query_class``, whose update queries are
:class:`VersionedUpdateMany`/:class:`VersionedUpdateOne`; this holds with a bulk writer too.
Writes through ``Model.get_pymongo_collection()`` are not covered: add
:func:`~migronaut.versioning.bump_revision` to them yourself.

Invariant: the stored form (with ``_id``) is the only input upcast — a document built in code is
new, whatever its fields say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Self

from migronaut.errors import ExtraMissingError

try:
    from beanie import Document, WriteRules
    from beanie.odm.actions import EventTypes, wrap_with_actions
    from beanie.odm.queries.find import FindMany, FindOne
    from beanie.odm.queries.update import UpdateMany, UpdateOne
    from beanie.odm.utils.dump import get_dict
    from beanie.odm.utils.encoder import Encoder
    from beanie.odm.utils.self_validation import validate_self_before
    from beanie.odm.utils.state import save_state_after
    from pydantic import Field, PrivateAttr, create_model, model_validator
    from pymongo.results import InsertManyResult
except ImportError as missing:  # without the extra: say which one to install
    raise ExtraMissingError.of("beanie", "migronaut.integrations.beanie",
                               missing) from missing

from migronaut.integrations._common import Contract, merge_updates
from migronaut.versioning.shapes import Shapes
from migronaut.versioning.upcaster import Newer, Step
from migronaut.versioning.updates import refuse, stamp_update, update_kind, writes_field
from migronaut.versioning.writers import (
    afind_one_and_update_with_revision,
    areplace_with_revision,
)

__all__ = ["VersionedDocument", "VersionedUpdateMany", "VersionedUpdateOne",
           "versioned_document"]


def _stamped(document_model: Any, update: Any, upsert: bool) -> Any:
    """``update`` (as Beanie sends it) with the revision bumped unless it writes it, and — for
    an upsert — the version set on insert unless it writes it."""
    contract: Contract | None = getattr(document_model, "_migronaut", None)
    if contract is None or not update:
        return update
    kind = update_kind(update)
    if kind == "replacement":
        return update
    revision = contract.spec.revision_field
    if revision is not None and not writes_field(update, kind, revision):
        update = stamp_update(update, kind, revision_field=revision, field="", version=None)
    version = contract.spec.field
    if upsert and kind == "operator" and not writes_field(update, kind, version):
        update = {**update, "$setOnInsert": {**update.get("$setOnInsert", {}),
                                             version: contract.spec.current}}
    return update


class VersionedUpdateMany(UpdateMany):
    """``Model.find(...).update(...)`` and its kin: every update bumps the revision."""

    @property
    def update_query(self) -> dict[str, Any]:
        query: dict[str, Any] = _stamped(self.document_model, super().update_query,
                                         bool(self.pymongo_kwargs.get("upsert")))
        return query


class VersionedUpdateOne(UpdateOne):
    """``Model.find_one(...).update(...)`` and its kin: every update bumps the revision."""

    @property
    def update_query(self) -> dict[str, Any]:
        query: dict[str, Any] = _stamped(self.document_model, super().update_query,
                                         bool(self.pymongo_kwargs.get("upsert")))
        return query


class _FindMany(FindMany):  # type: ignore[type-arg]
    UpdateQueryType = VersionedUpdateMany


class _FindOne(FindOne):  # type: ignore[type-arg]
    UpdateQueryType = VersionedUpdateOne


class VersionedDocument(Document):
    """The behaviour; :func:`versioned_document` adds the two fields under the declared names
    (``shape_version`` and ``revision`` in Python, ``__v``/``__rev`` by default in MongoDB).
    Beanie's own ``ignore_revision`` concerns its ``revision_id`` only, never this guard."""

    _migronaut: ClassVar[Contract]
    _find_many_query_class: ClassVar[type] = _FindMany
    _find_one_query_class: ClassVar[type] = _FindOne
    #: Whether this object is in the database: loaded from it, or inserted by us.
    _stored: bool = PrivateAttr(default=False)

    @model_validator(mode="wrap")
    @classmethod
    def _upcast_on_load(cls, data: Any, handler: Any) -> Any:
        contract: Contract | None = getattr(cls, "_migronaut", None)
        loaded = contract is not None and isinstance(data, Mapping) and "_id" in data
        if contract is not None and loaded:
            data = contract.upcaster.upcast(data)
        document = handler(data)
        if loaded:
            document._stored = True
        return document

    def _guarding(self) -> bool:
        return self._migronaut.guarded and self._stored

    async def insert(self, **options: Any) -> Self:
        """Inserts the document stamped with ``current`` and revision 0."""
        self._migronaut.stamp(self)
        await super().insert(**options)
        self._stored = True
        return self

    @classmethod
    async def insert_many(  # type: ignore[override]
        cls, documents: Iterable[Any], session: Any = None, link_rule: WriteRules =
        WriteRules.DO_NOTHING, **options: Any,
    ) -> InsertManyResult:
        """``insert_many`` with every document stamped."""
        documents = list(documents)
        for document in documents:
            cls._migronaut.stamp(document)
        result = await super().insert_many(documents, session=session, link_rule=link_rule,
                                           **options)
        for document in documents:
            document._stored = True
        return result

    @wrap_with_actions(EventTypes.SAVE)
    async def save(self, session: Any = None, link_rule: WriteRules = WriteRules.DO_NOTHING,
                   ignore_revision: bool = False, **options: Any) -> Self:
        """Inserts a new document; replaces a loaded one at the revision it was loaded with."""
        if not self._stored:
            return await self.insert(session=session, link_rule=link_rule)
        return await self.replace(ignore_revision, session=session, link_rule=link_rule)

    @validate_self_before
    @wrap_with_actions(EventTypes.REPLACE)
    @save_state_after
    async def replace(self, ignore_revision: bool = False, session: Any = None,
                      bulk_writer: Any = None, link_rule: WriteRules = WriteRules.DO_NOTHING,
                      skip_actions: Any = None) -> Self:
        """The whole document written back, guarded by the revision it was loaded with."""
        if not self._guarding():
            self._migronaut.stamp(self)
            return await super().replace(ignore_revision, session, bulk_writer, link_rule,
                                         skip_actions)
        if bulk_writer is not None:
            raise refuse("A guarded replace cannot join a bulk writer", "bulk_writer")
        replacement = get_dict(self, to_db=True, keep_nulls=self.get_settings().keep_nulls)
        result = await areplace_with_revision(
            self.get_pymongo_collection(), {"_id": self.id}, self._migronaut.expected(self),
            replacement, session=session, **self._migronaut.writer_options())
        self.revision = result.revision
        return self

    @save_state_after
    async def update(self, *args: Mapping[Any, Any], ignore_revision: bool = False,
                     session: Any = None, bulk_writer: Any = None, skip_actions: Any = None,
                     skip_sync: bool | None = None, **options: Any) -> Self:
        """A partial update of a loaded document at the revision it was loaded with (also
        ``set``, ``inc``, …); the document is refreshed from the result."""
        if not self._guarding():
            return await super().update(*args, ignore_revision=ignore_revision,
                                        session=session, bulk_writer=bulk_writer,
                                        skip_actions=skip_actions, **options)
        if bulk_writer is not None:
            raise refuse("A guarded update cannot join a bulk writer", "bulk_writer")
        encoded = Encoder(custom_encoders=self.get_settings().bson_encoders).encode(
            merge_updates([dict(arg) for arg in args]))
        after = await afind_one_and_update_with_revision(
            self.get_pymongo_collection(), {"_id": self.id}, self._migronaut.expected(self),
            encoded, session=session, **options, **self._migronaut.writer_options())
        fresh = type(self).model_validate(after)
        for name in type(self).model_fields:
            object.__setattr__(self, name, getattr(fresh, name))
        return self


def versioned_document(
    shapes: Shapes, name: str, steps: Mapping[Any, Step] | None = None, *,
    newer: Newer = "throw",
) -> type[VersionedDocument]:
    """The Beanie base class for documents of the versioned collection ``name`` of ``shapes``:
    subclass it (the collection name defaults to ``name``) and list the subclass in
    ``init_beanie``. ``steps`` are the upcaster's (see :meth:`Shapes.upcaster`)."""
    contract = Contract.of(shapes, name, steps, newer)
    fields: dict[str, Any] = {
        "shape_version": (int | None, Field(default=None, alias=contract.spec.field))}
    if contract.guarded:
        fields["revision"] = (int | None,
                              Field(default=None, alias=contract.spec.revision_field))
    settings = type("Settings", (), {"name": name})
    base: type[VersionedDocument] = create_model(  # type: ignore[call-overload]
        f"Versioned_{name}", __base__=VersionedDocument, **fields)
    base._migronaut = contract
    base.Settings = settings  # type: ignore[attr-defined]
    return base
