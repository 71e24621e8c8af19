"""``python -m migronaut`` — the same CLI as the ``migronaut`` console script."""

from migronaut.cli import entry

entry()
