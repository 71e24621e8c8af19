"""The background queue's tasks: the coordinator, lanes and the periodic verify."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from migronaut.executors.celery.installation import MigronautCelery

__all__ = ["register"]


def register(installed: MigronautCelery, options: dict[str, Any]) -> None:
    """Register the background queue's tasks on ``installed.app``."""
