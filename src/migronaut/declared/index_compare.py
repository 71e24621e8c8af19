"""How a declared index compares with a listed one, by the server's rules (reference §2.4.4).

Invariant: a declared index compares equal to what the server lists for it after creating it —
whatever the server fills in on its own (collation fields, text weights at 1, text language
defaults, ``textIndexVersion``, ``2dsphereIndexVersion``, 2d ``bits``) is either compared with
the same default on the declared side or compared only when declared. A difference is changed
in place only when every difference can be (``hidden``, TTL, becoming unique on 7.0+).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from migronaut.declared.canonical import UNIVERSAL_COLLATION_DEFAULTS, same
from migronaut.declared.indexes import DECLARED_ONLY_OPTIONS, DeclaredIndex, KeyPairs
from migronaut.declared.live import LiveIndex, ServerCapabilities

__all__ = ["IndexComparison", "collation_matches", "collides", "compare_index", "same_key"]

_TEXT_DEFAULTS = {"default_language": "english", "language_override": "language"}


@dataclass(frozen=True)
class IndexComparison:
    """The differences (diff names in the reference's order) and, when every one of them can be
    changed in place, the ``collMod`` index fields that do it (``unique`` via ``prepareUnique``)."""

    diffs: tuple[str, ...] = ()
    in_place: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rebuild(self) -> bool:
        return bool(self.diffs) and not self.in_place

    @property
    def reason(self) -> str:
        return ", ".join(self.diffs)


def same_key(declared: KeyPairs, live: KeyPairs) -> bool:
    """Same server key: same fields in the same order; numbers by sign, strings exactly."""
    if len(declared) != len(live):
        return False
    for (name, direction), (live_name, live_direction) in zip(declared, live, strict=True):
        if name != live_name:
            return False
        if isinstance(direction, str) or isinstance(live_direction, str):
            if direction != live_direction:
                return False
        elif (direction < 0) != (live_direction < 0):
            return False
    return True


def collation_matches(declared: Mapping[str, Any] | None, live: Mapping[str, Any] | None,
                      default: Mapping[str, Any] | None) -> bool:
    """Whether the live index has the collation the declaration gets on this collection."""
    if declared is None:
        return live is None if default is None else live is not None and same(live, default)
    if declared.get("locale") == "simple":
        return live is None
    if live is None:
        return False
    filled = {**UNIVERSAL_COLLATION_DEFAULTS, **declared}
    for name, value in filled.items():
        live_value = live.get(name, UNIVERSAL_COLLATION_DEFAULTS.get(name))
        if not same(value, live_value):
            return False
    return True


def collides(declared: DeclaredIndex, live: LiveIndex,
             default_collation: Mapping[str, Any] | None) -> bool:
    """The server would refuse both side by side: same key, partial filter and collation — or
    both are text indexes (a collection holds one)."""
    if declared.is_text and live.is_text:
        return True
    return (same_key(declared.server_key, live.key)
            and same(declared.options.get("partialFilterExpression"),
                     live.options.get("partialFilterExpression"))
            and collation_matches(declared.options.get("collation"),
                                  live.options.get("collation"), default_collation))


def _text_weights(index: DeclaredIndex) -> dict[str, Any]:
    weights: dict[str, Any] = {name: 1 for name, direction in index.key if direction == "text"}
    weights.update(index.options.get("weights") or {})
    return weights


def compare_index(declared: DeclaredIndex, live: LiveIndex,
                  default_collation: Mapping[str, Any] | None,
                  capabilities: ServerCapabilities) -> IndexComparison:
    """Compare one declared index with the live index of the same name (or a blocker)."""
    want, have = declared.options, live.options
    diffs: list[str] = []
    in_place: dict[str, Any] = {}
    rebuild = False

    def differs(name: str, changeable: bool, value: Any = None) -> None:
        nonlocal rebuild
        diffs.append(name)
        if changeable:
            in_place[name] = value
        else:
            rebuild = True

    if not same_key(declared.server_key, live.key):
        differs("key", False)
    if bool(want.get("unique")) != bool(have.get("unique")):
        differs("unique", bool(want.get("unique")) and capabilities.can_make_unique, True)
    if bool(want.get("sparse")) != bool(have.get("sparse")):
        differs("sparse", False)
    if bool(want.get("hidden")) != bool(have.get("hidden")):
        differs("hidden", True, bool(want.get("hidden")))
    ttl, live_ttl = want.get("expireAfterSeconds"), have.get("expireAfterSeconds")
    if ttl is not None and live_ttl is not None:
        if ttl != live_ttl:
            differs("expireAfterSeconds", True, ttl)
    elif ttl is not None:
        differs("expireAfterSeconds", capabilities.can_add_ttl and len(declared.key) == 1
                and not declared.is_text, ttl)
    elif live_ttl is not None:
        differs("expireAfterSeconds", False)
    for option in ("partialFilterExpression", "wildcardProjection"):
        if not same(want.get(option), have.get(option)):
            differs(option, False)
    if not collation_matches(want.get("collation"), have.get("collation"), default_collation):
        differs("collation", False)
    if declared.is_text:
        if not same(_text_weights(declared), have.get("weights")):
            differs("weights", False)
        for option, default in _TEXT_DEFAULTS.items():
            if want.get(option, default) != have.get(option, default):
                differs(option, False)
    for option in DECLARED_ONLY_OPTIONS:
        if option in want and not same(want[option], have.get(option)):
            differs(option, False)
    return IndexComparison(diffs=tuple(diffs), in_place={} if rebuild else in_place)
