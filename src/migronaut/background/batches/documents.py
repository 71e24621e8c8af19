"""The documents a declarative migration rewrites, as its batches see them.

:class:`Documents` resolves the pinned spec once per slice: the version field and the versions
the lane moves documents from and to, the match (less the known bad ids), the transform for the
direction, the collection handles (decoded, raw for transactional size cuts, with the write
concern for writes) and the shard key every guarded write carries. Reading
(:mod:`.reading`) and updating (:mod:`.updates`) share it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bson.raw_bson import RawBSONDocument

from migronaut.background.lanes.diff import stamper
from migronaut.background.lanes.key_ranges import KeyRanges
from migronaut.background.planning.shard_facts import plan_shard_key
from migronaut.background.planning.sharding import sharded_version_index
from migronaut.errors import MigrationExecutionFailedError

if TYPE_CHECKING:
    from bson.codec_options import CodecOptions
    from pymongo.collection import Collection

    from migronaut.background.lanes.turn import LaneState

__all__ = ["Documents", "at_version", "id_key"]


class Documents:
    """The declarative spec resolved for one slice (``MIGRATION_EXECUTION_FAILED`` when the
    migration has no transform for its direction)."""

    def __init__(self, lane: LaneState, partitioner: str, sharding: Mapping[str, Any]) -> None:
        from pymongo import WriteConcern

        spec = lane.spec
        self.field: str = spec["field"]
        self.revision_field: str | None = spec.get("revisionField")
        self.occ: str = spec.get("occ", "revision")
        forward = lane.direction == "forward"
        self.source = int(spec["from"] if forward else spec["to"])
        self.target = int(spec["to"] if forward else spec["from"])
        self.match: dict[str, Any] = lane.job.match(lane.state_bad_ids or None)
        self.stamp = stamper(self.field, self.revision_field, self.target)
        transform, batched = lane.job.functions.transform(lane.direction)
        if transform is None:
            raise MigrationExecutionFailedError(
                f"Background migration {lane.name} has no transform for direction "
                f"{lane.direction}",
                {"migration": lane.name, "direction": lane.direction},
            )
        self.transform: Callable[..., Any] = transform
        self.batched = batched
        base = lane.db[spec["collection"]]
        options = lane.db.codec_options
        self.decode_options: CodecOptions[dict[str, Any]] = options.with_options(
            document_class=dict)
        raw_options: CodecOptions[RawBSONDocument] = options.with_options(
            document_class=RawBSONDocument)
        self.coll: Collection[dict[str, Any]] = base.with_options(
            codec_options=self.decode_options)
        self.raw_coll: Collection[RawBSONDocument] = base.with_options(
            codec_options=raw_options
        )
        self.write_coll: Collection[dict[str, Any]] = base.with_options(
            write_concern=WriteConcern(**dict(spec.get("writeConcern") or {"w": "majority"}))
        )
        key = plan_shard_key(sharding)
        #: shard-key fields: added to every guarded write, and guarded against changes
        self.shard_fields: list[str] = list(key) if key else []
        self.key_ranges: KeyRanges | None = None
        if partitioner == "shard" and key:
            # a plan the Node original committed names no index: it reads the same one
            index = sharding.get("index") or dict(sharded_version_index(self.field, key))
            self.key_ranges = KeyRanges(key, index, self.field, self.source, self.match)

    def key_range(self, scope: Mapping[str, Any]) -> bool:
        """Whether a partition of ``scope`` is read by shard-key range (else by ``_id``)."""
        return self.key_ranges is not None and scope.get("kind") == "key-range"


def at_version(value: Any, version: int) -> bool:
    """Whether a stored version equals ``version`` (0 = missing, null or 0)."""
    if type(value) is bool:
        return False
    if version == 0:
        return value is None or value == 0
    return bool(value == version)


def id_key(value: Any) -> str:
    """An ``_id`` as a dictionary key that keeps its type (``1`` and ``'1'`` differ)."""
    return f"{type(value).__name__}:{value!r}"
