"""The CLI commands, one module per concern; each registers itself with :func:`..app.command`.

Shared here: the JSON shapes of results (the ``to_dict()`` of the engine's result types).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from migronaut.core.results import RunResult, StatusRow

__all__ = ["rows_json", "run_results_json"]


def run_results_json(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """``RunResult[]`` as ``up``/``down``/``redo`` print it."""
    return [result.to_dict() for result in results]


def rows_json(rows: Sequence[StatusRow]) -> list[dict[str, Any]]:
    """``StatusRow[]`` as ``status``/``list``/``dry-run`` print it."""
    return [row.to_dict() for row in rows]
