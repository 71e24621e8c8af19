"""The dev server's test failpoint: mongod's ``failCommand``, set with ``configureFailPoint``.

Served only when the server runs with ``--enable-test-commands`` (mongod's
``enableTestCommands``); otherwise ``configureFailPoint`` is an unknown command (59), as on a
production ``mongod``. The shape is mongod's, so a test written against it runs unchanged on a
real ``mongod`` started with ``--setParameter enableTestCommands=1``::

    {configureFailPoint: "failCommand", mode: {times: n} | "alwaysOn" | "off",
     data: {failCommands: ["createIndexes", ...], errorCode: n, errmsg?: "...",
            closeConnection?: true, appName?: "..."}}

It must be sent to the ``admin`` database; the reply carries ``count``, how many times the
failpoint fired since it was last set. A matching command fails with ``errorCode`` (the message
mongod uses unless ``errmsg`` is given), or — with ``closeConnection`` — gets no reply at all:
its connection is closed, which a driver reports as a network error. ``{times: n}`` turns itself
off after ``n`` matches. Only ``failCommand`` exists here; other failpoint names and data keys
are refused (BadValue), so a test never silently runs without the failure it asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from migronaut._values import is_int
from migronaut.devserver.catalog import Refused, wrong_type

__all__ = ["COMMAND", "CloseConnection", "FailCommand"]

COMMAND: Final = "configureFailPoint"
_NAME: Final = "failCommand"
_MESSAGE: Final = "Failing command via 'failCommand' failpoint"
_DATA_KEYS: Final = frozenset({"failCommands", "errorCode", "errmsg", "closeConnection",
                               "appName"})
#: Code names mongod gives the codes tests use most (others are ``Location<code>``).
_CODE_NAMES: Final = {
    1: "InternalError", 2: "BadValue", 6: "HostUnreachable", 7: "HostNotFound",
    8: "UnknownError", 11: "UserNotFound", 13: "Unauthorized", 26: "NamespaceNotFound",
    27: "IndexNotFound", 48: "NamespaceExists", 50: "MaxTimeMSExpired", 67: "CannotCreateIndex",
    85: "IndexOptionsConflict", 86: "IndexKeySpecsConflict", 89: "NetworkTimeout",
    91: "ShutdownInProgress", 112: "WriteConflict", 189: "PrimarySteppedDown",
    10107: "NotWritablePrimary", 11000: "DuplicateKey", 11600: "InterruptedAtShutdown",
    11602: "InterruptedDueToReplStateChange", 13435: "NotPrimaryNoSecondaryOk",
}


class CloseConnection(BaseException):
    """Raised out of the command executor to drop the connection without a reply.

    A ``BaseException`` so that mongoeco's request handler, which turns every ``Exception`` into
    an error reply, lets it through: its connection handler then closes the socket."""


@dataclass
class _Setting:
    commands: frozenset[str]
    times: int | None  # None: alwaysOn
    error_code: int | None
    errmsg: str
    close: bool
    app_name: str | None


class FailCommand:
    """The one ``failCommand`` failpoint of a dev server process (off until configured)."""

    def __init__(self) -> None:
        self._setting: _Setting | None = None
        self._count = 0

    def configure(self, command: Mapping[str, Any], db: str) -> dict[str, Any]:
        """Answer ``configureFailPoint`` (sent to ``admin``)."""
        if db != "admin":
            raise Refused(13, "Unauthorized",
                          f"{COMMAND} may only be run against the admin database.")
        name = command.get(COMMAND)
        if name != _NAME:
            raise Refused(2, "BadValue", f"Unknown fail point name: {name} (the dev server "
                          f"serves only {_NAME})")
        if "mode" not in command:
            raise Refused(2, "BadValue", "Missing required 'mode' field")
        times = _times(command["mode"])
        count, self._count = self._count, 0
        if times == 0:
            self._setting = None
        else:
            self._setting = _setting(command.get("data"), times)
        return {"count": count, "ok": 1.0}

    def check(self, name: str | None, connection: Any) -> None:
        """Fail ``name`` if the failpoint is set for it (raises :class:`Refused` or
        :class:`CloseConnection`)."""
        setting = self._setting
        if setting is None or name is None or name == COMMAND or name not in setting.commands:
            return
        if setting.app_name is not None and _app_name(connection) != setting.app_name:
            return
        self._count += 1
        if setting.times is not None:
            setting.times -= 1
            if setting.times == 0:
                self._setting = None
        if setting.close:
            raise CloseConnection
        assert setting.error_code is not None
        code = setting.error_code
        raise Refused(code, _CODE_NAMES.get(code, f"Location{code}"), setting.errmsg)


def _times(mode: Any) -> int | None:
    """``off`` → 0, ``alwaysOn`` → ``None``, ``{times: n}`` → n."""
    if mode == "off":
        return 0
    if mode == "alwaysOn":
        return None
    if isinstance(mode, Mapping) and set(mode) == {"times"}:
        times = mode["times"]
        if is_int(times) and times > 0:
            return times
        raise Refused(2, "BadValue", "'times' option to 'mode' must be a positive integer")
    raise Refused(2, "BadValue", "'mode' must be 'off', 'alwaysOn' or {times: n} on the dev "
                  f"server (got {mode!r})")


def _setting(data: Any, times: int | None) -> _Setting:
    if not isinstance(data, Mapping):
        raise wrong_type(f"{COMMAND}.data", data, "object")
    unknown = sorted(set(data) - _DATA_KEYS)
    if unknown:
        raise Refused(2, "BadValue", f"{_NAME} data field(s) the dev server does not serve: "
                      + ", ".join(unknown))
    commands = data.get("failCommands")
    if not isinstance(commands, Sequence) or isinstance(commands, str) or not commands or \
            not all(isinstance(c, str) for c in commands):
        raise Refused(2, "BadValue", "'failCommands' must be a non-empty array of command names")
    code, close = data.get("errorCode"), data.get("closeConnection", False)
    if code is not None and not is_int(code):
        raise wrong_type(f"{_NAME}.errorCode", code, "int")
    if not isinstance(close, bool):
        raise wrong_type(f"{_NAME}.closeConnection", close, "bool")
    if code is None and not close:
        raise Refused(2, "BadValue", f"{_NAME} needs 'errorCode' or 'closeConnection: true'")
    errmsg, app = data.get("errmsg", _MESSAGE), data.get("appName")
    if not isinstance(errmsg, str):
        raise wrong_type(f"{_NAME}.errmsg", errmsg, "string")
    if app is not None and not isinstance(app, str):
        raise wrong_type(f"{_NAME}.appName", app, "string")
    return _Setting(frozenset(commands), times, code, errmsg, close, app)


def _app_name(connection: Any) -> str | None:
    metadata = getattr(connection, "client_metadata", None) or {}
    application = metadata.get("application") if isinstance(metadata, Mapping) else None
    name = application.get("name") if isinstance(application, Mapping) else None
    return name if isinstance(name, str) else None
