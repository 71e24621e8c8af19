"""Migration files without a server: checksums, name safety, discovery, loading and exports."""

from __future__ import annotations

import hashlib
import inspect
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from migronaut.core.files import (
    ChecksumCache,
    _first_line,
    _module_name,
    check_name,
    checksum_bytes,
    discover,
    is_valid_name,
    load_migration,
    load_migrations,
    resolve_file,
)
from migronaut.errors import (
    EXIT_CODES,
    MigrationFileNotFoundError,
    MigrationInvalidExportError,
    MigrationInvalidNameError,
)

# -------------------------------------------------------------------------------- checksums


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_checksum_is_sha256_hex_of_the_content() -> None:
    data = b"def up(ctx):\n    pass\n"
    assert checksum_bytes(data) == sha(data)
    assert len(checksum_bytes(data)) == 64


def test_checksum_ignores_a_leading_bom_and_crlf_line_endings() -> None:
    unix = b"def up(ctx):\n    pass\n"
    assert checksum_bytes(b"\xef\xbb\xbf" + unix) == checksum_bytes(unix)
    assert checksum_bytes(unix.replace(b"\n", b"\r\n")) == checksum_bytes(unix)
    assert checksum_bytes(b"\xef\xbb\xbf" + unix.replace(b"\n", b"\r\n")) == sha(unix)


def test_checksum_still_sees_real_edits() -> None:
    a = b"def up(ctx):\n    pass\n"
    assert checksum_bytes(a) != checksum_bytes(a.replace(b"pass", b"return"))
    # only a *leading* BOM is normalised, and a lone CR is content
    assert checksum_bytes(b"x\xef\xbb\xbf") != checksum_bytes(b"x")
    assert checksum_bytes(b"a\rb") != checksum_bytes(b"a\nb")


def test_checksum_cache_rehashes_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_bytes(b"one\n")
    cache = ChecksumCache()
    assert cache.checksum(path) == sha(b"one\n")
    path.write_bytes(b"two, longer\n")  # size changes, so the cache must notice
    assert cache.checksum(path) == sha(b"two, longer\n")
    path.unlink()
    assert cache.checksum(path) is None


# ------------------------------------------------------------------------------ name safety


@pytest.mark.parametrize(
    "name",
    [
        "../etc/passwd",
        "a/b.py",
        "a\\b.py",
        "evil\x00.py",
        ".",
        "..",
        "",
        "   ",
        "$where.py",
        "$ne",
    ],
)
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(MigrationInvalidNameError) as info:
        check_name(name)
    assert info.value.code == "MIGRATION_INVALID_NAME"
    assert info.value.exit_code == EXIT_CODES["MIGRATION_INVALID_NAME"] == 19
    assert not is_valid_name(name)


@pytest.mark.parametrize("value", [None, 42, {"$ne": None}, ["a.py"], b"a.py"])
def test_non_string_names_are_refused(value: object) -> None:
    with pytest.raises(MigrationInvalidNameError):
        check_name(value)
    assert not is_valid_name(value)


@pytest.mark.parametrize("name", ["20260101000000_add_users.py", "0001_x.py", "a.b.py", "ü.py"])
def test_bare_names_are_accepted(name: str) -> None:
    assert check_name(name) == name
    assert is_valid_name(name)


