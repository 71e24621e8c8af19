"""The one exception tree of migronaut, with the error codes and exit codes of the Node original.

Every error raised from migronaut code is a :class:`MigronautError`. It carries a stable ``code``
(the anchor of its section in <https://migronaut.readthedocs.io/en/latest/errors/>), the CLI
``exit_code``, a JSON-safe ``context`` whose strings are redacted of credentials, and the wrapped
original exception as ``__cause__``::

    MigronautError
    ├── LockAlreadyHeldError           LOCK_ALREADY_HELD            3
    ├── ChecksumMismatchError          CHECKSUM_MISMATCH            4
    ├── ConnectionFailedError          CONNECTION_FAILED            5
    ├── ConfigInvalidError             CONFIG_INVALID               6
    │   └── ExtraMissingError          (an optional extra is not installed; also ImportError)
    ├── MigrationExecutionFailedError  MIGRATION_EXECUTION_FAILED   7
    ├── MigrationFileNotFoundError     MIGRATION_FILE_NOT_FOUND     8
    ├── NotAppliedError                NOT_APPLIED                  9
    ├── LockLostError                  LOCK_LOST                   10
    ├── RunAbortedError                RUN_ABORTED                 11
    ├── HookFailedError                HOOK_FAILED                 12
    ├── IrreversibleMigrationError     MIGRATION_IRREVERSIBLE      13
    ├── MigrationTimeoutError          MIGRATION_TIMEOUT           14
    ├── TransactionsUnsupportedError   TRANSACTIONS_UNSUPPORTED    15
    ├── ConfigFileExistsError          CONFIG_FILE_EXISTS          16
    ├── ImportTargetNotEmptyError      IMPORT_TARGET_NOT_EMPTY     17
    ├── MigrationFileExistsError       MIGRATION_FILE_EXISTS       18
    ├── MigrationInvalidNameError      MIGRATION_INVALID_NAME      19
    ├── MigrationInvalidExportError    MIGRATION_INVALID_EXPORT    20
    ├── LockReleaseFailedError         LOCK_RELEASE_FAILED         21
    ├── AuditFailedError               AUDIT_FAILED                22
    ├── OutOfOrderMigrationError       MIGRATION_OUT_OF_ORDER      23
    ├── MigrationBlockedError          MIGRATION_BLOCKED           24
    ├── QueueJobInvalidError           QUEUE_JOB_INVALID           25
    ├── QueueJobFailedError            QUEUE_JOB_FAILED            26
    ├── ConvergeFailedError            CONVERGE_FAILED             27
    ├── RevisionConflictError          REVISION_CONFLICT           29
    ├── ShapeVersionError              SHAPE_VERSION_UNSUPPORTED   30
    ├── BackgroundPendingError         BACKGROUND_PENDING          31
    ├── BackgroundFailedError          BACKGROUND_FAILED           32
    ├── BackgroundConflictError        BACKGROUND_CONFLICT         33
    ├── SandboxRefusedError            SANDBOX_REFUSED             34
    ├── StateInvalidError              STATE_INVALID               35
    ├── MigrationInDoubtError          MIGRATION_IN_DOUBT          36
    ├── FleetInvalidError              FLEET_INVALID               37
    └── FleetPartialError              FLEET_PARTIAL               38

``STATE_INVALID`` and ``MIGRATION_IN_DOUBT`` are ours, not the original's. ``STATE_INVALID``:
stored state migronaut did not write or does not understand (a changelog record with an unknown
status, two records for one migration, …). No code of the original means "we cannot read what
is stored", and none of them may stand for it: fail closed, never "pending".
``MIGRATION_IN_DOUBT``: a migration whose run ended without recording whether its body finished;
only an operator can say (``migronaut resolve``). ``FLEET_INVALID``: a fleet's tenants cannot be
resolved (a bad name, a source matching nothing, a registry document or a callable returning
junk), refused before any tenant runs; ``FLEET_PARTIAL``: a fleet run or ``fleet status --check``
where some tenants did not succeed (each tenant's own error is in the result).

Exit code ``2`` (``PENDING_MIGRATIONS``) is a CLI condition of ``status --check``, and ``28``
(``COLLECTIONS_DRIFT``) one of ``converge --check``, not error classes; anything that is not a
migronaut error exits ``1``; a second SIGINT/SIGTERM exits 130/143.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from migronaut._redact import redact, redact_value

__all__ = [
    "EXIT_CODES",
    "AuditFailedError",
    "BackgroundConflictError",
    "BackgroundFailedError",
    "BackgroundPendingError",
    "ChecksumMismatchError",
    "ConfigFileExistsError",
    "ConfigInvalidError",
    "ConnectionFailedError",
    "ConvergeFailedError",
    "ExtraMissingError",
    "FleetInvalidError",
    "FleetPartialError",
    "HookFailedError",
    "ImportTargetNotEmptyError",
    "IrreversibleMigrationError",
    "LockAlreadyHeldError",
    "LockLostError",
    "LockReleaseFailedError",
    "MigrationBlockedError",
    "MigrationExecutionFailedError",
    "MigrationFileExistsError",
    "MigrationFileNotFoundError",
    "MigrationInDoubtError",
    "MigrationInvalidExportError",
    "MigrationInvalidNameError",
    "MigrationTimeoutError",
    "MigronautError",
    "NotAppliedError",
    "OutOfOrderMigrationError",
    "QueueJobFailedError",
    "QueueJobInvalidError",
    "RevisionConflictError",
    "RunAbortedError",
    "SandboxRefusedError",
    "ShapeVersionError",
    "StateInvalidError",
    "TransactionsUnsupportedError",
]

#: Exit code per error code, as the CLI uses them (reference core §2.4).
EXIT_CODES: Mapping[str, int] = MappingProxyType(
    {
        "PENDING_MIGRATIONS": 2,
        "LOCK_ALREADY_HELD": 3,
        "CHECKSUM_MISMATCH": 4,
        "CONNECTION_FAILED": 5,
        "CONFIG_INVALID": 6,
        "MIGRATION_EXECUTION_FAILED": 7,
        "MIGRATION_FILE_NOT_FOUND": 8,
        "NOT_APPLIED": 9,
        "LOCK_LOST": 10,
        "RUN_ABORTED": 11,
        "HOOK_FAILED": 12,
        "MIGRATION_IRREVERSIBLE": 13,
        "MIGRATION_TIMEOUT": 14,
        "TRANSACTIONS_UNSUPPORTED": 15,
        "CONFIG_FILE_EXISTS": 16,
        "IMPORT_TARGET_NOT_EMPTY": 17,
        "MIGRATION_FILE_EXISTS": 18,
        "MIGRATION_INVALID_NAME": 19,
        "MIGRATION_INVALID_EXPORT": 20,
        "LOCK_RELEASE_FAILED": 21,
        "AUDIT_FAILED": 22,
        "MIGRATION_OUT_OF_ORDER": 23,
        "MIGRATION_BLOCKED": 24,
        "QUEUE_JOB_INVALID": 25,
        "QUEUE_JOB_FAILED": 26,
        "CONVERGE_FAILED": 27,
        "COLLECTIONS_DRIFT": 28,
        "REVISION_CONFLICT": 29,
        "SHAPE_VERSION_UNSUPPORTED": 30,
        "BACKGROUND_PENDING": 31,
        "BACKGROUND_FAILED": 32,
        "BACKGROUND_CONFLICT": 33,
        "SANDBOX_REFUSED": 34,
        "STATE_INVALID": 35,
        "MIGRATION_IN_DOUBT": 36,
        "FLEET_INVALID": 37,
        "FLEET_PARTIAL": 38,
    }
)


class MigronautError(Exception):
    """Base of every error migronaut raises; ``code`` and ``exit_code`` are stable."""

    code: ClassVar[str] = "MIGRONAUT_ERROR"

    def __init__(
        self,
        message: str,
        context: Mapping[str, Any] | None = None,
        *,
        cause: BaseException | None = None,
    ) -> None:
        self.message = redact(message)
        ctx = dict(context or {})
        if cause is not None and "cause" not in ctx:
            ctx["cause"] = describe_exception(cause)
        self.context: dict[str, Any] = redact_value(ctx)
        super().__init__(self.message)
        if cause is not None:
            self.__cause__ = cause

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.code, 1)

    def to_dict(self, *, include_results: bool = False) -> dict[str, Any]:
        """The ``error`` member of the JSON envelope (reference core §2.3)."""
        context = {
            k: v for k, v in self.context.items() if include_results or k != "results"
        }
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if context:
            out["context"] = context
        return out


def describe_exception(error: BaseException) -> str:
    """A one-line, redacted description of a foreign exception (for ``context.cause``)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, MigronautError):
        return redact(text)
    return redact(f"{type(error).__name__}: {text}" if text != type(error).__name__ else text)


