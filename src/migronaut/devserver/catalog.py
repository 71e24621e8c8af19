"""The dev server's catalog as ``mongod`` lists it: ``listIndexes`` and ``listCollections``.

mongoeco lists indexes its own way (``ns``, ``unique: false`` everywhere, text indexes by their
fields, no defaults filled in) and drops or refuses a few options ``mongod`` keeps (``bits``,
``wildcardProjection``, ``textIndexVersion``, …). Converge compares what it declared with what
the server lists, so the dev server must list what ``mongod`` 7.0 would. These are pure
functions over documents; :mod:`migronaut.devserver.wire` applies them, and keeps the options
mongoeco cannot store in :class:`IndexExtras`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "STORED_BY_LAYER",
    "IndexExtras",
    "Refused",
    "bson_type_name",
    "equivalent_index_refusal",
    "full_collation",
    "missing_field",
    "mongod_collection",
    "mongod_index",
    "mongoeco_index_spec",
    "unknown_field",
    "with_collection_collation",
    "wrong_type",
]

#: Index options mongoeco refuses or drops: the layer keeps them and lists them back.
STORED_BY_LAYER: Final = frozenset({
    "bits", "textIndexVersion", "2dsphereIndexVersion", "storageEngine", "wildcardProjection",
    "background",
})
#: Spec fields a client may copy from ``listIndexes`` that are not options (mongod ignores them).
_NOT_OPTIONS: Final = frozenset({"v", "ns"})
#: Boolean options mongod stores verbatim, ``false`` included, when the client sends them.
_BOOLEANS: Final = ("unique", "sparse", "hidden")
#: What ``mongod`` fills into every collation (ICU 57.1), in its order.
_COLLATION_DEFAULTS: Final[tuple[tuple[str, Any], ...]] = (
    ("caseLevel", False), ("caseFirst", "off"), ("strength", 3), ("numericOrdering", False),
    ("alternate", "non-ignorable"), ("maxVariable", "punct"), ("normalization", False),
    ("backwards", False), ("version", "57.1"),
)
#: Locales whose ICU tailoring changes a default.
_LOCALE_DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {"fr_CA": {"backwards": True}}
#: Languages of text index version 3 (names and ISO codes), and ``none``.
_TEXT_LANGUAGES: Final = frozenset({
    "none", "danish", "da", "dutch", "nl", "english", "en", "finnish", "fi", "french", "fr",
    "german", "de", "hungarian", "hu", "italian", "it", "norwegian", "nb", "portuguese", "pt",
    "romanian", "ro", "russian", "ru", "spanish", "es", "swedish", "sv", "turkish", "tr",
})
#: ``timeseries`` bucket span by granularity, as mongod fills it in.
_BUCKET_SPAN: Final = {"seconds": 3600, "minutes": 86400, "hours": 2592000}
_ID_INDEX: Final = {"v": 2, "key": {"_id": 1}, "name": "_id_"}

Namespace = tuple[str, str, str]


class Refused(Exception):
    """A command mongod refuses: its code, code name, message and extra reply fields."""

    def __init__(self, code: int, code_name: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.code_name, self.message, self.details = code, code_name, message, details


def bson_type_name(value: Any) -> str:
    """The BSON type name mongod's messages give for ``value``."""
    names = {bool: "bool", int: "int", float: "double", str: "string", list: "array"}
    if value is None:
        return "null"
    return "object" if isinstance(value, Mapping) else names.get(type(value), "unknown")


def wrong_type(field: str, value: Any, expected: str) -> Refused:
    """mongod's command-parser error for a field of the wrong type (``field`` is dotted from the
    command name, e.g. ``collMod.index``)."""
    return Refused(14, "TypeMismatch", f"BSON field '{field}' is the wrong type "
                   f"'{bson_type_name(value)}', expected type '{expected}'")


def unknown_field(field: str) -> Refused:
    """mongod's command-parser error for a field it does not know."""
    return Refused(40415, "Location40415", f"BSON field '{field}' is an unknown field.")


def missing_field(field: str) -> Refused:
    """mongod's command-parser error for a required field left out."""
    return Refused(40414, "Location40414",
                   f"BSON field '{field}' is missing but a required field")


