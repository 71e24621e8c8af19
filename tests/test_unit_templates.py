"""``create``: slugs, timestamp and sequential prefixes, exclusive writes, custom templates."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from migronaut.core import templates
from migronaut.core.files import discover, load_migration
from migronaut.core.templates import slugify, write_migration
from migronaut.errors import (
    ConfigInvalidError,
    MigrationFileExistsError,
    MigrationFileNotFoundError,
)


@pytest.mark.parametrize(
    ("name", "slug"),
    [
        ("Add Users", "add_users"),
        ("  add---users!!  ", "add_users"),
        ("add_users", "add_users"),
        ("__x__", "x"),
        ("v2 → v3 rename", "v2_v3_rename"),
        ("Straße Ünïcode", "straße_ünïcode"),
        ("日本語 テスト", "日本語_テスト"),
        ("CamelCase42", "camelcase42"),
    ],
)
def test_slugify(name: str, slug: str) -> None:
    assert slugify(name) == slug


@pytest.mark.parametrize("name", ["", "   ", "!!!", "--- ---", "___"])
def test_a_name_without_letters_or_digits_is_refused(name: str) -> None:
    with pytest.raises(ConfigInvalidError) as info:
        slugify(name)
    assert "at least one letter or digit" in info.value.message
    assert info.value.exit_code == 6


def test_timestamp_prefix_is_local_time_and_the_file_is_a_valid_migration(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "migrations"  # created recursively
    before = dt.datetime.now().replace(microsecond=0)
    path = write_migration(directory, "Add users")
    after = dt.datetime.now().replace(microsecond=0)
    match = re.fullmatch(r"(\d{14})_add_users\.py", path.name)
    assert match, path.name
    stamp = dt.datetime.strptime(match.group(1), "%Y%m%d%H%M%S")
    assert before <= stamp <= after
    assert path.parent == directory
    assert discover(directory, (".py",)) == [path.name]
    migration = load_migration(path)
    assert callable(migration.up) and callable(migration.down)
    assert migration.description == "Add users"


def test_sequential_prefix_is_the_highest_numeric_prefix_plus_one(tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    for name in ("0001_a.py", "0007_b.py", "0003_c.py", "0100_notes.txt", "README.py"):
        (d / name).write_text("x")
    path = write_migration(d, "next one", sequential=True)
    assert path.name == "0008_next_one.py"  # max + 1, not the count of files (4)


def test_sequential_prefix_starts_at_0001(tmp_path: Path) -> None:
    assert write_migration(tmp_path / "m", "first", sequential=True).name == "0001_first.py"


def test_an_existing_file_is_never_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class FrozenDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> FrozenDatetime:
            return cls(2026, 6, 5, 14, 30, 21)

    monkeypatch.setattr(templates.dt, "datetime", FrozenDatetime)
    first = write_migration(tmp_path, "same")
    assert first.name == "20260605143021_same.py"
    first.write_text("# edited by hand\n")
    with pytest.raises(MigrationFileExistsError) as info:
        write_migration(tmp_path, "same")
    assert info.value.exit_code == 18
    assert info.value.context["path"] == str(first)
    assert first.read_text() == "# edited by hand\n"


def test_a_custom_template_is_copied_verbatim(tmp_path: Path) -> None:
    template = tmp_path / "tpl.py"
    template.write_text(
        "# my template {not a format field}\ndef up(ctx): pass\ndef down(ctx): pass\n"
    )
    path = write_migration(tmp_path / "m", "x", template_path=template)
    assert path.read_text() == template.read_text()


def test_custom_template_errors(tmp_path: Path) -> None:
    with pytest.raises(MigrationFileNotFoundError):
        write_migration(tmp_path / "m", "x", template_path=tmp_path / "missing.py")
    txt = tmp_path / "tpl.txt"
    txt.write_text("x")
    with pytest.raises(ConfigInvalidError):
        write_migration(tmp_path / "m", "x", template_path=txt)
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (1024 * 1024 + 1))
    with pytest.raises(ConfigInvalidError) as info:
        write_migration(tmp_path / "m", "x", template_path=big)
    assert "1 MB" in info.value.message
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())
