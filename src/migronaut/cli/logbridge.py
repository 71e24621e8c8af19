"""The bridge from the ``migronaut`` logger (the engine's human lines) to the CLI's output.

Installed for the duration of one command and removed afterwards, restoring the logger's level
and propagation. With ``--log-format json`` each record becomes one JSON line with its structured
fields (``runId``, ``migration``, ``event``…). Only the CLI's fallback: a ``logger`` set in the
config makes the engine log there instead (reference core §2.3).
"""

from __future__ import annotations

import logging

from migronaut.cli.output import DEBUG, ERROR, INFO, WARNING, Output

__all__ = ["LogBridge"]


class LogBridge(logging.Handler):
    """Renders the ``migronaut`` logger's records as CLI lines through an :class:`Output`.

    The level filter is the logger's own (set by :meth:`attach`); tracebacks attached to records
    are shown only at debug level (``--verbose``).
    """

    def __init__(self, output: Output) -> None:
        super().__init__(logging.DEBUG)
        self._output = output
        self._saved: tuple[int, bool] | None = None
        self._logger: logging.Logger | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._output.log_format == "json":
                self._emit_json(record)
                return
            text = record.getMessage()
            if record.exc_info and self._output.enabled(DEBUG):
                import traceback

                text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
            level = record.levelno
            # Map custom levels onto the four the CLI knows.
            if level >= ERROR:
                level = ERROR
            elif level >= WARNING:
                level = WARNING
            elif level >= INFO:
                level = INFO
            else:
                level = DEBUG
            self._output.line(level, text)
        except Exception:  # a log line must never break a run
            pass

    def _emit_json(self, record: logging.LogRecord) -> None:
        from migronaut.observability.jsonlog import JsonFormatter

        formatter = JsonFormatter(tracebacks=self._output.enabled(DEBUG))
        self._output.write(self._output.stderr, formatter.format(record))

    def attach(self, name: str = "migronaut") -> None:
        logger = logging.getLogger(name)
        self._logger = logger
        self._saved = (logger.level, logger.propagate)
        logger.setLevel(self._output.level)
        logger.propagate = False
        logger.addHandler(self)

    def detach(self) -> None:
        logger, self._logger = self._logger, None
        if logger is None:
            return
        logger.removeHandler(self)
        if self._saved is not None:
            logger.setLevel(self._saved[0])
            logger.propagate = self._saved[1]