def test_resolve_file_requires_an_existing_file_inside_the_directory(tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    (migrations / "0001_a.py").write_text("x")
    (tmp_path / "outside.py").write_text("x")
    assert resolve_file(migrations, "0001_a.py") == (migrations / "0001_a.py").resolve()
    with pytest.raises(MigrationFileNotFoundError) as info:
        resolve_file(migrations, "0002_missing.py")
    assert info.value.context["filename"] == "0002_missing.py"
    assert info.value.exit_code == 8
    with pytest.raises(MigrationInvalidNameError):
        resolve_file(migrations, "../outside.py")


def test_resolve_file_refuses_a_symlink_escaping_the_directory(tmp_path: Path) -> None:
    migrations = tmp_path / "migrations"
    migrations.mkdir()
    secret = tmp_path / "secret.py"
    secret.write_text("x")
    (migrations / "0001_link.py").symlink_to(secret)
    with pytest.raises(MigrationInvalidNameError):
        resolve_file(migrations, "0001_link.py")


# -------------------------------------------------------------------------------- discovery


def test_discovery_rules_and_order(tmp_path: Path) -> None:
    d = tmp_path / "migrations"
    d.mkdir()
    for name in [
        "20260102000000_b.py",
        "20260101000000_a.py",
        "0003_c.py",
        ".hidden.py",  # dotfile
        "_helpers.py",  # shared helper module
        "__init__.py",
        "notes.txt",  # other extension
        "20260103000000_d.pyc",
        "README.md",
    ]:
        (d / name).write_text("x")
    (d / "sub").mkdir()
    (d / "sub" / "20260104000000_nested.py").write_text("x")  # sub-directories are not scanned
    (d / "dir.py").mkdir()  # a directory with a matching name is not a file
    assert discover(d, (".py",)) == ["0003_c.py", "20260101000000_a.py", "20260102000000_b.py"]


def test_discovery_order_is_plain_string_order(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    names = ["10_x.py", "9_x.py", "B.py", "a.py", "1_x.py"]
    for name in names:
        (d / name).write_text("x")
    assert discover(d, (".py",)) == sorted(names)


def test_discovery_of_a_missing_directory_is_config_invalid(tmp_path: Path) -> None:
    from migronaut.errors import ConfigInvalidError

    with pytest.raises(ConfigInvalidError, match=r"nope does not exist \(set by the --dir flag\)"):
        discover(tmp_path / "nope", (".py",), origin="the --dir flag")
    (tmp_path / "file.py").write_text("x")
    with pytest.raises(ConfigInvalidError, match="is not a directory"):
        discover(tmp_path / "file.py", (".py",))


def test_discovery_honours_the_configured_extensions(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    for name in ("1.py", "2.mig", "3.txt"):
        (d / name).write_text("x")
    assert discover(d, (".py", ".mig")) == ["1.py", "2.mig"]


def test_discovery_refuses_a_file_whose_name_reads_as_an_operator(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "$where.py").write_text("x")
    with pytest.raises(MigrationInvalidNameError) as info:
        discover(d, (".py",))
    assert "$where.py" in info.value.message


# ---------------------------------------------------------------------------------- loading


def write(tmp_path: Path, name: str, source: str) -> Path:
    d = tmp_path / "migrations"
    d.mkdir(exist_ok=True)
    path = d / name
    path.write_text(source, encoding="utf-8")
    return path


def test_a_valid_module_is_loaded_with_its_options(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "0001_ok.py",
        '"""Add the users index.\n\nLonger text."""\n'
        "use_transaction = True\ntimeout_ms = 1500\n"
        "def up(ctx):\n    return 'up'\n"
        "async def down(ctx):\n    return 'down'\n",
    )
    m = load_migration(path)
    assert m.name == "0001_ok.py"
    assert m.description == "Add the users index."  # first line of the docstring
    assert m.use_transaction is True
    assert m.timeout_ms == 1500
    assert m.up(None) == "up"


def test_an_explicit_description_wins_over_the_docstring(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "0001_d.py",
        '"""Docstring."""\ndescription = "Explicit"\ndef up(ctx): pass\ndef down(ctx): pass\n',
    )
    m = load_migration(path)
    assert m.description == "Explicit"
    assert m.use_transaction is None and m.timeout_ms is None


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("def up(ctx):\n    pass\n", "down"),
        ("def down(ctx):\n    pass\n", "up"),
        ("up = 42\ndef down(ctx): pass\n", "up"),
        ("def up(ctx): pass\ndown = 'not callable'\n", "down"),
        ("use_transaction = 'yes'\ndef up(ctx): pass\ndef down(ctx): pass\n", "use_transaction"),
        ("use_transaction = 1\ndef up(ctx): pass\ndef down(ctx): pass\n", "use_transaction"),
        ("timeout_ms = -1\ndef up(ctx): pass\ndef down(ctx): pass\n", "timeout_ms"),
        ("timeout_ms = 0\ndef up(ctx): pass\ndef down(ctx): pass\n", "timeout_ms"),
        ("timeout_ms = 1.5\ndef up(ctx): pass\ndef down(ctx): pass\n", "timeout_ms"),
        ("timeout_ms = True\ndef up(ctx): pass\ndef down(ctx): pass\n", "timeout_ms"),
        ("timeout_ms = '100'\ndef up(ctx): pass\ndef down(ctx): pass\n", "timeout_ms"),
        ("description = 5\ndef up(ctx): pass\ndef down(ctx): pass\n", "description"),
        ("requires = 'x.py'\ndef up(ctx): pass\ndef down(ctx): pass\n", "requires"),
    ],
)
def test_bad_exports_are_invalid_export_errors(tmp_path: Path, source: str, fragment: str) -> None:
    path = write(tmp_path, "0001_bad.py", source)
    with pytest.raises(MigrationInvalidExportError) as info:
        load_migration(path)
    error = info.value
    assert error.code == "MIGRATION_INVALID_EXPORT" and error.exit_code == 20
    assert "0001_bad.py" in error.message
    assert fragment in error.message
    assert error.context["filepath"] == str(path)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("def up(ctx):\n  return (\n", "SyntaxError"),
        ("import a_module_that_does_not_exist_42\n", "ModuleNotFoundError"),
        ("raise RuntimeError('exploded at import')\n", "exploded at import"),
    ],
)
def test_a_module_that_fails_to_load_names_the_file_and_the_cause(
    tmp_path: Path, source: str, fragment: str
) -> None:
    path = write(tmp_path, "0001_broken.py", source)
    with pytest.raises(MigrationInvalidExportError) as info:
        load_migration(path)
    assert "0001_broken.py" in info.value.message
    assert fragment in info.value.message
    assert info.value.__cause__ is not None


