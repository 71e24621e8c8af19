"""The compiled-code cache of migration files: keyed by the exact bytes, never trusted blindly."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from migronaut.core import code_cache
from migronaut.core.files import load_migration

SOURCE = "VALUE = {}\ndef up(ctx): return VALUE\ndef down(ctx): pass\n"


@pytest.fixture(autouse=True)
def _cache_beside_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The file names ``compile`` is called for by the cache (a hit calls it for none)."""
    seen: list[str] = []

    def counting(data: bytes, filename: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(filename)
        return compile(data, filename, *args, **kwargs)

    monkeypatch.setattr(code_cache, "compile", counting, raising=False)
    return seen


def migration(directory: Path, value: int, name: str = "0001_a.py") -> Path:
    path = directory / name
    path.write_text(SOURCE.format(value), encoding="utf-8")
    return path


def entry_of(path: Path) -> Path:
    entries = list((path.parent / "__pycache__").glob(f"{path.stem}.*.migronaut.pyc"))
    assert len(entries) == 1, entries
    return entries[0]


def test_a_cache_hit_does_not_compile(tmp_path: Path, compiles: list[str]) -> None:
    path = migration(tmp_path, 1)
    assert load_migration(path, reload=True).up(None) == 1
    assert compiles == [str(path)]
    assert entry_of(path).stat().st_size > 0
    assert load_migration(path, reload=True).up(None) == 1
    assert compiles == [str(path)]  # the second load came from the cache


def test_an_edit_with_the_same_size_and_mtime_never_runs_the_old_code(
    tmp_path: Path, compiles: list[str]
) -> None:
    path = migration(tmp_path, 1)
    stamp = path.stat()
    assert load_migration(path, reload=True).up(None) == 1
    migration(tmp_path, 2)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert path.stat().st_size == stamp.st_size
    assert load_migration(path, reload=True).up(None) == 2
    assert len(compiles) == 2
    assert load_migration(path, reload=True).up(None) == 2  # the rewritten entry is the new code
    assert len(compiles) == 2


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "empty", "another file's"])
def test_a_damaged_entry_is_ignored_and_rewritten(
    tmp_path: Path, compiles: list[str], damage: str
) -> None:
    path = migration(tmp_path, 1)
    load_migration(path, reload=True)
    entry = entry_of(path)
    blob = entry.read_bytes()
    if damage == "truncated":
        entry.write_bytes(blob[: len(blob) - 7])
    elif damage == "flipped byte":
        entry.write_bytes(blob[:-20] + bytes([blob[-20] ^ 0x01]) + blob[-19:])
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a well-formed entry, but for other bytes: its code must not run for this file
        other = migration(tmp_path, 7, "0002_b.py")
        load_migration(other, reload=True)
        entry.write_bytes(entry_of(other).read_bytes())
    assert load_migration(path, reload=True).up(None) == 1
    assert compiles.count(str(path)) == 2
    assert entry.read_bytes() == blob  # rewritten as it should be


def test_an_unwritable_cache_directory_compiles_as_without_a_cache(
    tmp_path: Path, compiles: list[str]
) -> None:
    (tmp_path / "__pycache__").write_text("not a directory")  # fails even for root
    path = migration(tmp_path, 1)
    assert load_migration(path, reload=True).up(None) == 1
    assert load_migration(path, reload=True).up(None) == 1
    assert len(compiles) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0001_a.py", "__pycache__"]


def test_nothing_is_written_when_bytecode_writing_is_off(
    tmp_path: Path, compiles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    path = migration(tmp_path, 1)
    assert load_migration(path, reload=True).up(None) == 1
    assert not (tmp_path / "__pycache__").exists()


def test_the_pycache_prefix_holds_the_entries(
    tmp_path: Path, compiles: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "prefix"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    (tmp_path / "project").mkdir()
    path = migration(tmp_path / "project", 1)
    assert load_migration(path, reload=True).up(None) == 1
    assert not (path.parent / "__pycache__").exists()
    entries = list(prefix.rglob("0001_a.*.migronaut.pyc"))
    assert [e.parent for e in entries] == [prefix.joinpath(*path.resolve().parent.parts[1:])]
    assert load_migration(path, reload=True).up(None) == 1
    assert len(compiles) == 1


def _reference_entry_path(filename: str) -> str:
    """Where an entry goes, written with os.path as importlib's own cache paths are."""
    head, tail = os.path.split(filename)
    name = f"{os.path.splitext(tail)[0]}.{sys.implementation.cache_tag}.migronaut.pyc"
    if sys.pycache_prefix:
        return os.path.join(sys.pycache_prefix, head.lstrip(os.sep), name)
    return os.path.join(head, "__pycache__", name)


@pytest.mark.parametrize("prefix", [None, "/var/cache/py", "/var/cache/py/"])
@pytest.mark.parametrize("filename", [
    "/m/0001_a.py", "/m/a.b.py", "/m/.py", "/m/..py", "/m/a.", "/m/noext", "/0001_a.py",
    "0001_a.py", "/m/n/é ü.py",
])
def test_entry_paths_are_where_os_path_puts_them(
    monkeypatch: pytest.MonkeyPatch, filename: str, prefix: str | None
) -> None:
    monkeypatch.setattr(sys, "pycache_prefix", prefix)
    made = code_cache._entry_path(filename)
    assert made is not None
    assert os.path.normpath(made) == os.path.normpath(_reference_entry_path(filename))
