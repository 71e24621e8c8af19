"""Migration files: discovery, name safety, checksums and loading by path.

Invariants: a migration's identity is its bare file name; no name that could escape the
migrations directory or read as a query operator (``$…``) is ever accepted, and no file whose
path resolves outside it (a symlink to elsewhere) is ever listed or loaded; a migrations
directory that does not exist is a configuration error, never "no migrations"; files run in
plain string order of their names; a checksum is the SHA-256 of the file with a leading BOM and
CRLF line endings normalised, so a line-ending-only change is not drift.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import os
import re
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from migronaut._values import is_int
from migronaut.core.code_cache import compile_cached, read_file
from migronaut.errors import (
    ConfigInvalidError,
    MigrationExecutionFailedError,
    MigrationFileNotFoundError,
    MigrationInvalidExportError,
    MigrationInvalidNameError,
    describe_exception,
)

__all__ = [
    "ChecksumCache",
    "MigrationModule",
    "check_name",
    "checksum_bytes",
    "discover",
    "left_while_loading",
    "load_migration",
    "load_migration_module",
    "load_migrations",
    "load_module",
    "resolve_file",
]

_BOM = b"\xef\xbb\xbf"


def check_name(name: Any, *, field: str = "name") -> str:
    """Refuse anything but a bare, safe file name (path traversal, NUL, ``$`` operators)."""
    if not isinstance(name, str) or not name.strip():
        raise MigrationInvalidNameError(
            f"Invalid migration name — must be a non-empty string, got {type(name).__name__}",
            {field: repr(name)[:200]},
        )
    if name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise MigrationInvalidNameError(
            f"Invalid migration name — must be a bare filename inside the migrations directory: "
            f"{name!r}",
            {field: name},
        )
    if name.startswith("$"):
        raise MigrationInvalidNameError(
            f"Invalid migration name — must not start with '$' (reads as a query operator): "
            f"{name!r}",
            {field: name},
        )
    return name


def is_valid_name(name: Any) -> bool:
    try:
        check_name(name)
    except MigrationInvalidNameError:
        return False
    return True


def unusable_directory(directory: Path, origin: str | None = None) -> ConfigInvalidError:
    """``CONFIG_INVALID`` for a migrations directory that is missing or not a directory.

    A typo in ``--dir`` must never read as "no migrations" (``up`` would say "Nothing to
    migrate" and a CI gate would pass). ``origin`` says which setting to fix; a missing
    directory's message says how to create it.
    """
    problem = "is not a directory" if directory.exists() else "does not exist"
    where = " (the default)" if origin == "the default" else f" (set by {origin})" if origin else ""
    if problem == "does not exist":
        where += (f" — create it: `migronaut create NAME` writes the first migration there, or "
                  f"`mkdir -p {directory}`")
    if origin == "the default":
        where += "; or set --dir, MIGRONAUT_MIGRATIONS_DIR or migrations_dir"
    return ConfigInvalidError(
        f"Invalid configuration: migrations_dir: {directory} {problem}{where}",
        {"issues": [{"path": "migrations_dir", "message": problem}],
         "directory": str(directory)},
    )


def directory_os_error(directory: Path, problem: str, error: OSError) -> ConfigInvalidError:
    """``CONFIG_INVALID`` for a migrations directory the OS refused (``problem``: ``cannot be
    read``, ``cannot be created``), with the OS's reason."""
    return ConfigInvalidError(
        f"Invalid configuration: migrations_dir: {directory} {problem}: "
        f"{error.strerror or error}",
        {"issues": [{"path": "migrations_dir", "message": problem}],
         "directory": str(directory)},
    )


def _escapes(root: Path, path: Path, name: str) -> MigrationInvalidNameError | None:
    """The refusal of a file whose real path is not directly inside ``root`` (a symlink)."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        target = None
    if target is not None and target.parent == root:
        return None
    return MigrationInvalidNameError(
        f"Invalid migration name — resolves outside the migrations directory: {name!r}"
        + (f" (→ {target})" if target is not None else ""),
        {"name": name, "directory": str(root)},
    )


def discover(
    directory: Path, extensions: Sequence[str], *, origin: str | None = None
) -> list[str]:
    """Migration file names at the top level of ``directory``, in execution (name) order.

    Dotfiles, names starting with ``_`` (``__init__.py``, shared helpers), sub-directories and
    files with another extension are ignored. A missing directory is ``CONFIG_INVALID``; an
    unsafe name, or a symlink that resolves outside the directory, is
    ``MIGRATION_INVALID_NAME``. One ``scandir``: only symlinks cost a path resolution.
    """
    try:
        with os.scandir(directory) as scan:
            entries = list(scan)
    except (FileNotFoundError, NotADirectoryError):
        raise unusable_directory(directory, origin) from None
    except OSError as error:
        raise directory_os_error(directory, "cannot be read", error) from error
    suffixes = tuple(extensions)
    root: Path | None = None
    names = []
    for entry in entries:
        name = entry.name
        if name.startswith((".", "_")) or not name.endswith(suffixes):
            continue
        try:
            if not entry.is_file():
                continue
            symlink = entry.is_symlink()
        except OSError:
            continue
        check_name(name)
        if symlink:
            root = root or directory.resolve()
            refusal = _escapes(root, Path(entry.path), name)
            if refusal is not None:
                raise refusal
        names.append(name)
    names.sort()
    return names


def resolve_file(directory: Path, name: Any, *, field: str = "filename") -> Path:
    """The path of a named migration that must exist inside ``directory``."""
    return Path(_resolve_in(directory.resolve(), directory, name, field=field))


def _resolve_in(root: Path, directory: Path, name: Any, *, field: str = "filename") -> str:
    """:func:`resolve_file`'s real path, as text, with the directory's real path ``root``
    already known.

    A plain file (not a symlink) directly inside ``root`` is its own real path: one ``lstat``
    instead of a ``realpath`` per call, which a run over thousands of files would pay per file.
    The path stays text: a run of many quick migrations would spend more on building and
    rendering ``Path`` objects than on loading the files.
    """
    text = os.fspath(root)
    check_name(name, field=field)
    filename = text + name if text.endswith(os.sep) else f"{text}{os.sep}{name}"
    try:
        mode = os.lstat(filename).st_mode
    except OSError:
        mode = 0
    if stat.S_ISREG(mode):
        return filename
    path = Path(filename).resolve()
    if path.parent != root:
        raise MigrationInvalidNameError(
            f"Invalid migration name — resolves outside the migrations directory: {name!r}",
            {field: name},
        )
    if not path.is_file():
        raise MigrationFileNotFoundError(
            f"Migration file not found: {name}", {field: name, "directory": str(directory)}
        )
    return os.fspath(path)


def checksum_bytes(data: bytes) -> str:
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
    return hashlib.sha256(data.replace(b"\r\n", b"\n")).hexdigest()


def _digest_and_checksum(data: bytes) -> tuple[bytes, str]:
    """The SHA-256 of ``data`` as read and its checksum: one hash of the bytes for both when
    there is no BOM or CRLF to normalise (the usual case)."""
    digest = hashlib.sha256(data).digest()
    if data.startswith(_BOM) or b"\r\n" in data:
        return digest, checksum_bytes(data)
    return digest, digest.hex()


class ChecksumCache:
    """Checksums keyed by path, re-hashed only when the file's mtime or size changes (keys are
    the path's text: a hot lookup, once per migration of a run, costs a ``stat``)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, int, str]] = {}
        self._lock = threading.Lock()

    def checksum(self, path: str | Path) -> str | None:
        key = os.fspath(path)
        try:
            found = os.stat(key)
        except OSError:
            return None
        with self._lock:
            hit = self._entries.get(key)
        if hit and hit[0] == found.st_mtime_ns and hit[1] == found.st_size:
            return hit[2]
        try:
            with open(key, "rb") as source:
                value = checksum_bytes(source.read())
        except OSError:
            return None
        self.remember(key, found, value)
        return value

    def remember(self, path: str | Path, found: os.stat_result, value: str) -> None:
        """Keep ``value``, the checksum of ``path`` as it was when stamped ``found`` (a loader
        that already read the file shares its read instead of hashing it again)."""
        with self._lock:
            self._entries[os.fspath(path)] = (found.st_mtime_ns, found.st_size, value)


_module_lock = threading.Lock()
#: real path -> (module, the file's (mtime_ns, size, inode) when it was compiled, the checksum
#: of the bytes compiled): a file changed on disk since (a long-lived worker, a migration fixed
#: in place) is compiled again, so the code that runs is always the code whose checksum is
#: recorded.
_module_cache: dict[str, tuple[ModuleType, tuple[int, int, int], str]] = {}


def _stamp_key(stamp: os.stat_result) -> tuple[int, int, int]:
    return stamp.st_mtime_ns, stamp.st_size, stamp.st_ino


_NOT_WORD = re.compile(r"\W")


def _module_name(path: str | Path) -> str:
    filename = os.fspath(path)
    base = filename.rpartition(os.sep)[2]
    dot = base.rfind(".")
    stem = base[:dot] if 0 < dot < len(base) - 1 else base  # (as ``PurePath.stem``)
    slug = _NOT_WORD.sub("_", stem)
    digest = hashlib.sha1(filename.encode()).hexdigest()[:10]
    return f"_migronaut_migration_{slug}_{digest}"


def load_module(path: Path, name: str | None = None, *, reload: bool = False) -> ModuleType:
    """Execute a Python file by path (no package import needed) and cache it per path.

    The source is read every time and its compiled code is looked up by the SHA-256 of those
    exact bytes (:mod:`migronaut.core.code_cache`), never from Python's own ``.pyc``: that is
    judged fresh by the source's whole-second mtime and size, so a file edited within the same
    second to the same length (``VALUE = 1`` → ``VALUE = 2``) would run the old code — and the
    code that runs must be the one whose checksum was recorded.
    """
    return _load_resolved(os.fspath(path.resolve()), name, reload=reload)[0]


def _new_module(name: str, filename: str) -> ModuleType:
    """An empty module for the source file ``filename``, with the attributes an import gives
    it (``__file__``, ``__spec__``, a source loader for ``linecache``/``inspect``): what
    ``importlib.util.module_from_spec`` makes, without deriving a ``.pyc`` path nobody uses."""
    loader = importlib.machinery.SourceFileLoader(name, filename)
    spec = importlib.machinery.ModuleSpec(name, loader, origin=filename)
    spec.has_location = True
    module = ModuleType(name)
    module.__spec__ = spec
    module.__loader__ = loader
    module.__package__ = ""
    module.__file__ = filename
    return module


def _load_resolved(
    filename: str, name: str | None = None, *, reload: bool = False,
    checksums: ChecksumCache | None = None,
) -> tuple[ModuleType, str]:
    """:func:`load_module` of a real path (as text), and the checksum of the bytes it runs;
    those bytes also fill ``checksums`` (one read of the file for both)."""
    with _module_lock:
        cached = None if reload else _module_cache.get(filename)
        if cached is not None:
            try:
                found = os.stat(filename)
            except OSError:
                found = None
            if found is not None and _stamp_key(found) == cached[1]:
                if checksums is not None:
                    checksums.remember(filename, found, cached[2])
                return cached[0], cached[2]
        module_name = name or _module_name(filename)
        module = _new_module(module_name, filename)
        sys.modules[module_name] = module
        try:
            stamp, data = read_file(filename)
            digest, checksum = _digest_and_checksum(data)
            if checksums is not None:
                checksums.remember(filename, stamp, checksum)
            code = compile_cached(data, filename, digest)
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        _module_cache[filename] = (module, _stamp_key(stamp), checksum)
        return module, checksum


@dataclass(frozen=True)
class MigrationModule:
    """What a migration file defines, validated."""

    name: str
    path: Path
    up: Callable[..., Any] | None
    down: Callable[..., Any] | None
    description: str | None = None
    use_transaction: bool | None = None
    timeout_ms: int | None = None
    requires: tuple[str, ...] = ()
    #: The ``background = {...}`` declaration of a background migration (instead of up/down).
    background: Any = None
    #: The checksum of the bytes that were compiled into ``up``/``down`` (``None`` when the
    #: module was not loaded from a file).
    checksum: str | None = None


def _describe_load_error(error: BaseException) -> str:
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} (line {error.lineno})"
    return f"{type(error).__name__}: {error}"