class IndexExtras:
    """What the layer remembers about indexes beyond mongoeco: options it cannot store, booleans
    sent as ``false``, ``prepareUnique``. Keyed by (database, collection, index name); an entry is
    replaced whenever an index of that name is created, so a stale entry never outlives its index.
    Lives as long as the server process (not persisted with ``--path``)."""

    def __init__(self) -> None:
        self._by_index: dict[Namespace, dict[str, Any]] = {}

    def get(self, db: str, coll: str, name: str) -> dict[str, Any]:
        return dict(self._by_index.get((db, coll, name), {}))

    def put(self, db: str, coll: str, name: str, extras: Mapping[str, Any]) -> None:
        if extras:
            self._by_index[(db, coll, name)] = dict(extras)
        else:
            self._by_index.pop((db, coll, name), None)


def full_collation(collation: Any) -> dict[str, Any] | None:
    """A collation with every field mongod fills in; ``None`` for none or ``simple``."""
    if not isinstance(collation, Mapping) or collation.get("locale") in (None, "simple"):
        return None
    locale = collation["locale"]
    defaults = {**dict(_COLLATION_DEFAULTS), **_LOCALE_DEFAULTS.get(locale, {})}
    filled: dict[str, Any] = {"locale": locale}
    for field, default in defaults.items():
        filled[field] = collation.get(field, default)
    return filled


