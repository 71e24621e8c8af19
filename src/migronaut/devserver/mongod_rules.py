"""What mongod refuses in the commands migronaut sends, as a pure checker.

The dev server (mongoeco) accepts commands a real ``mongod`` refuses — one ``$set`` stage naming
both ``plan`` and ``plan.at``, say — so a green test on it could hide code that can never run in
production. This module writes mongod's rules down once; two places apply them:

* the dev server (:mod:`migronaut.devserver.wire`) refuses a violating command with mongod's error
  code and message shape, so every client (pymongo, the Node driver, ``mongosh``) sees what it
  would see against ``mongod``;
* the test suite's wire audit (``tests/helpers/wire_audit.py``) checks every command the suite
  sends, whatever server it talks to.

Rules (each with mongod's code; the server floor is MongoDB 5.0):

===========================================================  =====================================
a pipeline ``$set``/``$addFields`` stage naming a path and    40176 (conflicting paths)
one of its sub-paths (``plan`` and ``plan.at``)
a ``$project``/``$unset`` stage naming a path and a sub-path  31249 / 31250 (path collision)
update operators touching one path twice, or a path and one   40 ConflictingUpdateOperators
of its sub-paths (``$set: {a}`` with ``$inc: {a.b}``)
a top-level key without ``$`` in an operator document, or an  9 FailedToParse ("Unknown modifier")
unknown ``$`` operator
an operator whose argument is not a document                  9 FailedToParse
an empty path or path component in an operator                56 EmptyFieldName
a ``$``-prefixed top-level name in a replacement document     52 DollarPrefixedFieldName
a replacement document with ``multi: true``                   9 FailedToParse
an update that is neither a document nor a pipeline           9 FailedToParse
a pipeline stage other than ``$set``/``$addFields``/          72 InvalidOptions
``$project``/``$unset``/``$replaceRoot``/``$replaceWith``
in an update
a ``$``-prefixed field name in a ``$set``/``$addFields``      16410
stage
``$$name`` for a variable nobody defined (a user value that   17276
needed ``$literal``)
``"$"`` alone as a field path                                 16872
an empty ``updates``/``documents``/``deletes`` batch          16 InvalidLength
===========================================================  =====================================

A violation is either the whole command's (``index`` is ``None``: mongod answers ``ok: 0``) or one
write statement's (``index`` set: mongod answers ``ok: 1`` with that statement in
``writeErrors``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "Violation",
    "check_batch_size",
    "check_command",
    "check_pipeline",
    "check_update",
]

CODE_NAMES: Final = {
    9: "FailedToParse",
    16: "InvalidLength",
    40: "ConflictingUpdateOperators",
    52: "DollarPrefixedFieldName",
    56: "EmptyFieldName",
    72: "InvalidOptions",
}

#: The update operators mongod knows (5.0+).
UPDATE_OPERATORS: Final = frozenset({
    "$set", "$unset", "$inc", "$mul", "$rename", "$setOnInsert", "$min", "$max",
    "$currentDate", "$push", "$addToSet", "$pop", "$pull", "$pullAll", "$bit",
})
#: The stages an update pipeline may hold.
UPDATE_STAGES: Final = frozenset({
    "$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith",
})
#: System variables (``$$NOW`` …) that need no ``$let``.
SYSTEM_VARIABLES: Final = frozenset({
    "NOW", "CLUSTER_TIME", "ROOT", "CURRENT", "REMOVE", "DESCEND", "PRUNE", "KEEP",
    "SEARCH_META", "USER_ROLES", "IS_MR", "JS_SCOPE",
})
_MAX_BATCH: Final = 100_000
_BATCHES: Final = {"update": "updates", "insert": "documents", "delete": "deletes"}


@dataclass(frozen=True)
class Violation:
    """One refusal: mongod's ``code`` and message; ``index`` names a write statement."""

    code: int
    message: str
    index: int | None = None

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, f"Location{self.code}")

    def __str__(self) -> str:
        where = "" if self.index is None else f" (statement {self.index})"
        return f"{self.code_name} ({self.code}){where}: {self.message}"


class _Refused(Exception):
    """Internal: the first rule a shape breaks (mongod stops at the first, too)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_command(command: Mapping[str, Any]) -> list[Violation]:
    """Every violation in one command document (its first key names the command)."""
    if not command:
        return []
    name = next(iter(command))
    batch = check_batch_size(command)
    if batch is not None:
        return [batch]
    if name == "update":
        found = []
        for index, statement in enumerate(command.get("updates") or []):
            if isinstance(statement, Mapping) and "u" in statement:
                problem = check_update(statement["u"], multi=bool(statement.get("multi")))
                if problem is not None:
                    found.append(Violation(problem.code, problem.message, index))
        return found
    if name.lower() == "findandmodify" and command.get("update") is not None:
        problem = check_update(command["update"])
        return [] if problem is None else [problem]
    if name == "aggregate" and isinstance(command.get("pipeline"), list):
        problem = check_pipeline(command["pipeline"])
        return [] if problem is None else [problem]
    return []


def check_batch_size(command: Mapping[str, Any]) -> Violation | None:
    """16: a write command's batch holds 1 to 100,000 statements."""
    name = next(iter(command), None)
    batch = command.get(_BATCHES[name]) if name in _BATCHES else None
    if isinstance(batch, list) and not 0 < len(batch) <= _MAX_BATCH:
        return Violation(16, f"Write batch sizes must be between 1 and {_MAX_BATCH}. "
                             f"Got {len(batch)} operations.")
    return None


