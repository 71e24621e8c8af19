"""``create``: a new migration file from the built-in template, a custom one, or the background
skeleton.

Invariant: needs no database and no valid database settings — a config file that fails to load is
skipped with a warning (:meth:`~migronaut.core.project.Project.lenient_config`), so an unreachable
secret manager never blocks writing a new file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from migronaut.errors import ConfigInvalidError

if TYPE_CHECKING:
    from migronaut.core.project import Project

__all__ = ["create"]


def create(
    project: Project,
    name: str,
    *,
    template: str | os.PathLike[str] | None,
    background: bool,
) -> Path:
    """Write a new migration file; ``background`` (the skeleton) excludes ``template``."""
    from migronaut.core.templates import write_migration

    if background and template is not None:
        raise ConfigInvalidError(
            "--background cannot be combined with --template: the background skeleton is "
            "its own template",
            {"options": ["--background", "--template"]},
        )
    config = project.lenient_config()
    skeleton: str | None = None
    if background:
        from migronaut.background.planning.spec import SKELETON

        skeleton = SKELETON
    template_path = template if template is not None else config.template_path
    return write_migration(
        config.migrations_path,
        name,
        extensions=config.file_extensions,
        sequential=config.sequential,
        template_path=Path(config.cwd, template_path) if template_path and not background
        else None,
        template=skeleton,
        origin=config.origin("migrations_dir"),
    )
