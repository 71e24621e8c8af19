"""migronaut — MongoDB migrations with a changelog, an atomic cluster-wide lock, checksums,
rollbacks, dry runs, hooks and transactions.

The public surface is what this module exports; everything else is internal. Heavy imports
(pymongo) happen on first use, so ``import migronaut`` and ``migronaut --help`` stay fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from migronaut._version import __version__
from migronaut.errors import (
    EXIT_CODES,
    BackgroundConflictError,
    BackgroundFailedError,
    BackgroundPendingError,
    ChecksumMismatchError,
    ConfigFileExistsError,
    ConfigInvalidError,
    ConnectionFailedError,
    ConvergeFailedError,
    FleetInvalidError,
    FleetPartialError,
    HookFailedError,
    ImportTargetNotEmptyError,
    IrreversibleMigrationError,
    LockAlreadyHeldError,
    LockLostError,
    LockReleaseFailedError,
    MigrationBlockedError,
    MigrationExecutionFailedError,
    MigrationFileExistsError,
    MigrationFileNotFoundError,
    MigrationInDoubtError,
    MigrationInvalidExportError,
    MigrationInvalidNameError,
    MigrationTimeoutError,
    MigronautError,
    NotAppliedError,
    OutOfOrderMigrationError,
    QueueJobFailedError,
    QueueJobInvalidError,
    RevisionConflictError,
    RunAbortedError,
    SandboxRefusedError,
    ShapeVersionError,
    StateInvalidError,
    TransactionsUnsupportedError,
)

if TYPE_CHECKING:
    from migronaut.aio import AsyncMigrator, arun_migrations
    from migronaut.api import Migrator, ProgressReporter, pending_migrations, run_migrations
    from migronaut.background.runner import BackgroundRunner
    from migronaut.core.config import Config, load_config
    from migronaut.core.context import Cancellation, MigrationContext, RunInfo
    from migronaut.core.hooks import Hooks
    from migronaut.core.results import (
        AuditCheck,
        AuditReport,
        BaselineResult,
        ImportResult,
        ImportRow,
        LockInfo,
        LockStatus,
        MigrationSummary,
        RunResult,
        StatusRow,
    )
    from migronaut.fleet.api import AsyncFleet, Fleet
    from migronaut.fleet.runner import FleetResult
    from migronaut.fleet.status import FleetStatus, TenantStatus

__all__ = [
    "EXIT_CODES",
    "AsyncFleet",
    "AsyncMigrator",
    "AuditCheck",
    "AuditReport",
    "BackgroundConflictError",
    "BackgroundFailedError",
    "BackgroundPendingError",
    "BackgroundRunner",
    "BaselineResult",
    "Cancellation",
    "ChecksumMismatchError",
    "Config",
    "ConfigFileExistsError",
    "ConfigInvalidError",
    "ConnectionFailedError",
    "ConvergeFailedError",
    "Fleet",
    "FleetInvalidError",
    "FleetPartialError",
    "FleetResult",
    "FleetStatus",
    "HookFailedError",
    "Hooks",
    "ImportResult",
    "ImportRow",
    "ImportTargetNotEmptyError",
    "IrreversibleMigrationError",
    "LockAlreadyHeldError",
    "LockInfo",
    "LockLostError",
    "LockReleaseFailedError",
    "LockStatus",
    "MigrationBlockedError",
    "MigrationContext",
    "MigrationExecutionFailedError",
    "MigrationFileExistsError",
    "MigrationFileNotFoundError",
    "MigrationInDoubtError",
    "MigrationInvalidExportError",
    "MigrationInvalidNameError",
    "MigrationSummary",
    "MigrationTimeoutError",
    "Migrator",
    "MigronautError",
    "NotAppliedError",
    "OutOfOrderMigrationError",
    "ProgressReporter",
    "QueueJobFailedError",
    "QueueJobInvalidError",
    "RevisionConflictError",
    "RunAbortedError",
    "RunInfo",
    "RunResult",
    "SandboxRefusedError",
    "ShapeVersionError",
    "StateInvalidError",
    "StatusRow",
    "TenantStatus",
    "TransactionsUnsupportedError",
    "__version__",
    "arun_migrations",
    "load_config",
    "pending_migrations",
    "run_migrations",
]

_LAZY = {
    "AsyncMigrator": "migronaut.aio",
    "arun_migrations": "migronaut.aio",
    "BackgroundRunner": "migronaut.background.runner",
    "Migrator": "migronaut.api",
    "ProgressReporter": "migronaut.api",
    "pending_migrations": "migronaut.api",
    "run_migrations": "migronaut.api",
    "Config": "migronaut.core.config",
    "load_config": "migronaut.core.config",
    "Cancellation": "migronaut.core.context",
    "MigrationContext": "migronaut.core.context",
    "RunInfo": "migronaut.core.context",
    "Hooks": "migronaut.core.hooks",
    "BaselineResult": "migronaut.core.results",
    "ImportResult": "migronaut.core.results",
    "ImportRow": "migronaut.core.results",
    "AuditCheck": "migronaut.core.results",
    "AuditReport": "migronaut.core.results",
    "LockInfo": "migronaut.core.results",
    "LockStatus": "migronaut.core.results",
    "MigrationSummary": "migronaut.core.results",
    "RunResult": "migronaut.core.results",
    "StatusRow": "migronaut.core.results",
    "Fleet": "migronaut.fleet.api",
    "AsyncFleet": "migronaut.fleet.api",
    "FleetResult": "migronaut.fleet.runner",
    "FleetStatus": "migronaut.fleet.status",
    "TenantStatus": "migronaut.fleet.status",
}


def _lazy_exports(
    package: str, names: Mapping[str, str], namespace: dict[str, Any], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__``/``__dir__`` of ``package`` (here and ``migronaut.testing``):
    ``names`` maps a public name to its module; the value is cached in ``namespace`` — imports
    stay cheap (the CLI's start-up budget) while the curated names live on the package."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(public)

    return __getattr__, __dir__


__getattr__, __dir__ = _lazy_exports("migronaut", _LAZY, globals(), __all__)
