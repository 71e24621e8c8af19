"""What a plan knows about a sharded collection: its metadata, the partitioning mode chosen,
and a document's shard-key values.

The plain shapes shared by the selection (:mod:`~migronaut.background.planning.sharding`), the shard
partitioner (:mod:`~migronaut.background.planning.shard_ranges`) and the lanes' key ranges, kept
apart so none of them imports another for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ShardFacts", "Sharding", "key_values", "plan_group_partitions", "plan_shard_key",
]


@dataclass(frozen=True)
class ShardFacts:
    """``config.collections`` and ``config.chunks`` of one sharded collection.

    ``chunks`` is ``None`` when they could not be read (or none were found).
    """

    key: dict[str, Any]
    uuid: Any
    chunks: list[dict[str, Any]] | None

    @property
    def epoch(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "key": self.key}


@dataclass(frozen=True)
class Sharding:
    """What a plan knows about the collection's sharding (reference §5 selection table).

    ``mode``: ``off`` (not sharded, or not looked at), ``untargeted`` (``_id`` ranges on a
    sharded collection; with ``key`` when it is known) or ``shard`` (the shard partitioner).
    """

    mode: Literal["off", "untargeted", "shard"]
    facts: ShardFacts | None = None
    index: list[tuple[str, Any]] | None = None

    @property
    def key(self) -> dict[str, Any] | None:
        return self.facts.key if self.facts is not None else None

    def record(self, method: str, groups: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The plan's ``sharding``: the Node original's fields (``mode``, ``key``, ``groups`` as a
        count), so either service's lanes understand a plan the other committed, plus Python's
        own (``hashed``, ``shardKey``, ``index``, partitions per shard in ``groupPartitions``)."""
        out: dict[str, Any] = {"mode": method if self.mode == "shard" else "untargeted"}
        key = self.key
        out["hashed"] = key is not None and "hashed" in key.values()
        if key is not None:
            out["key"] = dict(key)
            out["shardKey"] = dict(key)
        if self.index is not None:
            out["index"] = dict(self.index)
        if groups:
            out["groups"] = len(groups)
            out["groupPartitions"] = dict(groups)
        return out


def plan_shard_key(sharding: Mapping[str, Any]) -> dict[str, Any] | None:
    """The shard key a plan's ``sharding`` names: the original's ``key`` or Python's
    ``shardKey`` (plans committed by earlier Python versions carry only that)."""
    key = sharding.get("key") or sharding.get("shardKey")
    return dict(key) if isinstance(key, Mapping) and key else None


def plan_group_partitions(sharding: Mapping[str, Any]) -> dict[str, int]:
    """Partitions per shard of a plan's ``sharding`` (empty when only the original's count of
    groups is known): ``groupPartitions``, or ``groups`` as earlier Python versions wrote it."""
    groups = sharding.get("groupPartitions")
    if not isinstance(groups, Mapping):
        groups = sharding.get("groups")
    return {str(k): int(v) for k, v in groups.items()} if isinstance(groups, Mapping) else {}


def key_values(doc: Mapping[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """The document's shard-key values by (dotted) field; a missing one is ``None`` — the
    index keys it as null, and a missing shard-key field lives in the null chunk."""
    values: dict[str, Any] = {}
    for dotted in fields:
        value: Any = doc
        for part in dotted.split("."):
            if not isinstance(value, Mapping) or part not in value:
                value = None
                break
            value = value[part]
        values[dotted] = value
    return values