def server_message(error: BaseException) -> str:
    """A driver error's own message: the server's ``errmsg`` (the first write error's for a bulk
    write), without pymongo's ``, full error: {…}`` suffix, which repeats the whole reply —
    offending key values and every ``violations`` group included."""
    details = getattr(error, "details", None)
    if isinstance(details, Mapping):
        write_errors = details.get("writeErrors") or []
        if write_errors and isinstance(write_errors[0], Mapping):
            return str(write_errors[0].get("errmsg") or "batch op errors occurred")
        if isinstance(details.get("errmsg"), str):
            return str(details["errmsg"])
    return str(error).split(", full error: ", 1)[0].strip()


class LockAlreadyHeldError(MigronautError):
    """Another run holds a fresh migration lock (``context.holder``)."""

    code = "LOCK_ALREADY_HELD"


class ChecksumMismatchError(MigronautError):
    """An applied file changed on disk under strict mode, or a planned checksum differs."""

    code = "CHECKSUM_MISMATCH"


class ConnectionFailedError(MigronautError):
    """The MongoDB connection could not be established."""

    code = "CONNECTION_FAILED"


class ConfigInvalidError(MigronautError):
    """Bad configuration, flags or option combination; ``context.issues`` names each path."""

    code = "CONFIG_INVALID"