def left_while_loading(
    error: BaseException, path: Path, what: str = "Migration file"
) -> MigrationExecutionFailedError | None:
    """The error of a file whose top-level code left by ``sys.exit()`` or
    ``KeyboardInterrupt``: it failed like a body that does (``MIGRATION_EXECUTION_FAILED``,
    exit 7), never a silent exit with the code it chose (``sys.exit(3)`` would read as
    ``LOCK_ALREADY_HELD``) nor a worker's task left running. ``None`` for a real Ctrl-C (see
    :func:`~migronaut.core._calls.escaped`): that keeps its meaning."""
    from migronaut.core._calls import escaped
    from migronaut.core.runner import user_line

    if not escaped(error):
        return None
    line = user_line(error, path.resolve())
    where = f"{path.name}, line {line}" if line is not None else path.name
    context: dict[str, Any] = {"filepath": str(path)}
    if line is not None:
        context["line"] = line
    return MigrationExecutionFailedError(
        f"{what} failed to load: {where}: {describe_exception(error)}", context, cause=error)


def load_migration_module(path: Path, *, reload: bool = False) -> ModuleType:
    """Execute a migration file; any failure at import is ``MIGRATION_INVALID_EXPORT`` — but a
    ``sys.exit()``/``KeyboardInterrupt`` is :func:`left_while_loading`'s error."""
    return _load_migration_module(path, os.fspath(path.resolve()), reload=reload)[0]


