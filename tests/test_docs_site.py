"""The documentation site's configuration agrees with the docs, the README, the package and the CLI.

Fast checks of what a reader meets outside the site; ``bash scripts/docs.sh`` (``mkdocs build
--strict``, run by CI) is what checks every link and anchor inside it, and renders the API
reference. Here:

* every page in ``docs/`` is in the nav of ``mkdocs.yml`` and every nav entry is a page;
* one documentation URL everywhere: ``site_url``, ``[project.urls]``, the CLI's help footers;
* the README (the package index page) has no link relative to the repository, and each of its
  links into the site names a page that exists;
* the README sections the site includes are marked in the README;
* no ``--help`` text points at a file of the source tree, and every one ends with the footer.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from migronaut.cli import main
from migronaut.cli.app import DOCS_URL, build_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MKDOCS = (ROOT / "mkdocs.yml").read_text("utf-8")
README = (ROOT / "README.md").read_text("utf-8")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))

#: Markdown links: [text](target) and [ref]: target.
LINK = re.compile(r"\]\((?P<inline>[^)\s]+)\)|^\[[^\]]+\]:\s+(?P<ref>\S+)", re.MULTILINE)
#: A snippet include: --8<-- "FILE" or --8<-- "FILE:section".
SNIPPET = re.compile(r'^--8<-- "(?P<file>[^":]+)(?::(?P<section>[\w-]+))?"$', re.MULTILINE)


def nav_pages() -> list[str]:
    nav = MKDOCS[MKDOCS.index("\nnav:\n"):]
    nav = nav[: re.search(r"\n\S", nav[1:]).end()]  # type: ignore[union-attr]
    return re.findall(r"^\s*- (?:[^:\n]+:\s*)?(\S+\.md)\s*$", nav, re.MULTILINE)


def doc_pages() -> set[str]:
    return {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")}


def site_url() -> str:
    match = re.search(r"^site_url:\s*(\S+)\s*$", MKDOCS, re.MULTILINE)
    assert match, "mkdocs.yml has no site_url"
    return match[1]


def readme_links() -> list[str]:
    return [m["inline"] or m["ref"] for m in LINK.finditer(README)]


def test_every_page_is_in_the_nav_once_and_every_nav_entry_is_a_page() -> None:
    nav = nav_pages()
    twice = sorted({page for page in nav if nav.count(page) > 1})
    assert not twice, f"pages listed twice in the nav: {twice}"
    assert set(nav) == doc_pages(), (
        f"not in the nav: {sorted(doc_pages() - set(nav))}; "
        f"in the nav but missing: {sorted(set(nav) - doc_pages())}"
    )
    assert re.search(r"^\s+omitted_files:\s*warn\s*$", MKDOCS, re.MULTILINE)
    assert re.search(r"^\s+anchors:\s*warn\s*$", MKDOCS, re.MULTILINE)
    assert re.search(r"^strict:\s*true\s*$", MKDOCS, re.MULTILINE)


def test_one_documentation_url_for_the_site_the_package_and_the_cli() -> None:
    assert site_url() == DOCS_URL
    assert DOCS_URL.startswith("https://") and DOCS_URL.endswith("/")
    urls = PYPROJECT["project"]["urls"]
    assert urls["Documentation"] == DOCS_URL
    assert urls["Changelog"] == DOCS_URL + "changelog/"
    assert "changelog.md" in nav_pages()
    assert urls["Source"].startswith("https://")
    assert re.search(rf"^repo_url:\s*{re.escape(urls['Source'])}\s*$", MKDOCS, re.MULTILINE)


def test_the_docs_extra_holds_the_site_builders() -> None:
    docs = " ".join(PYPROJECT["project"]["optional-dependencies"]["docs"])
    for package in ("mkdocs>=", "mkdocs-material>=", "mkdocstrings>=", "mkdocstrings-python>="):
        assert package in docs
    dependencies = (DOCS / "dependencies.md").read_text("utf-8")
    assert "| `docs` |" in dependencies and "mkdocs-material" in dependencies


def test_the_readme_links_work_on_the_package_index() -> None:
    links = readme_links()
    assert links, "no links found in the README"
    relative = [link for link in links if not re.match(r"https?://|#|mailto:", link)]
    assert not relative, f"relative links break on the package index page: {relative}"
    into_site = [link for link in links if link.startswith(DOCS_URL)]
    assert len(into_site) > 10
    for link in into_site:
        path = link[len(DOCS_URL):].split("#")[0].strip("/")
        page = (path or "index") + ".md"
        assert page in doc_pages(), f"{link}: no page {page} in docs/"


def test_the_readme_sections_the_site_includes_are_marked() -> None:
    includes = [m for page in DOCS.rglob("*.md") for m in SNIPPET.finditer(page.read_text("utf-8"))]
    assert {m["file"] for m in includes} >= {"README.md", "CHANGELOG.md"}
    for include in includes:
        assert (ROOT / include["file"]).is_file(), include[0]
        if include["section"]:
            text = (ROOT / include["file"]).read_text("utf-8")
            for edge in ("start", "end"):
                marker = f"<!-- --8<-- [{edge}:{include['section']}] -->"
                assert text.count(marker) == 1, f"{include['file']}: {marker} for {include[0]}"


def all_commands(cmd: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(cmd, click.Group):
        for name, sub in sorted(cmd.commands.items()):
            yield from all_commands(sub, (*path, name))


@pytest.mark.parametrize("command", [" ".join(path) for path in all_commands(build_cli())])
def test_help_points_at_the_docs_site_not_at_files_of_the_source_tree(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert not re.search(r"docs/\w|\w\.md\b|README|CHANGELOG", text), text
    assert text.rstrip().splitlines()[-1].strip().endswith(DOCS_URL + "cli/"), text