class ExtraMissingError(ConfigInvalidError, ImportError):
    """An optional extra is not installed (``context.extra``): importing
    ``migronaut.integrations.beanie`` without ``migronaut[beanie]``, the dashboard without
    ``migronaut[dashboard]``. An :class:`ImportError` too, so ``except ImportError`` still works;
    the message says what to ``pip install``."""

    @classmethod
    def of(cls, extra: str, feature: str, missing: ImportError) -> ExtraMissingError:
        """``<feature> needs the '<extra>' extra (<module> is missing): pip install …``."""
        return cls(f"{feature} needs the '{extra}' extra ({missing.name or missing} is "
                   f"missing): pip install 'migronaut[{extra}]'",
                   {"extra": extra, "missing": missing.name}, cause=missing)


class MigrationExecutionFailedError(MigronautError):
    """A migration body raised, or its changelog write failed after the body succeeded."""

    code = "MIGRATION_EXECUTION_FAILED"


class MigrationFileNotFoundError(MigronautError):
    """A named file, ``--to`` target or template does not exist."""

    code = "MIGRATION_FILE_NOT_FOUND"


class NotAppliedError(MigronautError):
    """A revert target is not applied."""

    code = "NOT_APPLIED"


class LockLostError(MigronautError):
    """The lock was lost mid-run; the run stopped before its next migration."""

    code = "LOCK_LOST"


class RunAbortedError(MigronautError):
    """The run was stopped by ``stop()``, SIGINT or SIGTERM after the migration in flight."""

    code = "RUN_ABORTED"


class HookFailedError(MigronautError):
    """A lifecycle hook raised (``context.hook``)."""

    code = "HOOK_FAILED"


class IrreversibleMigrationError(MigronautError):
    """A revert targets forward-only records (imported or baselined)."""

    code = "MIGRATION_IRREVERSIBLE"


class MigrationTimeoutError(MigronautError):
    """A migration exceeded its ``timeout_ms``."""

    code = "MIGRATION_TIMEOUT"


class TransactionsUnsupportedError(MigronautError):
    """A transactional migration ran against a standalone server."""

    code = "TRANSACTIONS_UNSUPPORTED"


class ConfigFileExistsError(MigronautError):
    """``init`` would overwrite an existing config file."""

    code = "CONFIG_FILE_EXISTS"


class ImportTargetNotEmptyError(MigronautError):
    """``import`` into a non-empty changelog without ``--force``."""

    code = "IMPORT_TARGET_NOT_EMPTY"


