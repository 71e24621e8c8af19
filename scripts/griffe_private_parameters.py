"""A Griffe extension for the API reference: signatures show only the parameters users pass.

A parameter whose name starts with one underscore (``Migrator(..., _flags_origin=...)``) is how
the CLI talks to the API without widening the public surface; the reference hides it from the
rendered signature and from the parameter table, as ``filters: ["!^_"]`` hides private members.
Dunder names are left alone. ``scripts/docs.sh build`` checks the built pages for any left.
"""

from __future__ import annotations

from typing import Any

import griffe


def is_private(name: str) -> bool:
    """``_name`` but not ``__name__``-style dunders."""
    return name.startswith("_") and not name.startswith("__")


class HidePrivateParameters(griffe.Extension):
    """Drop every private parameter of every function (``__init__`` included) once loaded."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        for parameter in list(func.parameters):
            if is_private(parameter.name):
                del func.parameters[parameter.name]
