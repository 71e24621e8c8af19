"""Where definitions come from: inline ``collections`` and the files of ``collections_dir``.

Invariants: inline definitions come first (list order), then the files (sorted by name); a
collection name is declared once across both. Definition *files* are read only by
:func:`load_definitions` — resolving the config never imports them, so a broken file cannot
block ``status`` or an emergency ``down``. Every issue of every source is raised together as one
``CONFIG_INVALID`` (``Invalid collection definition(s)``).

Directory rules: non-recursive; regular files only; names starting with ``.`` and
``__init__.py`` skipped; accepted extensions are the config's ``file_extensions`` (Python
modules, default ``.py``) plus ``.json``, matched by the longest suffix; the collection is named
after the file unless the definition sets ``name``.

A ``.py`` definition file is read like a migration file: its **module-level names** are the
definition (``indexes = [...]``, ``validator = {...}``, ``search_indexes``, ``name`` …).
Names starting with ``_``, UPPER_CASE constants, modules, and functions or classes imported from
elsewhere are not part of it; a function or class *defined* in the file is refused (a model class
is not a definition). A ``.json`` file holds one object with the original's camelCase keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migronaut.core.files import left_while_loading, load_module
from migronaut.declared.definition import (
    TOO_DEEP,
    CollectionDefinition,
    Style,
    module_definition,
    validate_definition,
)
from migronaut.declared.inline import reserved_names, validate_inline
from migronaut.declared.issues import Issues, invalid_definitions
from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.core.config import Config

__all__ = ["load_definitions"]

JSON_EXTENSION = ".json"


def _reserved(config: Config) -> frozenset[str]:
    return reserved_names(
        migrations_collection=config.migrations_collection,
        lock_collection=config.lock_collection,
        converge_log_collection=config.converge_log_collection,
        background_collection=config.background_collection,
        runs_collection=config.runs_collection,
    )


def load_definitions(config: Config) -> tuple[CollectionDefinition, ...]:
    """Every declared collection of ``config``: the inline ones, then the files of
    ``collections_dir`` (imported now, never earlier). Raises one ``CONFIG_INVALID`` listing
    every issue of every source."""
    issues = Issues()
    reserved = _reserved(config)
    definitions = validate_inline(config.collections, issues, reserved)
    declared = {definition.name: definition.source for definition in definitions}
    first_failure: BaseException | None = None
    if config.collections_dir:
        directory = Path(config.cwd) / config.collections_dir
        for path, extension in _definition_files(directory, config.file_extensions):
            file_issues = Issues(prefix=path.name)
            raw, failure = _read_file(path, extension, file_issues,
                                      reload=config.reload_migrations)
            first_failure = first_failure or failure
            if raw is not None:
                style: Style = "json" if extension == JSON_EXTENSION else "python"
                definition = validate_definition(
                    raw, file_issues, style=style, source=path.name,
                    fallback_name=path.name[: -len(extension)], reserved=reserved,
                )
                if definition is not None and definition.name in declared:
                    file_issues.add("name", f'"{definition.name}" is already declared in '
                                    f"{declared[definition.name]}")
                elif definition is not None:
                    declared[definition.name] = path.name
                    definitions.append(definition)
            issues.extend(file_issues)
    if issues:
        raise invalid_definitions(issues, cause=first_failure)
    return tuple(definitions)


def _definition_files(
    directory: Path, extensions: Collection[str]
) -> list[tuple[Path, str]]:
    """The definition files of ``directory`` in byte order of their names, with the extension
    each matched (the longest)."""
    try:
        found = os.stat(directory)
    except FileNotFoundError:
        found = None
    except OSError as error:
        raise _directory_error(directory, "could not be read", error) from error
    if found is None or not stat.S_ISDIR(found.st_mode):
        raise ConfigInvalidError(
            f"collections_dir not found: {directory}",
            {"path": str(directory), "issues": [
                {"path": "collections_dir", "message": f"not found or not a directory: "
                 f"{directory}"}]},
        )
    accepted = sorted({*extensions, JSON_EXTENSION}, key=len, reverse=True)
    try:
        names = sorted(os.listdir(directory))
    except OSError as error:
        raise _directory_error(directory, "could not be read", error) from error
    out: list[tuple[Path, str]] = []
    for name in names:
        if name.startswith(".") or name == "__init__.py":
            continue
        extension = next((ext for ext in accepted
                          if name.endswith(ext) and len(name) > len(ext)), None)
        path = directory / name
        if extension is not None and path.is_file():
            out.append((path, extension))
    return out


def _directory_error(directory: Path, problem: str, error: OSError) -> ConfigInvalidError:
    return ConfigInvalidError(
        f"collections_dir {problem}: {directory} ({error.strerror or error})",
        {"path": str(directory)}, cause=error,
    )


def _read_file(
    path: Path, extension: str, issues: Issues, *, reload: bool
) -> tuple[Any, BaseException | None]:
    """The raw definition in ``path`` (``None`` with an issue when it cannot be read or is
    JSON ``null``)."""
    if extension == JSON_EXTENSION:
        try:
            raw = json.loads(path.read_bytes())
        except json.JSONDecodeError as error:
            issues.add("", f"is not valid JSON: {error.msg} (line {error.lineno}, column "
                       f"{error.colno})")
            return None, error
        except RecursionError as error:
            issues.add("", f"is nested too deeply to read ({TOO_DEEP})")
            return None, error
        except (OSError, UnicodeDecodeError) as error:
            issues.add("", f"could not be read: {error}")
            return None, error
        if raw is None:  # null: ``None`` below means "could not be read"
            issues.add("", "must be a mapping (got null)")
        return raw, None
    try:
        module = load_module(path, _module_name(path), reload=reload)
    except (KeyboardInterrupt, SystemExit) as error:
        left = left_while_loading(error, path, "Declaration file")
        if left is None:
            raise
        raise left from error
    except BaseException as error:
        detail = f"SyntaxError: {error.msg} (line {error.lineno})" \
            if isinstance(error, SyntaxError) else f"{type(error).__name__}: {error}"
        issues.add("", f"failed to load: {detail}")
        return None, error
    return module_definition(module, issues), None


def _module_name(path: Path) -> str:
    slug = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    return f"_migronaut_collection_{slug}_{digest}"