class MigrationFileExistsError(MigronautError):
    """``create`` would overwrite an existing migration file."""

    code = "MIGRATION_FILE_EXISTS"


class MigrationInvalidNameError(MigronautError):
    """A migration name is not a bare, safe file name."""

    code = "MIGRATION_INVALID_NAME"


class MigrationInvalidExportError(MigronautError):
    """A migration file cannot be loaded or does not define what it must."""

    code = "MIGRATION_INVALID_EXPORT"


class LockReleaseFailedError(MigronautError):
    """The lock could not be released after a successful run."""

    code = "LOCK_RELEASE_FAILED"


class AuditFailedError(MigronautError):
    """An ``audit`` check failed."""

    code = "AUDIT_FAILED"


class OutOfOrderMigrationError(MigronautError):
    """Pending files sort before the newest applied one under ``on_out_of_order = 'error'``."""

    code = "MIGRATION_OUT_OF_ORDER"


class MigrationBlockedError(MigronautError):
    """An ordered single-file run is out of sequence."""

    code = "MIGRATION_BLOCKED"


class QueueJobInvalidError(MigronautError):
    """A queue job's payload is not one this version understands (unknown kind or key, newer
    ``v``, a bad value): the job is refused, never guessed at."""

    code = "QUEUE_JOB_INVALID"


class QueueJobFailedError(MigronautError):
    """Waiting on queued work saw a job fail, or the wait timed out (``context.timedOut``)."""

    code = "QUEUE_JOB_FAILED"


class ConvergeFailedError(MigronautError):
    """``converge`` refused its plan or failed on the way. ``context.phase`` is ``plan``
    (conflicts, refused before the first write), ``replan`` (a collection changed mid-run),
    ``apply`` (a step failed) or ``wait``; ``context.converge`` is the result so far."""

    code = "CONVERGE_FAILED"


class RevisionConflictError(MigronautError):
    """A guarded write (``migronaut.versioning``) matched no document at the expected revision.
    ``context.reason`` is ``not-found``, ``conflict`` (with ``actual``) or ``unknown``;
    ``context`` also has ``expected`` and ``collection``, never the filter."""

    code = "REVISION_CONFLICT"


class ShapeVersionError(MigronautError):
    """A document's shape version cannot be read or upgraded (``migronaut.versioning``).
    ``context.reason`` is ``newer``, ``below-min`` or ``invalid``; with ``version``,
    ``current`` and ``collection`` when known."""

    code = "SHAPE_VERSION_UNSUPPORTED"


class BackgroundPendingError(MigronautError):
    """A migration waits for background migrations that are not done."""

    code = "BACKGROUND_PENDING"


class BackgroundFailedError(MigronautError):
    """A background migration failed."""

    code = "BACKGROUND_FAILED"


class BackgroundConflictError(MigronautError):
    """A background control action does not fit the migration's state."""

    code = "BACKGROUND_CONFLICT"


class SandboxRefusedError(MigronautError):
    """The background dry-run sandbox refused to run."""

    code = "SANDBOX_REFUSED"


class StateInvalidError(MigronautError):
    """Stored state migronaut cannot read: ``context`` names the collection, the record and the
    field (``problems``) or the names recorded twice (``duplicates``)."""

    code = "STATE_INVALID"


class MigrationInDoubtError(MigronautError):
    """A migration's outcome is unknown: a run started its body outside a transaction and ended
    (killed, its lock lost, its changelog write failed) without recording whether it finished.
    ``context`` names it (``name``, ``runId``, ``host``, ``pid``, ``startedAt``, ``direction``)
    and lists every such migration (``inDoubt``); nothing runs it again until ``migronaut
    resolve`` records the operator's decision."""

    code = "MIGRATION_IN_DOUBT"


class FleetInvalidError(MigronautError):
    """A fleet's tenants cannot be resolved: ``context`` names the tenant, cluster, source,
    registry document or callable. Nothing has run."""

    code = "FLEET_INVALID"


class FleetPartialError(MigronautError):
    """Some tenants of a fleet run failed, were skipped or are not up to date
    (``context.tenants`` names them with their state and error)."""

    code = "FLEET_PARTIAL"
