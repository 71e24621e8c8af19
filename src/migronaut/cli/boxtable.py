"""The boxed tables of :func:`migronaut.cli.render.table`, laid out fast, drawn with rich's parts.

rich's ``Table`` lays a table out through several renderables per cell; over 10,000 rows (a
``status`` of a long-lived project) that takes 5–9 seconds and over 100 MB. A table whose columns
all fit the width at their natural size needs none of that layout, so this module keeps a fast
path of its own for the layout only — one line per row, each column as wide as its widest cell —
and takes everything drawn from rich: the border characters of ``box.SQUARE`` and the escape
sequences of ``rich.style.Style`` (the standard colour system, as the console of
:func:`migronaut.cli.render.console` uses). A table that does not fit (a narrow terminal, where
rich folds the wrapping columns) is left to rich's ``Table``: :func:`draw` returns ``None``.

Invariant: for every table it draws, the output equals rich's (a test compares them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["HEADER_STYLE", "draw"]

#: One cell: sanitised text and an SGR style (``None``: plain) — :data:`render.Cell`.
Cell = tuple[str, "str | None"]

#: The style of the header row, rich's ``header_style``.
HEADER_STYLE = "cyan"


def draw(
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    width: int,
    colour: bool,
    styles: Mapping[str, str],
) -> str | None:
    """The table as rich prints it (lines without trailing newline), or ``None`` when its
    natural width exceeds ``width`` or a cell holds a line break or a tab. ``styles`` maps a
    cell's SGR code to the rich style name it stands for; any other code draws plain, as rich's
    lookup does."""
    from rich.box import SQUARE
    from rich.cells import cell_len
    from rich.color import ColorSystem
    from rich.style import Style

    parsed = {code: Style.parse(name) for code, name in styles.items()} if colour else {}
    measured: list[list[tuple[str, int, Style | None]]] = []
    widths = [cell_len(column) for column in columns]
    count = len(widths)
    for row in rows:
        if len(row) != count:
            return None
        cells: list[tuple[str, int, Style | None]] = []
        for index, (text, code) in enumerate(row):
            if "\n" in text or "\t" in text:
                return None  # rich lays out multi-line cells and tab stops
            size = len(text) if text.isascii() else cell_len(text)
            if size > widths[index]:
                widths[index] = size
            cells.append((text, size, parsed.get(code) if code else None))
        measured.append(cells)
    if sum(widths) + 3 * count + 1 > width:
        return None

    def styled(text: str, style: Style | None) -> str:
        return style.render(text, color_system=ColorSystem.STANDARD) if style else text

    padded_widths = [size + 2 for size in widths]
    header_style = Style.parse(HEADER_STYLE) if colour else None
    header = [styled(" ", header_style) + styled(column + " " * (size - cell_len(column)),
                                                   header_style) + styled(" ", header_style)
              for column, size in zip(columns, widths, strict=True)]
    lines = [SQUARE.get_top(padded_widths).rstrip("\n"),
             SQUARE.head_left + SQUARE.head_vertical.join(header) + SQUARE.head_right,
             SQUARE.get_row(padded_widths, "head").rstrip("\n")]
    for cells in measured:
        parts = [f" {styled(text + ' ' * (column_width - size), style)} "
                 for (text, size, style), column_width in zip(cells, widths, strict=True)]
        lines.append(SQUARE.mid_left + SQUARE.mid_vertical.join(parts) + SQUARE.mid_right)
    lines.append(SQUARE.get_bottom(padded_widths).rstrip("\n"))
    return "\n".join(lines)
