"""The CLI commands, one module per concern; each registers itself with :func:`..app.command`.

The JSON shapes of results (the ``to_dict()`` of the engine's result types) live in
:mod:`migronaut.core.results`, shared with the dashboard; re-exported here for the commands.
"""

from __future__ import annotations

from migronaut.core.results import rows_json, run_results_json

__all__ = ["rows_json", "run_results_json"]
