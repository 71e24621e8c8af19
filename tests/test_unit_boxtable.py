"""The boxed tables drawn without rich are byte for byte rich's, and rich still draws the rest."""

from __future__ import annotations

import io
import random
import sys

import pytest

from migronaut.cli import boxtable
from migronaut.cli.output import CYAN, DIM, GREEN, RED, YELLOW
from migronaut.cli.render import _SGR_NAMES, console, rich_table

STYLES = [None, GREEN, YELLOW, RED, DIM, CYAN, "1"]  # "1" (bold) is not one rich is given
WORDS = ["", "ok", "applied", "20240101000000_bench_00001.py", "é", "naïve_ü.py", "日本語.py",
         "—", "2024-01-01 00:00:00", "12ms", "a b  c", "🙂", "x" * 40]


class _Output:
    def __init__(self, colour: bool) -> None:
        self._colour = colour

    def colour(self, stream: object) -> bool:
        return self._colour


def _rich(columns: list[str], rows: list[list[tuple[str, str | None]]], *, colour: bool,
          width: int, wrap: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    drawn = console(_Output(colour), buffer, sys.stdout)  # type: ignore[arg-type]
    drawn.width = width
    drawn.print(rich_table(columns, rows, wrap=wrap))
    return buffer.getvalue()


@pytest.mark.parametrize("seed", range(40))
def test_a_table_that_fits_is_drawn_as_rich_draws_it(seed: int) -> None:
    rng = random.Random(seed)
    columns = [rng.choice(["Migration", "Status", "Batch", "Applied At", "Ü", "X"])
               for _ in range(rng.randint(1, 6))]
    rows = [[(rng.choice(WORDS), rng.choice(STYLES)) for _ in columns]
            for _ in range(rng.randint(0, 12))]
    colour = seed % 2 == 0
    width = rng.choice([10_000, 200, 80, 40])
    drawn = boxtable.draw(columns, rows, width=width, colour=colour,
                          styles=_SGR_NAMES)
    expected = _rich(columns, rows, colour=colour, width=width, wrap=(columns[0],))
    if drawn is None:  # too wide: left to rich, which folds
        from rich.cells import cell_len

        natural = [max([cell_len(c)] + [cell_len(r[i][0]) for r in rows])
                   for i, c in enumerate(columns)]
        assert sum(natural) + 3 * len(columns) + 1 > width
        return
    assert drawn + "\n" == expected


def test_a_table_exactly_as_wide_as_the_terminal_is_drawn_and_one_column_more_is_not() -> None:
    columns, rows = ["Migration"], [[("0001_a.py", GREEN)]]
    fits = 9 + 3 + 1
    assert boxtable.draw(columns, rows, width=fits, colour=True,
                         styles=_SGR_NAMES) + "\n" == \
        _rich(columns, rows, colour=True, width=fits, wrap=())
    assert boxtable.draw(columns, rows, width=fits - 1, colour=True,
                         styles=_SGR_NAMES) is None


@pytest.mark.parametrize("text", ["two\nlines", "a\ttab"])
def test_line_breaks_and_tabs_are_left_to_rich(text: str) -> None:
    assert boxtable.draw(["A"], [[(text, None)]], width=10_000, colour=False,
                         styles={}) is None
