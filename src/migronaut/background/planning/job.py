"""A background migration as a worker runs it: the file's functions under the pinned spec.

Invariant: a worker never runs code other than the version pinned at registration — the file's
checksum must equal the state's ``checksum`` (a rolling deploy in progress makes workers wait,
never run the wrong code). The effective spec is the file's overlaid by the stored one (the stored
spec wins), so tuning changes take effect only through ``repin``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from migronaut.background.planning.spec import ResolvedBackground, match_filter, resolve_background
from migronaut.core.files import (
    checksum_bytes,
    left_while_loading,
    load_migration_module,
    load_module,
    resolve_file,
)
from migronaut.errors import (
    ChecksumMismatchError,
    MigrationInvalidExportError,
)

__all__ = ["BackgroundJob", "is_background_file", "load_job", "read_background"]


@dataclass(frozen=True)
class BackgroundJob:
    """What lanes and the coordinator need: name, pinned spec, the functions, the match."""

    name: str
    path: Path
    checksum: str
    resolved: ResolvedBackground
    spec: Mapping[str, Any]
    direction: str
    description: str | None = None
    requires: tuple[str, ...] = ()

    @property
    def functions(self) -> Any:
        return self.resolved.functions

    @property
    def mode(self) -> str:
        return str(self.spec["mode"])

    def match(self, bad_ids: list[Any] | None = None) -> dict[str, Any]:
        """The documents still to migrate: the spec's match minus known failed ids."""
        base = match_filter(dict(self.spec), self.direction)
        if bad_ids:
            return {"$and": [base, {"_id": {"$nin": list(bad_ids)}}]}
        return base


def read_background(module: ModuleType) -> Any:
    return getattr(module, "background", None)


def is_background_file(path: Path) -> bool:
    """Whether a migration file declares ``background`` (loads the module)."""
    try:
        module = load_module(path)
    except BaseException as error:  # a broken file is reported by whoever loads it for real
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            left = left_while_loading(error, path)
            if left is None:
                raise
            raise left from error
        return False
    return read_background(module) is not None


def load_job(
    directory: Path,
    name: str,
    *,
    state: Mapping[str, Any] | None = None,
    reserved_collections: tuple[str, ...] = (),
    reload: bool = False,
    strict_checksum: bool = True,
) -> BackgroundJob:
    """Load a background migration file and check it against the pinned state.

    ``strict_checksum`` raises ``CHECKSUM_MISMATCH`` when the file differs from the state's
    pinned checksum; a missing file is ``MIGRATION_FILE_NOT_FOUND``.
    """
    path = resolve_file(directory, name)
    checksum = checksum_bytes(path.read_bytes())
    if state is not None and strict_checksum and state.get("checksum") != checksum:
        raise ChecksumMismatchError(
            f"Background migration {name} changed on disk since it was registered "
            "(a deploy in progress? repin it to adopt the change)",
            {"name": name, "expected": state.get("checksum"), "actual": checksum},
        )
    module = load_migration_module(path, reload=reload)
    declared = read_background(module)
    if declared is None:
        raise MigrationInvalidExportError(
            f"{name} is not a background migration (it defines no `background`)",
            {"filepath": str(path)},
        )
    resolved = resolve_background(name, declared, reserved_collections=reserved_collections)
    spec: dict[str, Any] = dict(resolved.spec)
    if state is not None and state.get("spec"):
        spec.update(state["spec"])
    direction = str(state.get("direction", "forward")) if state is not None else "forward"
    description = getattr(module, "description", None)
    requires = tuple(getattr(module, "requires", ()) or ())
    return BackgroundJob(
        name=name,
        path=path,
        checksum=checksum,
        resolved=resolved,
        spec=spec,
        direction=direction,
        description=description if isinstance(description, str) else None,
        requires=requires,
    )
