"""Fail the docs build when a rendered API signature shows a private parameter.

``scripts/griffe_private_parameters.py`` hides ``_name`` parameters from the API reference; this
check reads the built pages (``site/reference/**/*.html``) and lists any that still show one, so
a new private parameter — or a change in how mkdocstrings renders signatures — cannot slip
through. Usage: ``python scripts/check_api_signatures.py [SITE_DIR]``; exit 1 on a finding.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: A parameter name in a highlighted signature: ``<span class="n">_name</span>`` followed by
#: its annotation (``:``), its default (``=``) or the next parameter (``,``).
PRIVATE_PARAMETER = re.compile(
    r'<span class="n">(_(?!_)\w*)</span>\s*<span class="(?:p|o)">[:=,)]')


def findings(site: Path) -> list[str]:
    """``page: name`` for every private parameter shown in a signature under ``site``."""
    found = []
    for page in sorted((site / "reference").rglob("*.html")):
        for match in PRIVATE_PARAMETER.finditer(page.read_text(encoding="utf-8")):
            found.append(f"{page.relative_to(site)}: {match[1]}")
    return found


def main(argv: list[str]) -> int:
    site = Path(argv[0] if argv else "site")
    found = findings(site)
    for line in found:
        print(f"private parameter in a rendered signature: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
