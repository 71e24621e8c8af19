"""MkDocs hooks for the documentation site (mkdocs.yml ``hooks:``).

The README links to the site by absolute URL, so its links work wherever it is read (the package
index, a source host). The site includes parts of the README (``pymdownx.snippets``); there,
those links are turned back into links between pages, so that ``mkdocs build --strict`` checks
them like any other: a link to a page or an anchor that does not exist fails the build.

The rewrite runs as a Markdown preprocessor just after snippets have been inserted, before MkDocs
resolves and validates links.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

#: The page being rendered (MkDocs renders one page at a time).
_current_page: list[str] = ["index.md"]


class _SiteLinks(Preprocessor):
    def __init__(self, md: Markdown, site_url: str) -> None:
        super().__init__(md)
        # [text](URL) and [ref]: URL, where URL is under the site
        self.pattern = re.compile(
            r"(?P<lead>\]\(|\]:[ \t]+)"
            + re.escape(site_url)
            + r"(?P<path>[^)\s#]*)(?P<anchor>#[^)\s]*)?"
        )

    def run(self, lines: list[str]) -> list[str]:
        here = posixpath.dirname(_current_page[0])
        return [self.pattern.sub(lambda m: self._relative(m, here), line) for line in lines]

    @staticmethod
    def _relative(match: re.Match[str], here: str) -> str:
        path = match["path"].strip("/")
        target = (path or "index") + ".md"
        return match["lead"] + posixpath.relpath(target, here or ".") + (match["anchor"] or "")


class _SiteLinksExtension(Extension):
    def __init__(self, site_url: str) -> None:
        super().__init__()
        self.site_url = site_url

    def extendMarkdown(self, md: Markdown) -> None:  # Markdown's API
        # pymdownx.snippets inserts included files at priority 32; run right after it
        md.preprocessors.register(_SiteLinks(md, self.site_url), "migronaut_site_links", 31)


def on_config(config: Any) -> Any:
    # `mkdocs serve` replaces site_url with its own address: read the published one from the file
    with open(config.config_file_path, encoding="utf-8") as file:
        match = re.search(r"^site_url:\s*(\S+?)/?\s*$", file.read(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{config.config_file_path}: no site_url")
    config["markdown_extensions"].append(_SiteLinksExtension(match[1] + "/"))
    return config


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    _current_page[0] = page.file.src_uri
    return markdown