def test_modules_are_cached_per_path_until_the_file_changes_or_a_reload(
    tmp_path: Path
) -> None:
    """An unchanged file is compiled once; a file changed on disk (a long-lived worker, a
    migration fixed in place) is compiled again, so the code that runs is the code whose
    checksum is recorded; ``reload`` compiles it again anyway."""
    import os

    path = write(
        tmp_path, "0001_c.py", "VALUE = 1\ndef up(ctx): return VALUE\ndef down(ctx): pass\n"
    )
    first = load_migration(path)
    assert first.up(None) == 1
    assert load_migration(path).up is first.up  # cached: the same module's function
    stamp = os.stat(path)
    path.write_text("VALUE = 2\ndef up(ctx): return VALUE\ndef down(ctx): pass\n")
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))
    assert load_migration(path).up(None) == 2
    again = load_migration(path)
    assert load_migration(path, reload=True).up is not again.up


def test_a_reload_runs_the_file_as_it_is_now_never_a_stale_bytecode_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same second, same size: a ``.pyc`` would look fresh; the code cache is keyed by the
    bytes themselves."""
    import os
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = write(
        tmp_path, "0001_d.py", "VALUE = 1\ndef up(ctx): return VALUE\ndef down(ctx): pass\n"
    )
    stat = path.stat()
    assert load_migration(path, reload=True).up(None) == 1
    path.write_text("VALUE = 2\ndef up(ctx): return VALUE\ndef down(ctx): pass\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same mtime, the same size
    assert load_migration(path, reload=True).up(None) == 2


@pytest.mark.parametrize("doc", ["   ", "\n\n", "\t\n\n"])
def test_a_blank_docstring_gives_no_description(tmp_path: Path, doc: str) -> None:
    source = f'"""{doc}"""\ndef up(ctx): pass\ndef down(ctx): pass\n'
    path = write(tmp_path, "0001_blank.py", source)
    assert load_migration(path).description is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab \t\n\r\x0c\x0b\u2028é.")), min_size=1))
def test_the_description_is_the_first_line_of_the_cleaned_docstring(doc: str) -> None:
    lines = inspect.cleandoc(doc).splitlines()
    assert _first_line(doc) == (lines[0] if lines else "")


@pytest.mark.parametrize("name", ["0001_a.py", "a.b.py", ".py", "..py", "a.", "noext", "é ü.py"])
def test_module_names_follow_the_path_stem(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    made = _module_name(str(path))
    assert made == _module_name(path)
    assert made.startswith("_migronaut_migration_" + re.sub(r"\W", "_", path.stem) + "_")


def test_the_record_keeps_the_checksum_of_the_bytes_that_were_loaded(tmp_path: Path) -> None:
    path = write(tmp_path, "0001_c.py", "def up(ctx): return 1\ndef down(ctx): pass\n")
    loaded = load_migrations(path.parent, ["0001_c.py"], reload=True)[0]
    assert loaded.checksum == checksum_bytes(path.read_bytes())
    path.write_text("def up(ctx): return 22\ndef down(ctx): pass\n", encoding="utf-8")
    assert loaded.checksum != checksum_bytes(path.read_bytes())  # the code that runs is 1's
    assert loaded.up(None) == 1
    again = load_migrations(path.parent, ["0001_c.py"])[0]  # changed on disk: loaded again
    assert (again.up(None), again.checksum) == (22, checksum_bytes(path.read_bytes()))
    cached = load_migrations(path.parent, ["0001_c.py"])[0]  # unchanged: from the module cache
    assert (cached.up(None), cached.checksum) == (22, again.checksum)