def check_update(update: Any, *, multi: bool = False) -> Violation | None:
    """The first rule an update (operator document, replacement or pipeline) breaks."""
    try:
        if isinstance(update, list):
            _check_pipeline(update, in_update=True)
        elif isinstance(update, Mapping):
            if update and str(next(iter(update))).startswith("$"):
                _check_operators(update)
            else:
                _check_replacement(update, multi)
        else:
            raise _Refused(9, "Update argument must be either an object or an array")
    except _Refused as refused:
        return Violation(refused.code, refused.message)
    return None


def check_pipeline(pipeline: Sequence[Any]) -> Violation | None:
    """The first rule an aggregation pipeline's ``$set``/``$project``/… stages break."""
    try:
        _check_pipeline(pipeline, in_update=False)
    except _Refused as refused:
        return Violation(refused.code, refused.message)
    return None


# -- update operator documents -------------------------------------------------------------


def _check_operators(update: Mapping[str, Any]) -> None:
    seen: list[tuple[str, tuple[str, ...]]] = []
    for operator, argument in update.items():
        if operator not in UPDATE_OPERATORS:
            raise _Refused(9, f"Unknown modifier: {operator}. Expected a valid update modifier "
                              "or pipeline-style update specified as an array")
        if not isinstance(argument, Mapping):
            raise _Refused(9, f"Modifiers operate on fields but we found type "
                              f"{_bson_type(argument)} instead. For example: "
                              f"{{$mod: {{<field>: ...}}}} not {{{operator}: "
                              f"{_shown(argument)}}}")
        paths = list(argument)
        if operator == "$rename":
            paths += [target for target in argument.values() if isinstance(target, str)]
        for path in paths:
            parts = _update_path(str(path))
            for _, other in seen:
                shorter = min(len(parts), len(other))
                if parts[:shorter] == other[:shorter]:
                    raise _Refused(40, f"Updating the path '{path}' would create a conflict "
                                       f"at '{'.'.join(parts[:shorter])}'")
            seen.append((str(path), parts))


def _update_path(path: str) -> tuple[str, ...]:
    if not path:
        raise _Refused(56, "An empty update path is not valid.")
    parts = tuple(path.split("."))
    if "" in parts:
        raise _Refused(56, f"The update path '{path}' contains an empty field name, which is "
                           "not allowed.")
    return parts


def _check_replacement(update: Mapping[str, Any], multi: bool) -> None:
    for key in update:
        if str(key).startswith("$"):
            raise _Refused(52, f"The dollar ($) prefixed field '{key}' in '{key}' is not "
                               "allowed in the context of an update's replacement document. "
                               "Consider using an aggregation pipeline with $replaceWith.")
    if multi:
        raise _Refused(9, "multi update is not supported for replacement-style update")


# -- pipelines -------------------------------------------------------------------------------


def _check_pipeline(
    pipeline: Sequence[Any], *, in_update: bool, bound: frozenset[str] = frozenset()
) -> None:
    for stage in pipeline:
        if not isinstance(stage, Mapping) or len(stage) != 1:
            continue  # mongod refuses these too, and so does mongoeco (a parse error)
        name, spec = next(iter(stage.items()))
        if in_update and name not in UPDATE_STAGES:
            raise _Refused(72, f"{name} is not allowed to be used within an update")
        if name in ("$set", "$addFields") and isinstance(spec, Mapping):
            _check_add_fields(name, spec, bound)
        elif name == "$project" and isinstance(spec, Mapping):
            _check_projection(name, _projection_paths(spec))
            _check_expressions((v for v in spec.values() if not _is_flag(v)), bound)
        elif name == "$unset":
            paths = [spec] if isinstance(spec, str) else spec if isinstance(spec, list) else []
            _check_projection(name, [str(p) for p in paths])
        elif name in ("$replaceWith", "$replaceRoot"):
            _check_expression(spec, bound)
        elif name == "$facet" and isinstance(spec, Mapping):
            for sub in spec.values():
                if isinstance(sub, list):
                    _check_pipeline(sub, in_update=False, bound=bound)
        elif name in ("$lookup", "$unionWith") and isinstance(spec, Mapping):
            sub, let = spec.get("pipeline"), spec.get("let")
            if isinstance(sub, list):
                inner = bound | set(let) if isinstance(let, Mapping) else bound
                _check_pipeline(sub, in_update=False, bound=inner)


