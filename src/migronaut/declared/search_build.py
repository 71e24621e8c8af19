"""The state of a search index build, and which declared ones are not serving yet
(reference collections §7.7), plus how a wait classifies its targets (§7.8).

Builds never count against ``inSync``: the server builds in the background, and a converge that
waited on them in its sync check would loop. They are reported in ``result.search.notReady``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from migronaut.declared.plan import CollectionPlan

__all__ = ["WaitTarget", "build_state", "classify_wait", "not_ready", "search_summary"]

_REMOVING = ("DELETING", "DOES_NOT_EXIST")
_SERVING = ("READY", "UNKNOWN")
_TRACKED = ("create", "modify", "unchanged")


def build_state(build: Mapping[str, Any] | None) -> str:
    """One word: ``failed``, ``stale``, ``removing``, ``building``, ``updating``, ``serving``.
    No build at all (not listed yet) is ``building``."""
    if not build:
        return "building"
    status = str(build.get("status") or "UNKNOWN")
    if status == "FAILED":
        return "failed"
    if status == "STALE":
        return "stale"
    if status in _REMOVING:
        return "removing"
    if build.get("queryable") is not True or status not in _SERVING:
        return "building"
    return "updating" if build.get("updating") else "serving"


def _entry(collection: str, name: str, build: Mapping[str, Any] | None) -> dict[str, Any]:
    build = build or {}
    entry: dict[str, Any] = {"collection": collection, "name": name,
                             "status": str(build.get("status") or "UNKNOWN"),
                             "queryable": build.get("queryable") is True}
    if build.get("message"):
        entry["message"] = build["message"]
    if build.get("updating"):
        entry["updating"] = True
    return entry


def not_ready(plans: Sequence[CollectionPlan]) -> list[dict[str, Any]]:
    """Declared search indexes with a create/modify/unchanged row whose build is not serving."""
    return [_entry(plan.name, row.name, row.build) for plan in plans for row in plan.actions
            if row.target == "searchIndex" and row.action in _TRACKED
            and build_state(row.build) != "serving"]


def search_summary(plans: Sequence[CollectionPlan], *, available: bool,
                   evidence: str | None, wait: Mapping[str, Any] | None = None
                   ) -> dict[str, Any]:
    """``result.search``: ``{available, evidence?, notReady, wait?}``."""
    out: dict[str, Any] = {"available": available}
    if evidence:
        out["evidence"] = evidence
    out["notReady"] = not_ready(plans) if available else []
    if wait is not None:
        out["wait"] = dict(wait)
    return out


@dataclass(frozen=True)
class WaitTarget:
    """A declared search index a wait watches: ``touched`` when converge created or updated
    it (then ``since_version``, when known, must be exceeded)."""

    collection: str
    name: str
    touched: bool
    since_version: int | None = None


def _ready(target: WaitTarget, listed: Mapping[str, Any] | None, version: int | None) -> bool:
    if build_state(listed) != "serving":
        return False
    return target.since_version is None or version is None or version > target.since_version


def classify_wait(targets: Sequence[WaitTarget],
                  builds: Mapping[tuple[str, str], tuple[Mapping[str, Any], int | None]]
                  ) -> tuple[str | None, list[WaitTarget], list[WaitTarget]]:
    """``(outcome, waiting, preexisting)`` after one poll: outcome ``failed`` (a touched
    target FAILED), ``ready`` (every held target ready) or ``None`` (keep waiting).
    ``builds`` maps ``(collection, name)`` to the listed ``(build, version)``. An untouched
    FAILED or STALE target is ``preexisting``: reported, never holding the wait."""
    waiting: list[WaitTarget] = []
    preexisting: list[WaitTarget] = []
    failed = False
    for target in targets:
        build, version = builds.get((target.collection, target.name), ({}, None))
        state = build_state(build) if build else "building"
        if not target.touched and state in ("failed", "stale"):
            preexisting.append(target)
        elif state == "failed":
            failed = True
            waiting.append(target)
        elif not _ready(target, build or None, version):
            waiting.append(target)
    if failed:
        return "failed", waiting, preexisting
    return ("ready" if not waiting else None), waiting, preexisting