def mongoeco_index_spec(spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a client's index spec into what mongoeco is given and what the layer keeps.

    A text key in mongod's listed form (``_fts``/``_ftsx``) becomes its fields again. Raises
    :class:`Refused` for what mongod refuses (an unknown text language).
    """
    given = {name: value for name, value in spec.items() if name not in _NOT_OPTIONS}
    key = given.get("key")
    if isinstance(key, Mapping) and "_fts" in key:
        given["key"] = _text_fields(key, given.get("weights"))
    if isinstance(given.get("key"), Mapping) and "text" in given["key"].values():
        language = given.get("default_language", "english")
        if isinstance(language, str) and language not in _TEXT_LANGUAGES:
            raise Refused(17262, "Location17262",
                          f'unsupported language: "{language}" for text index version 3')
    extras = {name: given.pop(name) for name in STORED_BY_LAYER if name in given}
    extras.update({name: False for name in _BOOLEANS if given.get(name) is False})
    if "wildcardProjection" in extras:
        given["wildcardProjection"] = extras["wildcardProjection"]
    return given, extras


def _ordered_key(key: Any) -> list[tuple[str, Any]] | None:
    return [(str(name), value) for name, value in key.items()] \
        if isinstance(key, Mapping) else None


def _equivalent(spec: Mapping[str, Any], listed: Mapping[str, Any]) -> bool:
    """mongod's "equivalent" indexes: same key, partial filter and collation (indexes that
    differ in one of these may coexist); a wildcard projection is compared too, to stay on the
    side of letting mongoeco decide."""
    key = _ordered_key(spec.get("key"))
    if key is None or key != _ordered_key(listed.get("key")) or \
            any(value == "text" for _, value in key):
        return False
    return (spec.get("partialFilterExpression") == listed.get("partialFilterExpression")
            and spec.get("wildcardProjection") == listed.get("wildcardProjection")
            and full_collation(spec.get("collation")) == full_collation(listed.get("collation")))


def equivalent_index_refusal(spec: Mapping[str, Any],
                             existing: list[Mapping[str, Any]]) -> Refused | None:
    """mongod's IndexOptionsConflict (85) for a requested index equivalent to an existing one
    under another name (``spec`` as the client sent it, collection collation applied):
    "already exists with a different name" when the options match too, else "an equivalent
    index already exists with a different name and options". ``None`` when mongod would build
    it (or the same-name rules decide)."""
    name = spec.get("name")
    for listed in existing:
        if listed.get("name") == name or not _equivalent(spec, listed):
            continue
        same_options = all(bool(spec.get(option)) == bool(listed.get(option))
                           for option in ("unique", "sparse")) and \
            spec.get("expireAfterSeconds") == listed.get("expireAfterSeconds")
        if same_options:
            return Refused(85, "IndexOptionsConflict",
                           f"Index already exists with a different name: {listed.get('name')}")
        shown = {k: v for k, v in listed.items() if k not in _NOT_OPTIONS}
        return Refused(85, "IndexOptionsConflict",
                       "An equivalent index already exists with a different name and options. "
                       f"Requested index: {dict(spec)}, existing index: {shown}")
    return None


def with_collection_collation(spec: dict[str, Any], default_collation: Any) -> dict[str, Any]:
    """An index without a collation gets the collection's default, as in mongod;
    ``{locale: 'simple'}`` means none."""
    collation = spec.get("collation", default_collation)
    if full_collation(collation) is None:
        spec.pop("collation", None)
    else:
        spec["collation"] = collation
    return spec


def _text_fields(key: Mapping[str, Any], weights: Any) -> dict[str, Any]:
    """``{a: 1, _fts: 'text', _ftsx: 1}`` with its weights → ``{a: 1, <field>: 'text', …}``."""
    fields = sorted(weights) if isinstance(weights, Mapping) and weights else ["$**"]
    out: dict[str, Any] = {}
    for name, direction in key.items():
        if name == "_fts":
            out.update(dict.fromkeys(fields, "text"))
        elif name != "_ftsx":
            out[name] = direction
    return out


def mongod_index(listed: Mapping[str, Any], extras: Mapping[str, Any]) -> dict[str, Any]:
    """One ``listIndexes`` entry as mongod 7.0 reports it."""
    key = dict(listed.get("key") or {})
    out: dict[str, Any] = {"v": 2, "key": key, "name": listed.get("name")}
    for name, value in listed.items():
        if name in ("key", "name", "ns", "v") or (name in _BOOLEANS and value is False):
            continue
        if name == "unique" and out["name"] == "_id_":
            continue
        out[name] = value
    out.update(extras)
    if "collation" in out:
        collation = full_collation(out["collation"])
        if collation is None:
            del out["collation"]
        else:
            out["collation"] = collation
    if "text" in key.values():
        _text_shape(out, key)
    if "2dsphere" in key.values():
        out.setdefault("2dsphereIndexVersion", 3)
    return out


def _text_shape(out: dict[str, Any], key: Mapping[str, Any]) -> None:
    """mongod's text index: ``_fts``/``_ftsx`` key, every text field weighted (sorted), the
    language options and version filled in."""
    weights = dict.fromkeys((name for name, kind in key.items() if kind == "text"), 1)
    weights.update(out.get("weights") or {})
    server_key: dict[str, Any] = {}
    for name, direction in key.items():
        if direction != "text":
            server_key[name] = direction
        elif "_fts" not in server_key:
            server_key.update({"_fts": "text", "_ftsx": 1})
    out["key"] = server_key
    out["weights"] = {name: int(weights[name]) for name in sorted(weights)}
    out["default_language"] = out.get("default_language", "english")
    out["language_override"] = out.get("language_override", "language")
    out["textIndexVersion"] = out.get("textIndexVersion", 3)


def mongod_collection(listed: Mapping[str, Any]) -> dict[str, Any]:
    """One ``listCollections`` entry as mongod 7.0 reports it: views and time-series collections
    by their type, options with mongod's defaults, the ``_id`` index of a regular collection."""
    options = dict(listed.get("options") or {})
    info = dict(listed.get("info") or {"readOnly": False})
    kind = listed.get("type", "collection")
    if "viewOn" in options:
        kind, info["readOnly"] = "view", True
    elif isinstance(options.get("timeseries"), Mapping):
        kind = "timeseries"
        series = dict(options["timeseries"])
        if "bucketRoundingSeconds" not in series:
            series.setdefault("granularity", "seconds")
            series.setdefault("bucketMaxSpanSeconds",
                              _BUCKET_SPAN.get(series["granularity"], 3600))
        options["timeseries"] = series
    collation = full_collation(options.get("collation"))
    if collation is None:
        options.pop("collation", None)
    else:
        options["collation"] = collation
    out: dict[str, Any] = {"name": listed.get("name"), "type": kind}
    if "options" in listed:
        out["options"] = options
    if "info" in listed:
        out["info"] = info
    if kind == "collection" and "options" in listed:
        out["idIndex"] = dict(_ID_INDEX, **({"collation": collation} if collation else {}))
    for name, value in listed.items():
        out.setdefault(name, value)
    return out
