"""Who may see the dashboard and who may press its buttons.

Invariant: a control (a POST) changes something only when controls are on, the request carries
the token (header, or the cookie a ``?token=`` visit set) and — when the token came from the
cookie, the one thing a cross-site page can make a browser send — its ``Origin`` (or
``Referer``) is this host and it carries the CSRF value of its session. Anything else is a 403
before any database call. The CSRF value is an HMAC of the session cookie keyed by the token,
so it needs no stored state and holds across restarts and replicas.

With a token, every page and endpoint needs it (as Jupyter does); without one (controls off,
``token=None``), the read-only dashboard is open to whoever reaches it — mount it behind your
application's own authentication.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["CSRF_FIELD", "TOKEN_HEADER", "Guard", "Refusal"]

#: Cookie names, each followed by ``_`` and the instance's tag (see :attr:`Guard.tag`).
TOKEN_COOKIE = "migronaut_token"
SESSION_COOKIE = "migronaut_session"
TOKEN_HEADER = "x-migronaut-token"
CSRF_HEADER = "x-migronaut-csrf"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused (the 403's body)."""

    reason: str


class Guard:
    """The token, the session cookie and the CSRF check of one dashboard application."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        # Cookies are per host, not per port: two dashboards on one host sharing a cookie name
        # and path would overwrite each other's token (each then 403s the other). The tag — a
        # digest of this instance's token, which says nothing about it — keeps them apart.
        self.tag = hashlib.sha256((token or "").encode()).hexdigest()[:12]
        self.token_cookie = f"{TOKEN_COOKIE}_{self.tag}"
        self.session_cookie = f"{SESSION_COOKIE}_{self.tag}"

    @staticmethod
    def new_token() -> str:
        return secrets.token_urlsafe(32)

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def _matches(self, given: str | None) -> bool:
        return bool(self.token and given and hmac.compare_digest(given.encode(),
                                                                 self.token.encode()))

    def presented(self, request: Request) -> str | None:
        """How the request proves the token: ``"header"``, ``"query"``, ``"cookie"`` or
        ``None``."""
        authorization = request.headers.get("authorization", "")
        scheme, _, value = authorization.partition(" ")
        if self._matches(request.headers.get(TOKEN_HEADER)) or (
                scheme.lower() in ("bearer", "token") and self._matches(value.strip())):
            return "header"
        if self._matches(request.query_params.get("token")):
            return "query"
        if self._matches(request.cookies.get(self.token_cookie)):
            return "cookie"
        return None

    def may_read(self, request: Request) -> bool:
        return self.token is None or self.presented(request) is not None

    def csrf_value(self, session: str) -> str:
        key = (self.token or "").encode()
        return hmac.new(key, session.encode(), hashlib.sha256).hexdigest()

    def check_control(self, request: Request, submitted_csrf: str | None) -> Refusal | None:
        """``None`` when this POST may change something, else why not."""
        how = self.presented(request)
        if how is None or how == "query":
            return Refusal("a control needs the dashboard's token (the URL printed at start-up)")
        if how == "header":
            return None  # a cross-site page cannot set a custom header
        if not _same_origin(request):
            return Refusal("cross-site request refused: Origin/Referer is not this host")
        session = request.cookies.get(self.session_cookie)
        given = submitted_csrf or request.headers.get(CSRF_HEADER)
        if not session or not given or not hmac.compare_digest(given, self.csrf_value(session)):
            return Refusal("missing or wrong CSRF value: reload the page and try again")
        return None


def _same_origin(request: Request) -> bool:
    """``Origin`` (else ``Referer``) names this request's own host and port (the scheme is not
    compared: behind a TLS-terminating proxy the app sees ``http``)."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source:
        return False
    given = urlsplit(source)
    host = request.headers.get("host", "")
    return bool(given.scheme) and bool(host) and given.netloc == host
