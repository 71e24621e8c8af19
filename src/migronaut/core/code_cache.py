"""Compiled code of migration files, cached under the SHA-256 of the exact bytes compiled.

Python's own ``__pycache__`` judges a ``.pyc`` fresh by the source's whole-second mtime and
size, so a file edited within the same second to the same length would run its old code. This
cache is keyed by content instead: an entry holds the SHA-256 of (the interpreter's magic
number, the optimisation level, the path given to ``compile`` and the SHA-256 of the source's
bytes) and the SHA-256 of its own marshalled payload. An entry is used only when both match,
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

import hashlib
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from types import CodeType

__all__ = ["compile_cached", "read_file"]

_FORMAT = b"MGNTCODE"  # 8 bytes: what this file is, and the layout's version
_DIGEST = 32  # bytes of a SHA-256 digest
_HEADER = len(_FORMAT) + 2 * _DIGEST
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
    head, tail = os.path.split(filename)
    name = f"{os.path.splitext(tail)[0]}.{tag}.migronaut.pyc"
    prefix = sys.pycache_prefix
    if prefix:
        # As importlib does: the source's absolute directory, re-rooted under the prefix.
        return os.path.join(prefix, head.lstrip(os.sep), name)
    return os.path.join(head, "__pycache__", name)


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
    if hashlib.sha256(payload).digest() != blob[len(_FORMAT) + _DIGEST : _HEADER]:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _write(entry: str, key: bytes, code: CodeType) -> None:
    payload = marshal.dumps(code)
    blob = _FORMAT + key + hashlib.sha256(payload).digest() + payload
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


def compile_cached(data: bytes, path: Path, source_digest: bytes) -> CodeType:
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
