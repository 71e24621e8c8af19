"""Everything the CLI writes: human lines, JSON documents, the spinner, and the log bridge.

Invariants:

* Text leaves through :class:`Output` only, and :class:`Output` redacts credentials from every
  string and strips terminal control sequences from every human line before it adds its own
  colours (reference core §2.3), so nothing a database or a config file holds can leak a secret
  or drive the terminal.
* Streams: debug/info lines go to stdout (stderr in ``--json`` mode, where stdout carries exactly
  one JSON document); warnings and errors always go to stderr.
* Colour is a yes/no decision per stream (:func:`colour_enabled`); the spinner exists only on a
  TTY stderr at the normal level and never in ``--json`` mode.
* With ``--log-format json`` every line (the CLI's and the engine's) is one JSON object on
  stderr instead; stdout keeps only results (tables, the ``--json`` document).
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import threading
from collections.abc import Mapping
from typing import IO, Any, Final

from migronaut._redact import redact, redact_value, sanitize_terminal

__all__ = [
    "DEBUG",
    "DIM",
    "ERROR",
    "GREEN",
    "INFO",
    "RED",
    "WARNING",
    "YELLOW",
    "Output",
    "Spinner",
    "SpinnerProgress",
    "colour_enabled",
    "paint",
]

CYAN: Final = "36"
DIM: Final = "2"
GREEN: Final = "32"
RED: Final = "31"
YELLOW: Final = "33"

#: The levels of :mod:`logging` (not imported here: ``--help`` must stay fast).
DEBUG: Final = 10
INFO: Final = 20
WARNING: Final = 30
ERROR: Final = 40

_LEVEL_STYLE: Final = {DEBUG: DIM, WARNING: YELLOW, ERROR: RED}


def colour_enabled(
    stream: IO[str] | None, *, no_color_flag: bool = False, environ: Mapping[str, str] | None = None
) -> bool:
    """Whether to colour ``stream``; the first rule that decides wins (reference core §2.3).

    ``--no-color`` > ``MIGRONAUT_FORCE_COLOR`` > ``MIGRONAUT_NO_COLOR`` > ``FORCE_COLOR`` >
    ``NO_COLOR`` > ``TERM=dumb`` > the stream is a TTY. A ``*FORCE_COLOR`` that is set and
    non-empty decides (``0`` = off, anything else = on); a ``*NO_COLOR`` set and non-empty forces
    colour off.
    """
    env = os.environ if environ is None else environ
    if no_color_flag:
        return False
    pairs = (("MIGRONAUT_FORCE_COLOR", "MIGRONAUT_NO_COLOR"), ("FORCE_COLOR", "NO_COLOR"))
    for force, deny in pairs:
        forced = env.get(force, "")
        if forced:
            return forced.strip() != "0"
        if env.get(deny, ""):
            return False
    if env.get("TERM") == "dumb":
        return False
    return _isatty(stream)


def _isatty(stream: IO[str] | None) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def paint(text: str, style: str | None, enabled: bool) -> str:
    """Wrap ``text`` in one SGR style when colour is enabled."""
    if not enabled or not style or not text:
        return text
    return f"\x1b[{style}m{text}\x1b[0m"




class Output:
    """The CLI's writer for one invocation: level, mode, colour, and the spinner's lock.

    Streams are looked up on every write (``sys.stdout``/``sys.stderr``), so redirections made
    before or during a run (tests, ``contextlib.redirect_stdout``) are honoured.
    """

    def __init__(
        self,
        *,
        json_mode: bool = False,
        level: int = INFO,
        no_color_flag: bool = False,
        log_format: str = "text",
    ) -> None:
        self.json_mode = json_mode
        #: ``text`` (human lines) or ``json`` (machine log lines on stderr).
        self.log_format = log_format
        self.level = level
        self.no_color_flag = no_color_flag
        self.lock = threading.RLock()
        self.spinner = Spinner(self)
        #: Set when a write found stdout closed (``| head -1``): later stdout writes are dropped.
        self.stdout_closed = False

    # -- streams and colour -------------------------------------------------------------------
    @property
    def stdout(self) -> IO[str]:
        return sys.stdout

    @property
    def stderr(self) -> IO[str]:
        return sys.stderr

    def colour(self, stream: IO[str]) -> bool:
        return colour_enabled(stream, no_color_flag=self.no_color_flag)

    def enabled(self, level: int) -> bool:
        return level >= self.level

    def stream_for(self, level: int) -> IO[str]:
        if level >= WARNING or self.json_mode:
            return self.stderr
        return self.stdout

    # -- writing ------------------------------------------------------------------------------
    def line(self, level: int, text: str, *, style: str | None = None) -> None:
        """One human line at ``level`` (dropped below the current level)."""
        if not self.enabled(level):
            return
        if self.log_format == "json":
            self.log_json(level, "migronaut.cli", text)
            return
        stream = self.stream_for(level)
        clean = sanitize_terminal(redact(text))
        self.write(stream, paint(clean, style or _LEVEL_STYLE.get(level), self.colour(stream)))

    def debug(self, text: str) -> None:
        self.line(DEBUG, text)

    def info(self, text: str, *, style: str | None = None) -> None:
        self.line(INFO, text, style=style)

    def warn(self, text: str) -> None:
        self.line(WARNING, text)

    def error(self, text: str) -> None:
        self.line(ERROR, text)

    def detail(self, text: str) -> None:
        """``--verbose`` detail of an error (cause chain, traceback): dimmed, on stderr."""
        if self.enabled(DEBUG) and self.log_format == "json":
            self.log_json(DEBUG, "migronaut.cli", text)
        elif self.enabled(DEBUG):
            clean = sanitize_terminal(redact(text))
            self.write(self.stderr, paint(clean, DIM, self.colour(self.stderr)))

    def note(self, text: str) -> None:
        """An informational line that must stay off stdout (stdout carries data)."""
        if self.enabled(INFO) and self.log_format == "json":
            self.log_json(INFO, "migronaut.cli", text)
        elif self.enabled(INFO):
            self.write(self.stderr, sanitize_terminal(redact(text)))

    def result_line(self, text: str) -> None:
        """A data line on stdout that ``--quiet`` keeps (e.g. the dev server's URI)."""
        self.write(self.stdout, sanitize_terminal(redact(text)))

    def log_json(
        self,
        level: int,
        logger: str,
        text: str,
        fields: Mapping[str, Any] | None = None,
        *,
        at: dt.datetime | None = None,
        traceback: str | None = None,
    ) -> None:
        """One machine log line on stderr (``--log-format json``)."""
        from migronaut.observability.jsonlog import json_log_line

        self.write(self.stderr, json_log_line(level=level, logger=logger, msg=text, fields=fields,
                                              at=at, traceback=traceback))

    def block(self, text: str) -> None:
        """Pre-rendered (already sanitised, possibly coloured) info text, e.g. a table."""
        if self.enabled(INFO):
            self.write(self.stream_for(INFO), redact(text.rstrip("\n")))

    def json(self, document: Any, *, compact: bool = False) -> None:
        """The one JSON document of ``--json`` mode: redacted, 2-space indent, newline.

        ``compact`` writes it on one line instead (a stream of documents, one per line).
        """
        import json

        from migronaut._json import json_default

        encoding = (getattr(self.stdout, "encoding", None) or "utf-8").lower()
        text = json.dumps(redact_value(document), indent=None if compact else 2,
                          default=json_default, ensure_ascii=not encoding.startswith("utf"))
        self.write(self.stdout, text)

    def write(self, stream: IO[str], text: str) -> None:
        """Write ``text`` + newline, clearing the spinner line first; a closed pipe is fine."""
        if stream is self.stdout and self.stdout_closed:
            return
        with self.lock:
            self.spinner.clear_line()
            try:
                try:
                    stream.write(text + "\n")
                except UnicodeEncodeError:  # a legacy console encoding: degrade the symbols
                    encoding = getattr(stream, "encoding", None) or "ascii"
                    stream.write(text.encode(encoding, "replace").decode(encoding) + "\n")
                stream.flush()
            except BrokenPipeError:  # the reader went away (`| head`): not our failure
                if stream is self.stdout:
                    self.stdout_closed = True
                    _silence_stdout()


def _silence_stdout() -> None:
    """Point a closed stdout at /dev/null so the interpreter's final flush cannot fail."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except OSError:
        pass


class Spinner:
    """A one-line progress indicator on stderr, redrawn by a daemon thread.

    A no-op unless :meth:`enable` was called (TTY stderr, normal level, not ``--json``). Every
    other write goes through :meth:`Output.write`, which clears the spinner's line first under
    the shared lock, so log lines never splice into a frame.
    """

    FRAMES: Final = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
    INTERVAL_S: Final = 0.08

    def __init__(self, output: Output) -> None:
        self._output = output
        self._enabled = False
        self._text: str | None = None
        self._drawn = False
        self._frame = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        """Stop and never show again (machine log lines must not be interleaved with it)."""
        self.stop()
        self._enabled = False

    def show(self, text: str) -> None:
        """Show (or replace) the spinner's text; starts the drawing thread on first use."""
        if not self._enabled:
            return
        with self._output.lock:
            self._text = sanitize_terminal(redact(text))
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._loop, name="migronaut-spinner", daemon=True
                )
                self._thread.start()
            self._draw()

    def hide(self) -> None:
        if not self._enabled:
            return
        with self._output.lock:
            self._text = None
            self.clear_line()

    def stop(self) -> None:
        """Stop the thread and clear the line (idempotent)."""
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join()
        with self._output.lock:
            self._text = None
            self.clear_line()

    def clear_line(self) -> None:
        """Erase the drawn frame (caller holds the output lock)."""
        if self._drawn:
            self._raw("\r\x1b[2K")
            self._drawn = False

    def _loop(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            with self._output.lock:
                self._frame = (self._frame + 1) % len(self.FRAMES)
                self._draw()

    def _draw(self) -> None:
        if self._text is None:
            return
        stream = self._output.stderr
        frame = paint(self.FRAMES[self._frame], CYAN, self._output.colour(stream))
        self._raw(f"\r\x1b[2K{frame} {self._text}")
        self._drawn = True

    def _raw(self, text: str) -> None:
        try:
            self._output.stderr.write(text)
            self._output.stderr.flush()
        except (OSError, ValueError):
            pass


class SpinnerProgress:
    """The :class:`~migronaut.api.ProgressReporter` the CLI hands to the ``Migrator``."""

    def __init__(self, spinner: Spinner) -> None:
        self._spinner = spinner

    def on_start(self, name: str, direction: str) -> None:
        verb = "Applying" if direction == "up" else "Reverting"
        self._spinner.show(f"{verb} {name}…")

    def on_stop(self, outcome: str) -> None:
        self._spinner.hide()

