"""``requires`` between background migrations: what a requirement's status is, and unblocking.

Invariant: a migration leaves ``blocked`` only when every requirement is ``completed`` (or its
record was adopted: imported or baselined), by one compare-and-set move; a reverted requirement
counts as not done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut.core.plan import FORWARD_ONLY_ORIGINS

if TYPE_CHECKING:
    from migronaut.background.coordination.handles import EngineHandles

__all__ = ["Requirements"]


class Requirements:
    """Reads and resolves the ``requires`` of one database's background migrations."""

    def __init__(self, handles: EngineHandles) -> None:
        self._h = handles

    def requirement_status(self, required: str, changelog: Any = None) -> str:
        state = self._h.store.get(required, {"status": 1, "direction": 1})
        if state is None:
            record = changelog.get(required) if changelog is not None else None
            if record and record.get("origin") in FORWARD_ONLY_ORIGINS:  # imported/baselined
                return "adopted"
            return "unregistered"
        if state.get("direction") == "revert":
            return "reverted"
        return str(state["status"])

    def unmet(self, requires: Sequence[str], changelog: Any = None) -> list[dict[str, str]]:
        waiting = []
        for required in requires:
            status = self.requirement_status(required, changelog)
            if status not in ("completed", "adopted"):
                waiting.append({"migration": required, "status": status})
        return waiting

    def try_unblock(self, state: Mapping[str, Any]) -> dict[str, Any]:
        store = self._h.store
        name = state["_id"]
        waiting = [w["migration"] for w in self.unmet(state.get("requires") or [])]
        if waiting:
            if waiting != list(state.get("waitsFor") or []):
                store.update_state(name, {"status": "blocked"}, {"waitsFor": waiting})
            return {**state, "waitsFor": waiting}
        moved = store.move(name, "unblock", set_fields={"waitsFor": []})
        if moved is not None:
            self._h.emit("background:unblocked", {"migration": name})
            return moved
        return store.require(name)

    def on_completed(self, name: str) -> None:
        """A forward migration completed: unblock the migrations waiting for it."""
        for state in self._h.store.all(["blocked"]):
            if name in (state.get("requires") or []):
                self.try_unblock(state)