def _load_migration_module(
    path: Path, real: str, *, reload: bool, checksums: ChecksumCache | None = None
) -> tuple[ModuleType, str]:
    """:func:`load_migration_module` of ``path`` whose real path ``real`` is known, and the
    checksum of the bytes it runs."""
    try:
        return _load_resolved(real, reload=reload, checksums=checksums)
    except (KeyboardInterrupt, SystemExit) as error:
        left = left_while_loading(error, path)
        if left is None:
            raise
        raise left from error
    except BaseException as error:
        raise MigrationInvalidExportError(
            f"Migration file failed to load: {path.name}: {_describe_load_error(error)}",
            {"filepath": str(path)},
            cause=error,
        ) from error


def load_migration(path: Path, *, reload: bool = False) -> MigrationModule:
    """Load and validate one migration file (``MIGRATION_INVALID_EXPORT`` when it is not usable)."""
    return _load_migration(path, os.fspath(path.resolve()), path.name, reload=reload)


def _load_migration(
    path: Path, real: str, name: str, *, reload: bool, checksums: ChecksumCache | None = None
) -> MigrationModule:
    module, checksum = _load_migration_module(path, real, reload=reload, checksums=checksums)
    problems: list[str] = []
    up = getattr(module, "up", None)
    down = getattr(module, "down", None)
    background = getattr(module, "background", None)
    if background is not None:
        if up is not None or down is not None:
            problems.append("a background migration defines `background` instead of up() and "
                            "down(), not both (put expand steps in ordinary migrations)")
    elif not callable(up) or not callable(down):
        missing = [n for n, f in (("up", up), ("down", down)) if not callable(f)]
        problems.append("must define up(ctx) and down(ctx) functions (missing: "
                        + ", ".join(missing) + ")")
    description = getattr(module, "description", None)
    if description is None and module.__doc__:
        description = _first_line(module.__doc__)
    if description is not None and not isinstance(description, str):
        problems.append("description must be a string")
    use_transaction = getattr(module, "use_transaction", None)
    if use_transaction is not None and not isinstance(use_transaction, bool):
        problems.append("use_transaction must be True or False")
    timeout_ms = getattr(module, "timeout_ms", None)
    if timeout_ms is not None and (
        not is_int(timeout_ms) or timeout_ms <= 0
    ):
        problems.append("timeout_ms must be a positive integer")
    requires = getattr(module, "requires", ())
    if isinstance(requires, str) or not isinstance(requires, (list, tuple)) or not all(
        isinstance(r, str) and r for r in requires
    ):
        problems.append("requires must be a list of migration file names")
        requires = ()
    if problems:
        raise MigrationInvalidExportError(
            f"Invalid migration {name}: " + "; ".join(problems),
            {"filepath": str(path), "problems": problems},
        )
    return MigrationModule(
        name=name,
        path=path,
        up=up if callable(up) else None,
        down=down if callable(down) else None,
        background=background,
        description=description or None,
        use_transaction=use_transaction,
        timeout_ms=timeout_ms,
        requires=tuple(requires),
        checksum=checksum,
    )


