"""What a plan knows about a sharded collection: its metadata, the partitioning mode chosen,
and a document's shard-key values.

The plain shapes shared by the selection (:mod:`~migronaut.background.sharding`), the shard
partitioner (:mod:`~migronaut.background.shard_planner`) and the lanes' key ranges, kept apart so
none of them imports another for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ShardFacts", "Sharding", "key_values"]


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
        """The plan's ``sharding`` (what status shows, and what lanes read the key from)."""
        out: dict[str, Any] = {"mode": method if self.mode == "shard" else "untargeted"}
        key = self.key
        out["hashed"] = key is not None and "hashed" in key.values()
        if key is not None:
            out["shardKey"] = dict(key)
        if self.index is not None:
            out["index"] = dict(self.index)
        if groups:
            out["groups"] = dict(groups)
        return out


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
