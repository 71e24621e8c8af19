"""Human renderings of command results: tables (the status table, …) and the lock lines.

Every value that came from the database or the disk (names, hosts, users) is passed through
:func:`~migronaut._redact.sanitize_terminal` before it reaches the terminal. rich is imported
here, lazily, only when a table is actually drawn.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING

from migronaut._redact import sanitize_terminal
from migronaut.cli import boxtable
from migronaut.cli.output import CYAN, DIM, GREEN, INFO, RED, YELLOW, Output

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from migronaut.core.results import LockInfo, StatusRow

__all__ = ["applied_at", "console", "describe_holder", "rich_table", "status_table", "table"]

STATUS_COLUMNS = ("Migration", "Status", "Batch", "Applied At", "Duration", "Checksum",
                  "Description")
_STATUS_STYLE = {"applied": GREEN, "pending": YELLOW, "failed": RED, "running": CYAN,
                 "in-doubt": RED}
_SGR_NAMES = {CYAN: "cyan", DIM: "dim", GREEN: "green", RED: "red", YELLOW: "yellow"}


def applied_at(value: dt.datetime | None) -> str:
    """A changelog timestamp (UTC) in local time, ``YYYY-MM-DD HH:MM:SS``."""
    if value is None:
        return ""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _cells(row: StatusRow) -> list[tuple[str, str | None]]:
    if row.checksum_ok is None:
        checksum = ("—", DIM)
    else:
        checksum = ("ok", GREEN) if row.checksum_ok else ("MISMATCH", RED)
    return [
        (sanitize_terminal(row.file), None),
        (row.status.replace("-", " "), _STATUS_STYLE.get(row.status)),
        ("" if row.batch is None else str(row.batch), None),
        (applied_at(row.applied_at), None),
        ("" if row.duration is None else f"{row.duration}ms", None),
        checksum,
        (sanitize_terminal(row.description or ""), None),
    ]


def status_table(rows: Sequence[StatusRow], output: Output) -> None:
    """The ``Migration | Status | Batch | Applied At | Duration | Checksum | Description``
    table; on a terminal too narrow for it, long names and descriptions end in ``…``."""
    if not rows:
        output.info("No migrations found")
        return
    table(STATUS_COLUMNS, [_cells(row) for row in rows], output,
          shorten=("Migration", "Description"))


#: One table cell: sanitised text and an SGR style (``None``: plain).
Cell = tuple[str, str | None]


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    output: Output,
    *,
    wrap: Sequence[str] = (),
    shorten: Sequence[str] = (),
) -> None:
    """Draw a boxed table of ``(text, SGR style)`` cells at info level (``--quiet`` hides it).

    Cell texts must already be sanitised; only the ``wrap`` columns may fold, and the
    ``shorten`` ones are cut with ``…`` when the table is wider than the terminal.
    """
    if not output.enabled(INFO):
        return
    import io

    stream = output.stream_for(INFO)
    width = _width(stream)
    drawn = boxtable.draw(columns, rows, width=width, colour=output.colour(stream),
                          styles=_SGR_NAMES)
    if drawn is None:  # too wide: rich folds the ``wrap`` columns, cuts the ``shorten`` ones
        buffer = io.StringIO()
        limits = _shortened_widths(columns, rows, shorten, width)
        console(output, buffer, stream).print(rich_table(columns, rows, wrap=wrap,
                                                         shorten=limits))
        drawn = buffer.getvalue()
    output.block("\n".join(line.rstrip() for line in drawn.splitlines()))


def _shortened_widths(columns: Sequence[str], rows: Sequence[Sequence[Cell]],
                      shorten: Sequence[str], width: int) -> dict[str, int]:
    """The widths the ``shorten`` columns get so that the table fits ``width``: what the
    other columns leave (borders and padding counted), shared in proportion to their natural
    widths, at least :data:`MIN_SHORTENED` each."""
    from rich.cells import cell_len

    natural = [max([cell_len(column), *(cell_len(row[i][0]) for row in rows if i < len(row))])
               for i, column in enumerate(columns)]
    chosen = [i for i, column in enumerate(columns) if column in shorten]
    if not chosen:
        return {}
    fixed = sum(size for i, size in enumerate(natural) if i not in chosen)
    room = width - fixed - 3 * len(columns) - 1
    wanted = sum(natural[i] for i in chosen)
    return {columns[i]: max(MIN_SHORTENED, min(natural[i], room * natural[i] // max(wanted, 1)))
            for i in chosen}


#: The narrowest a shortened column gets (then the table is wider than the terminal).
MIN_SHORTENED = 8


def rich_table(
    columns: Sequence[str], rows: Sequence[Sequence[Cell]], *, wrap: Sequence[str] = (),
    shorten: Mapping[str, int] | None = None, title: str | None = None,
) -> Table:
    """The rich ``Table`` of :func:`table` (for live views that redraw it); a ``shorten``
    column is cut with ``…`` at its width."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    drawn = Table(box=box.SQUARE, header_style=boxtable.HEADER_STYLE, show_edge=True, pad_edge=True,
                  title=title, title_justify="left")
    for column in columns:
        if shorten and column in shorten:
            drawn.add_column(column, no_wrap=True, overflow="ellipsis",
                             max_width=shorten[column])
        else:
            drawn.add_column(column, no_wrap=column not in wrap, overflow="fold")
    for row in rows:
        drawn.add_row(*(Text(text, style=_SGR_NAMES.get(style or "", "")) for text, style in
                        row))
    return drawn


def console(output: Output, file: IO[str], stream: IO[str]) -> Console:
    """A rich console writing to ``file`` with the colour decision and width of ``stream``."""
    from rich.console import Console

    colour = output.colour(stream)
    return Console(
        file=file,
        width=_width(stream),
        color_system="standard" if colour else None,
        force_terminal=colour,
        no_color=not colour,
        highlight=False,
        markup=False,
        emoji=False,
        _environ={},
    )


def _width(stream: IO[str]) -> int:
    """The width tables are drawn to: the terminal's, or unlimited when not a terminal."""
    import shutil

    return shutil.get_terminal_size().columns if _isatty(stream) else 10_000


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


def describe_holder(holder: LockInfo) -> str:
    """``pid <pid> on <host> (<user>) since <ISO lockedAt>``, sanitised."""
    return sanitize_terminal(holder.describe())
