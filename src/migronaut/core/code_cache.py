"""Compiled code of migration files, cached under the SHA-256 of the exact bytes compiled.

Python's own ``__pycache__`` judges a ``.pyc`` fresh by the source's whole-second mtime and
size, so a file edited within the same second to the same length would run its old code. This
cache is keyed by content instead: an entry holds the SHA-256 of (the interpreter's magic
number, the optimisation level, the path given to ``compile`` and the SHA-256 of the source's
bytes) and the CRC-32 of its own marshalled payload. An entry is used only when both match,
so the code that runs is always the code of the bytes that were hashed; anything else (another
file's bytes, a truncated or corrupted entry, another interpreter) is ignored and rewritten.

Entries live beside the file in ``__pycache__`` (``NAME.TAG.migronaut.pyc``: what every
Python ``.gitignore`` already ignores), or under ``PYTHONPYCACHEPREFIX`` when it is set. Nothing
is written when ``sys.dont_write_bytecode`` is set (``PYTHONDONTWRITEBYTECODE``, ``-B``); a
directory that cannot be written is silently skipped (the file is compiled as without a cache).
Writers never collide: each writes a temporary file and renames it over the entry. As with
Python's own ``.pyc``, whoever can write the cache directory can choose the code that runs: the
checks above catch damage and staleness, not a forged entry.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import marshal
import os
import sys
import zlib
from types import CodeType

__all__ = ["compile_cached", "read_file"]

_FORMAT = b"MGNTCOD2"  # 8 bytes: what this file is, and the layout's version
_DIGEST = 32  # bytes of a SHA-256 digest (the key)
_CHECK = 4  # bytes of the payload's CRC-32: damage to detect, not forgery (see above)
_HEADER = len(_FORMAT) + _DIGEST + _CHECK
_READ = os.O_RDONLY | getattr(os, "O_BINARY", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)


def read_file(path: str | os.PathLike[str]) -> tuple[os.stat_result, bytes]:
    """The file's ``fstat`` and its whole content, from one descriptor: a third of what
    ``open(path, "rb")`` costs (no buffer object, no ``isatty`` probe, no second ``read``), which
    counts when a run reads two files per migration."""
    descriptor = os.open(path, _READ)
    try:
        found = os.fstat(descriptor)
        data = os.read(descriptor, found.st_size + 1)
        if len(data) > found.st_size:  # it grew since: read on to its end
            parts = [data]
            while part := os.read(descriptor, 1 << 16):
                parts.append(part)
            data = b"".join(parts)
        return found, data
    finally:
        os.close(descriptor)


def _entry_path(filename: str) -> str | None:
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    # (string operations, not os.path's: this runs once per file of a run, on a real path)
    head, sep, tail = filename.rpartition(os.sep)
    dot = tail.rfind(".")
    stem = tail[:dot] if dot > 0 and tail[:dot].lstrip(".") else tail  # (as splitext)
    name = f"{stem}.{tag}.migronaut.pyc"
    return f"{_entry_directory(head, sep, sys.pycache_prefix)}{os.sep}{name}"


@functools.lru_cache(maxsize=64)  # (the files of a run share a directory)
def _entry_directory(head: str, sep: str, prefix: str | None) -> str:
    """Where the entries of the files in ``head`` go (``sep``: the separator after it)."""
    if prefix:
        # As importlib does: the source's absolute directory, re-rooted under the prefix.
        below = head.lstrip(os.sep)
        return os.path.join(prefix, below) if below else prefix.rstrip(os.sep) or prefix
    return f"{head}{sep}__pycache__"


def _check(payload: bytes | memoryview) -> bytes:
    """The payload's check value: a CRC-32 catches a truncated or damaged entry for a tenth of
    a SHA-256's cost, which a run pays once per file."""
    return zlib.crc32(payload).to_bytes(_CHECK, "little")


def _key(source_digest: bytes, filename: str) -> bytes:
    return hashlib.sha256(
        importlib.util.MAGIC_NUMBER
        + sys.flags.optimize.to_bytes(1, "little")
        + filename.encode("utf-8", "surrogatepass") + b"\0"
        + source_digest
    ).digest()


def _read(entry: str, key: bytes) -> CodeType | None:
    try:
        blob = read_file(entry)[1]
    except OSError:
        return None
    if len(blob) <= _HEADER or not blob.startswith(_FORMAT):
        return None
    if blob[len(_FORMAT) : len(_FORMAT) + _DIGEST] != key:
        return None
    payload = memoryview(blob)[_HEADER:]
    if _check(payload) != blob[len(_FORMAT) + _DIGEST : _HEADER]:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _write(entry: str, key: bytes, code: CodeType) -> None:
    payload = marshal.dumps(code)
    blob = _FORMAT + key + _check(payload) + payload
    temporary = f"{entry}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        try:
            descriptor = os.open(temporary, _CREATE, 0o644)
        except FileNotFoundError:  # the first entry of this directory
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            descriptor = os.open(temporary, _CREATE, 0o644)
        try:
            if os.write(descriptor, blob) != len(blob):
                raise OSError("short write")
        finally:
            os.close(descriptor)
        os.replace(temporary, entry)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass


def compile_cached(data: bytes, path: str | os.PathLike[str], source_digest: bytes) -> CodeType:
    """``compile(data, str(path), "exec", dont_inherit=True)``, from the cache when an entry for
    exactly these bytes (``source_digest``: their SHA-256) compiled at this path exists."""
    filename = os.fspath(path)
    entry = _entry_path(filename)
    key = _key(source_digest, filename)
    if entry is not None:
        cached = _read(entry, key)
        if cached is not None:
            return cached
    code = compile(data, filename, "exec", dont_inherit=True)
    if entry is not None and not sys.dont_write_bytecode:
        _write(entry, key, code)
    return code
