"""Credential redaction and terminal sanitisation for every string that leaves the process.

Invariant: no password from a connection string (``scheme://user:secret@``, empty-user passwords,
passwords with literal spaces or ``@``, secret query parameters, secret
``authMechanismProperties``) and no value a duplicate-key error quotes from a user's document
survives :func:`redact`, whatever the number of hosts in the URI. Regexes, not URL parsing, so a
malformed URI is still scrubbed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MASK", "redact", "redact_value", "sanitize_terminal", "shown_value"]

MASK = "****"

# scheme://user:password@ — user may be empty; the password runs to the last '@' before the first
# '/' on the line, as a driver splits the user info from the host list, whatever it holds
# (literal spaces, '@', ':': `mongodb://adm:p@ss w:rd@host/`). Over-masking text that merely
# follows a URI on the same line is the safe failure.
_USERINFO = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<secret>[^/\r\n]*)@"
)
_SECRET_PARAMS = (
    "tlsCertificateKeyFilePassword",
    "proxyPassword",
    "sslKeyPassword",
    "sslPEMKeyPassword",
    "password",
    "pwd",
)
_QUERY_SECRET = re.compile(
    r"(?P<key>[?&;](?:" + "|".join(_SECRET_PARAMS) + r"))=(?P<value>[^&;\s#]*)", re.IGNORECASE
)
_MECH_PROPS = re.compile(
    r"(?P<key>authMechanismProperties=)(?P<value>[^&;\s#]*)", re.IGNORECASE
)
_MECH_SECRET = re.compile(
    r"(?P<key>(?:AWS_SESSION_TOKEN|AWS_SECRET_ACCESS_KEY|OIDC_ACCESS_TOKEN|TOKEN_RESOURCE)(?::|%3A))"
    r"(?P<value>[^,&;\s#]*)",
    re.IGNORECASE,
)
#: Where a write error quotes a user's document: ``dup key: {…}`` in the server's message,
#: ``keyValue: {…}`` in the error document a driver error repeats, and ``'op': {…}`` (the whole
#: statement) in a bulk write's ``writeErrors``.
_DUP_KEY = re.compile(r"(?:dup key: |['\"]?keyValue['\"]?\s*:\s*|['\"]op['\"]\s*:\s*)(?=\{)")

# C0 controls (except \t and \n) and the C1 block, plus whole escape sequences (CSI/OSC/DCS/...).
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b[\]P^_X][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC, DCS, PM, APC, SOS
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    r"|[\x90\x9d\x9e\x9f\x98][^\x07\x9c]*[\x07\x9c]?"  # 8-bit strings
    r"|\x1b."
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def redact(text: str) -> str:
    """Mask URI credentials, secret query parameters and the values a duplicate-key error
    quotes — everywhere text leaves the process: errors, JSON, events, logs, stored records."""
    if not text:
        return text
    out = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    out = _QUERY_SECRET.sub(lambda m: f"{m['key']}={MASK}", out)
    out = _MECH_PROPS.sub(
        lambda m: m["key"] + _MECH_SECRET.sub(lambda n: n["key"] + MASK, m["value"]), out
    )
    return _mask_dup_keys(out)


def _mask_dup_keys(text: str) -> str:
    """Each ``{…}`` after a :data:`_DUP_KEY` marker (nested braces included) becomes
    ``{ **** }``; an unbalanced one is masked to the end of the text."""
    parts, at = [], 0
    for found in _DUP_KEY.finditer(text):
        start = found.end()
        if start < at:
            continue
        depth, end = 0, len(text)
        for index in range(start, len(text)):
            char = text[index]
            depth += (char == "{") - (char == "}")
            if depth == 0:
                end = index + 1
                break
        parts += [text[at:start], "{ " + MASK + " }"]
        at = end
    parts.append(text[at:])
    return "".join(parts)


def redact_value(value: Any) -> Any:
    """Deep-redact every string inside a JSON-like value (dicts, lists, tuples)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    return value


def sanitize_terminal(text: str) -> str:
    """Strip control characters and escape sequences from text that came from the database."""
    return _ESCAPES.sub("", text)


def shown_value(value: Any, limit: int = 60) -> str:
    """A stored value as a message quotes it: its ``repr`` (control characters escaped, a
    string's type visible by its quotes), cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
