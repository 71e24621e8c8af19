"""``migronaut create <name>``: write a new migration file. Never connects."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from migronaut.cli.app import command
from migronaut.cli.output import Output
from migronaut.cli.session import Session

if TYPE_CHECKING:
    from pathlib import Path


def _render(path: Path, out: Output) -> None:
    out.info(f"✔ Created  {path.name}")


@command(
    "create",
    help="Create a migration file NAME in the migrations directory "
    "(YYYYMMDDHHMMSS_<slug>.py, or 0001_<slug>.py with sequential = true).",
    short_help="Create a migration file.",
)
@click.argument("name")
@click.option("--template", metavar="PATH", help="Copy this .py file instead of the built-in "
              "template (overrides template_path).")
@click.option("--background", is_flag=True, help="Write a background migration skeleton "
              "(`background = {...}`; not with --template).")
def create(session: Session, name: str, template: str | None, background: bool) -> int:
    return session.run(
        lambda migrator: migrator.create(name, template=template, background=background),
        render=_render,
        to_json=lambda path: {"path": str(path)},
        connects=False,
        lenient=True,
    )
