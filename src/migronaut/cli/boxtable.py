"""The boxed tables of :func:`migronaut.cli.render.table`, drawn without rich when they fit.

rich lays a table out through several renderables per cell; over 10,000 rows (a ``status`` of a
long-lived project) that took seconds and over 100 MB. A table whose columns all fit the width
at their natural size needs none of that layout: this module draws it line by line, **byte for
byte what rich draws** (``box.SQUARE``, one space of padding, a cyan header, one SGR style per
cell, the same escape sequences with colour). A table that does not fit (a narrow terminal,
where rich folds the wrapping columns) is left to rich: :func:`draw` returns ``None``.

Invariant: for every table it draws, the output equals rich's (a test compares them).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["draw"]

#: One cell: sanitised text and an SGR style (``None``: plain) — :data:`render.Cell`.
Cell = tuple[str, "str | None"]

_HEADER_STYLE = "36"  # cyan, rich's ``header_style="cyan"``
_RESET = "\x1b[0m"


def draw(
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    width: int,
    colour: bool,
    styles: frozenset[str],
) -> str | None:
    """The table as rich prints it (lines without trailing newline), or ``None`` when its
    natural width exceeds ``width`` or a cell holds a line break or a tab. ``styles`` are the SGR
    codes rich is given names for; any other style draws plain, as rich's lookup does."""
    from rich.cells import cell_len

    measured: list[list[tuple[str, int, str | None]]] = []
    widths = [cell_len(column) for column in columns]
    count = len(widths)
    for row in rows:
        if len(row) != count:
            return None
        cells: list[tuple[str, int, str | None]] = []
        for index, (text, style) in enumerate(row):
            if "\n" in text or "\t" in text:
                return None  # rich lays out multi-line cells and tab stops
            size = len(text) if text.isascii() else cell_len(text)
            if size > widths[index]:
                widths[index] = size
            cells.append((text, size, style if colour and style in styles else None))
        measured.append(cells)
    if sum(widths) + 3 * count + 1 > width:
        return None
    rules = ["─" * (size + 2) for size in widths]
    lines = ["┌" + "┬".join(rules) + "┐"]
    header = []
    for column, size in zip(columns, widths, strict=True):
        padded = column + " " * (size - cell_len(column))
        if colour:
            code = f"\x1b[{_HEADER_STYLE}m"
            header.append(f"{code} {_RESET}{code}{padded}{_RESET}{code} {_RESET}")
        else:
            header.append(f" {padded} ")
    lines.append("│" + "│".join(header) + "│")
    lines.append("├" + "┼".join(rules) + "┤")
    for cells in measured:
        parts = []
        for (text, size, style), column_width in zip(cells, widths, strict=True):
            padded = text + " " * (column_width - size)
            parts.append(f" \x1b[{style}m{padded}{_RESET} " if style else f" {padded} ")
        lines.append("│" + "│".join(parts) + "│")
    lines.append("└" + "┴".join(rules) + "┘")
    return "\n".join(lines)
