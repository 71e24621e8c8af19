"""Confirmation prompts: ``[y/N]`` on stderr, answered on stdin.

Only ``y``/``yes`` (case-insensitive, trimmed) is a yes. A stdin that is closed or at EOF before
an answer is a ``CONFIG_INVALID`` error (exit 6), never a silent "no", so a script that forgot
``--yes`` fails loudly instead of doing nothing.
"""

from __future__ import annotations

import sys

from migronaut._redact import redact, sanitize_terminal
from migronaut.cli.output import Output
from migronaut.errors import ConfigInvalidError

__all__ = ["confirm"]

YES = frozenset({"y", "yes"})


def confirm(output: Output, question: str) -> bool:
    """Ask ``question`` (which ends in ``[y/N] ``) and return whether the answer is yes."""
    with output.lock:
        output.spinner.hide()
        try:
            output.stderr.write(sanitize_terminal(redact(question)))
            output.stderr.flush()
        except (OSError, ValueError):
            pass
    try:
        answer = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):  # closed or unreadable stdin
        answer = ""
    if not answer:
        with output.lock:
            try:
                output.stderr.write("\n")
            except (OSError, ValueError):
                pass
        raise ConfigInvalidError(
            "stdin closed before the confirmation was answered — pass --yes to confirm "
            "non-interactively",
            {"option": "yes"},
        )
    if not _isatty(sys.stdin):  # nobody's Enter key echoed the newline
        with output.lock:
            try:
                output.stderr.write("\n")
            except (OSError, ValueError):
                pass
    return answer.strip().lower() in YES


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False