def _first_line(doc: str) -> str:
    """The first line of ``inspect.cleandoc(doc)`` (``""`` for a blank docstring); without
    cleaning the rest of the docstring when its first line has text (the usual summary)."""
    first = doc.partition("\n")[0]
    fast = first and not first[0].isspace()  # (what cleandoc strips differs between versions)
    lines = (first.expandtabs() if fast else inspect.cleandoc(doc)).splitlines()
    return lines[0] if lines else ""


def load_migrations(
    directory: Path, names: Sequence[str], *, reload: bool = False,
    checksums: ChecksumCache | None = None,
) -> list[MigrationModule]:
    """Resolve, load and validate every file a command is about to run, before the first runs.

    A syntax error or a missing ``down()`` in the third file must refuse the run, not leave the
    first two applied. Raises the first file's error (``MIGRATION_FILE_NOT_FOUND``,
    ``MIGRATION_INVALID_NAME``, ``MIGRATION_INVALID_EXPORT``). The directory is resolved once;
    each file read for loading also fills ``checksums`` (the record's checksum is then a
    ``stat``, not a second read).
    """
    root = directory.resolve()
    loaded: dict[str, MigrationModule] = {}
    for name in names:
        if name not in loaded:
            real = _resolve_in(root, directory, name)
            base = name if real.endswith(name) and real[-len(name) - 1] == os.sep \
                else os.path.basename(real)  # (a symlink: its target's name)
            loaded[name] = _load_migration(Path(real), real, base, reload=reload,
                                           checksums=checksums)
    return [loaded[name] for name in names]