def _check_add_fields(stage: str, spec: Mapping[str, Any], bound: frozenset[str]) -> None:
    """40176: no path may be another's prefix (nested specs count as their leaf paths)."""
    seen: list[tuple[str, ...]] = []
    for path, value in _add_fields_leaves(spec, ()):
        for other in seen:
            shorter = min(len(path), len(other))
            if path[:shorter] == other[:shorter]:
                raise _Refused(40176, f"Invalid {stage} :: caused by :: specification contains "
                                      f"two conflicting paths. Cannot specify both "
                                      f"'{'.'.join(path)}' and '{'.'.join(other)}': "
                                      f"{_shown(dict(spec))}")
        seen.append(path)
        _check_expression(value, bound)


def _add_fields_leaves(
    spec: Mapping[str, Any], prefix: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], Any]]:
    for key, value in spec.items():
        key = str(key)
        if key.startswith("$"):
            raise _Refused(16410, f"FieldPath field names may not start with '$'. Consider "
                                  f"using $getField or $setField. (found '{key}')")
        if not key or "" in key.split("."):
            raise _Refused(40352, "FieldPath cannot be constructed with empty string")
        path = (*prefix, *key.split("."))
        if is_nested_spec(value):
            yield from _add_fields_leaves(value, path)
        else:
            yield path, value


def is_nested_spec(value: Any) -> bool:
    """A ``$set``/``$addFields`` value that mongod reads as sub-fields to merge into the
    existing object (``{"a": {"b": 1}}`` keeps ``a``'s other fields), not as an expression."""
    return isinstance(value, Mapping) and bool(value) and \
        not str(next(iter(value))).startswith("$")


def _projection_paths(spec: Mapping[str, Any]) -> list[str]:
    paths: list[str] = []

    def walk(sub: Mapping[str, Any], prefix: str) -> None:
        for key, value in sub.items():
            path = f"{prefix}{key}"
            if is_nested_spec(value):
                walk(value, path + ".")
            else:
                paths.append(path)

    walk(spec, "")
    return paths


def _check_projection(stage: str, paths: Iterable[str]) -> None:
    """31249 / 31250: a projection path and one of its sub-paths."""
    seen: list[tuple[str, ...]] = []
    for path in paths:
        parts = tuple(path.split("."))
        for other in seen:
            if parts[: len(other)] == other and len(parts) > len(other):
                rest = ".".join(parts[len(other):])
                raise _Refused(31249, f"Invalid {stage} :: caused by :: Path collision at "
                                      f"{path} remaining portion {rest}")
            if other[: len(parts)] == parts:
                raise _Refused(31250, f"Invalid {stage} :: caused by :: Path collision at "
                                      f"{path}")
        seen.append(parts)


def _is_flag(value: Any) -> bool:
    return isinstance(value, bool | int | float) or is_nested_spec(value)


# -- expressions: variables and field paths --------------------------------------------------


def _check_expressions(values: Iterable[Any], bound: frozenset[str]) -> None:
    for value in values:
        _check_expression(value, bound)


def _check_expression(value: Any, bound: frozenset[str]) -> None:
    if isinstance(value, str):
        _check_path_or_variable(value, bound)
    elif isinstance(value, list):
        _check_expressions(value, bound)
    elif isinstance(value, Mapping) and value:
        first = str(next(iter(value)))
        argument = value[first]
        if first == "$literal":
            return
        if first in ("$let", "$map", "$filter", "$reduce") and isinstance(argument, Mapping):
            _check_binding(first, argument, bound)
            return
        _check_expressions(value.values(), bound)


def _check_binding(operator: str, argument: Mapping[str, Any], bound: frozenset[str]) -> None:
    """``$let``/``$map``/``$filter``/``$reduce`` define variables for their inner expression."""
    if operator == "$let":
        names = argument.get("vars")
        names = names if isinstance(names, Mapping) else {}
        _check_expressions(names.values(), bound)
        _check_expression(argument.get("in"), bound | set(names))
        return
    if operator == "$reduce":
        _check_expressions([argument.get("input"), argument.get("initialValue")], bound)
        _check_expression(argument.get("in"), bound | {"value", "this"})
        return
    alias = argument.get("as")
    _check_expressions([argument.get("input"), argument.get("limit")], bound)
    inner = bound | {alias if isinstance(alias, str) else "this"}
    _check_expressions([argument.get("in"), argument.get("cond")], inner)


def _check_path_or_variable(text: str, bound: frozenset[str]) -> None:
    if text == "$":
        raise _Refused(16872, "'$' by itself is not a valid FieldPath")
    if text.startswith("$$"):
        name = text[2:].split(".", 1)[0]
        if name not in SYSTEM_VARIABLES and name not in bound:
            raise _Refused(17276, f"Use of undefined variable: {name}")


# -- message helpers -------------------------------------------------------------------------


def _bson_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
