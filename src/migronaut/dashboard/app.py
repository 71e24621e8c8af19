"""The dashboard's ASGI application: routes, templates and the error envelope.

Pages are server-rendered Jinja2 templates (autoescaped) over :class:`~.board.Board`'s JSON
documents; ``/api/…`` serves the same documents with the CLI's ``--json`` shapes; the pages'
script polls ``/api/live`` (≤ 1/s) to move the progress bars without a reload. Handlers are
plain functions, so Starlette runs them in its thread pool (pymongo's API is synchronous).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

import pymongo
from pymongo.errors import ConnectionFailure, PyMongoError

from migronaut.errors import (
    ConfigInvalidError,
    ConnectionFailedError,
    ExtraMissingError,
    MigronautError,
    describe_exception,
)

try:
    import prometheus_client  # noqa: F401  (/metrics)
    from jinja2 import Environment, FileSystemLoader, select_autoescape
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, RedirectResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
except ImportError as missing:  # pragma: no cover - exercised without the extra
    raise ExtraMissingError.of("dashboard", "the dashboard", missing) from missing

from migronaut import Config, load_config
from migronaut.dashboard.board import CONTROLS, Board
from migronaut.dashboard.guard import CSRF_FIELD, Guard
from migronaut.dashboard.metrics import exposition, registry_of

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from migronaut import Migrator
    from migronaut.dashboard.fleet_board import FleetBoard

__all__ = ["create_app"]

HERE = Path(__file__).parent
#: HTTP status of an error by its code; anything else is a 500 with the same JSON envelope.
STATUS_OF = {"NOT_APPLIED": 404, "BACKGROUND_CONFLICT": 409, "CONFIG_INVALID": 400,
             "CONNECTION_FAILED": 503}
#: Page size limits of ``?limit=`` (the CLI's ``logs --limit`` bounds).
MAX_LIMIT = 1000
#: Seconds a request may spend on MongoDB (server selection included) while the driver sees no
#: primary, before it is a 503 "database unreachable": a page answers quickly when the database
#: dropped, not after the client's 10 s server-selection timeout.
PAGE_TIMEOUT_S = 3.0
#: The largest control form read (a CSRF value, a name and a reason).
MAX_FORM = 16_384
#: Response headers of every page: no framing, no sniffing, scripts only from here.
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'",
    "Cache-Control": "no-store",
}


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(["html"], default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["duration"] = _duration
    env.filters["tojson_attr"] = lambda value: json.dumps(value, separators=(",", ":"))
    return env


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "—"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _json(document: Any, status: int = 200) -> Response:
    """A JSON response; ``<``, ``>`` and ``&`` as ``\\u`` escapes (the same JSON value, and no
    markup even if a browser is talked into rendering it)."""
    text = json.dumps(document, ensure_ascii=False)
    for char in "<>&":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return Response(text, status_code=status,
                    media_type="application/json", headers=SECURITY_HEADERS)


def _serving(read: Callable[[Request], Any]) -> Callable[[Request], Response]:
    """A JSON endpoint of ``read``."""
    return lambda request: _json(read(request))


async def _form(request: Request) -> dict[str, str]:
    """The fields of a small urlencoded form (the controls' only body); anything else, or more
    than :data:`MAX_FORM` bytes, is no fields (the guard then refuses the request)."""
    if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"):
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return {}
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {key: values[0] for key, values in fields.items()}


def _limit(request: Request, default: int = 20) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 0 < value <= MAX_LIMIT:
        raise ConfigInvalidError(f"limit must be an integer from 1 to {MAX_LIMIT} (got {raw!r})",
                                 {"option": "limit"})
    return value


class Dashboard:
    """One application: the migrator it reads through, the guard, the templates."""

    def __init__(self, migrator: Migrator, guard: Guard, allow_controls: bool, *,
                 fleet: FleetBoard | None = None, tenant: str | None = None,
                 home: bool = True) -> None:
        self.board = Board(migrator)
        self.registry = registry_of(self.board)
        self.guard = guard
        self.allow_controls = allow_controls
        self.templates = _templates()
        #: the fleet page's board (the config has a ``[fleet]``); a tenant's pages have none
        self.fleet = fleet
        #: the tenant these pages show (served under ``/t/<tenant>/`` of the fleet's dashboard)
        self.tenant = tenant
        self.tenant_pages = TenantPages(self, fleet) if fleet is not None else None
        #: whether the migrator's own database has pages (a fleet without a ``db`` has only
        #: the fleet page and its tenants' pages)
        self.home = home

    # -- plumbing ---------------------------------------------------------------------------
    def guarded(self, handler: Callable[[Request], Response], *, page: bool = False,
                ) -> Callable[[Request], Response]:
        """Token check, the ``?token=`` → cookie hand-over, errors as JSON or an error page."""

        def endpoint(request: Request) -> Response:
            if not self.guard.may_read(request):
                return self.refuse(request, "this dashboard needs its token: open the URL "
                                            "printed at start-up", page=page)
            try:
                try:
                    with (contextlib.nullcontext() if self.reachable()
                          else pymongo.timeout(PAGE_TIMEOUT_S)):
                        response = handler(request)
                except PyMongoError as lost:
                    if not isinstance(lost, ConnectionFailure) and not lost.timeout:
                        raise
                    raise ConnectionFailedError(
                        "database unreachable: "
                        + describe_exception(lost).split(", Topology Description:")[0],
                        {"timeoutSeconds": PAGE_TIMEOUT_S}) from lost
            except MigronautError as error:
                status = STATUS_OF.get(error.code, 500)
                if page:
                    response = self.render("error.html", request, status=status,
                                           error=error.to_dict())
                else:
                    response = _json({"error": error.to_dict()}, status)
            if self.guard.presented(request) == "query":
                response = self.hand_over(request, response)
            return response

        return endpoint

    def reachable(self) -> bool:
        """Whether the driver last saw a primary (no I/O). When it did not — never connected,
        or its monitor lost the server — the request runs under :data:`PAGE_TIMEOUT_S`, so a
        page answers "database unreachable" quickly; when it did, no timeout cuts a long read
        (an audit of a big database) short."""
        migrator = self.board.migrator
        return migrator.connected and migrator.client.topology_description.has_readable_server()

    def hand_over(self, request: Request, response: Response) -> Response:
        """A ``?token=`` visit: the token goes into an HttpOnly SameSite=Strict cookie and the
        browser is sent to the same URL without it (out of the address bar and history)."""
        if request.method == "GET" and response.status_code == 200:
            query = urlencode([(k, v) for k, v in request.query_params.multi_items()
                               if k != "token"])
            response = RedirectResponse(request.url.path + (f"?{query}" if query else ""),
                                        status_code=303)
        response.set_cookie(self.guard.token_cookie, self.guard.token or "", httponly=True,
                            samesite="strict", path=self.root(request))
        return response

    @staticmethod
    def root(request: Request) -> str:
        return str(request.scope.get("root_path") or "") + "/"

    def refuse(self, request: Request, reason: str, *, page: bool = False) -> Response:
        body = {"error": {"code": "FORBIDDEN", "message": reason}}
        if page:
            return self.render("error.html", request, status=403, error=body["error"])
        return _json(body, 403)

    def render(self, template: str, request: Request, *, status: int = 200,
               **context: Any) -> Response:
        session = request.cookies.get(self.guard.session_cookie) or Guard.new_session()
        root = self.root(request).rstrip("/")
        html = self.templates.get_template(template).render(
            root=root, allow_controls=self.allow_controls,
            csrf=self.guard.csrf_value(session) if self.allow_controls else "",
            csrf_field=CSRF_FIELD, fleet_href=self.fleet_href(root), tenant=self.tenant,
            home=self.home, **context)
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if self.allow_controls and not request.cookies.get(self.guard.session_cookie):
            response.set_cookie(self.guard.session_cookie, session, httponly=True,
                                samesite="strict", path=self.root(request))
        return response

    def fleet_href(self, root: str) -> str | None:
        """The fleet page's address from a page under ``root``, or ``None`` without a fleet."""
        if self.tenant is not None:  # root is <the fleet dashboard's root>/t/<tenant>
            return root.rsplit("/t/", 1)[0] + "/fleet"
        return f"{root}/fleet" if self.fleet is not None else None

    # -- pages ------------------------------------------------------------------------------
    def fleet_page(self, request: Request) -> Response:
        assert self.fleet is not None
        params = request.query_params
        return self.render("fleet.html", request, page="fleet", **self.fleet.summary(
            state=params.get("state"), name=params.get("name")))

    def overview(self, request: Request) -> Response:
        return self.render("overview.html", request, page="overview", **self.board.overview())

    def migration(self, request: Request) -> Response:
        name = request.path_params["name"]
        return self.render("migration.html", request, page="background",
                           **self.board.migration(name))

    def runs_page(self, request: Request) -> Response:
        return self.render("runs.html", request, page="runs",
                           runs=self.board.runs(_limit(request, 50)))

    def run_page(self, request: Request) -> Response:
        log = self.board.run_log(request.path_params["run_id"])
        if log.get("run") is None:
            return self.render("error.html", request, status=404, error={
                "code": "NOT_FOUND", "message": "No such run"})
        return self.render("run.html", request, page="runs", **log)

    def audit_page(self, request: Request) -> Response:
        return self.render("audit.html", request, page="audit", report=self.board.audit())

    def drift_page(self, request: Request) -> Response:
        return self.render("drift.html", request, page="drift", result=self.board.drift(),
                           history=self.board.converge_history(10))

    # -- controls ---------------------------------------------------------------------------
    async def control(self, request: Request) -> Response:
        """POST /background/{name}/{action}: refused (403, nothing read or written) unless
        controls are on and the guard accepts the request."""
        name, action = request.path_params["name"], request.path_params["action"]
        wants_json = "application/json" in request.headers.get("accept", "")
        if not self.allow_controls:
            return self.refuse(request, "controls are off: start the dashboard with "
                                        "--allow-controls", page=not wants_json)
        form = await _form(request)
        refusal = self.guard.check_control(request, form.get(CSRF_FIELD))
        if refusal is not None:
            return self.refuse(request, refusal.reason, page=not wants_json)
        if action not in CONTROLS:
            return _json({"error": {"code": "NOT_FOUND",
                                    "message": f"unknown control {action!r}"}}, 404)
        actor = str(form.get("requested_by") or "").strip()[:100] or "dashboard"
        reason = str(form.get("reason") or "").strip()[:500] or None
        def apply() -> Response:
            result = self.board.control(name, action, requested_by=actor, reason=reason)
            if wants_json:
                return _json(result)
            return RedirectResponse(f"{self.root(request)}background/{quote(name)}",
                                    status_code=303)

        return await run_in_threadpool(self.guarded(lambda _: apply(), page=not wants_json),
                                       request)

    def metrics(self, request: Request) -> Response:
        """The Prometheus scrape, OpenMetrics when the ``Accept`` header asks for it."""
        body, content_type = exposition(self.registry, request.headers.get("accept"))
        return Response(body, media_type=content_type, headers=SECURITY_HEADERS)

    # -- JSON -------------------------------------------------------------------------------
    def routes(self) -> list[Any]:
        board = self.board
        api: Mapping[str, Callable[[Request], Any]] = {
            "/api/status": lambda r: board.status(),
            "/api/lock": lambda r: board.lock(),
            "/api/runs": lambda r: board.runs(_limit(r)),
            "/api/runs/{run_id}": lambda r: board.run_log(r.path_params["run_id"]),
            "/api/audit": lambda r: board.audit(),
            "/api/drift": lambda r: board.drift(),
            "/api/converge/history": lambda r: board.converge_history(_limit(r)),
            "/api/background": lambda r: board.background(),
            "/api/background/{name}": lambda r: board.background(r.path_params["name"]),
            "/api/background/{name}/partitions":
                lambda r: board.partitions(r.path_params["name"]),
            "/api/live": lambda r: board.live(),
            "/api/live/{name}": lambda r: board.live(r.path_params["name"]),
        }
        static = Mount("/static", StaticFiles(directory=HERE / "static"), name="static")
        if not self.home:  # a fleet without a database of its own: the fleet is the home page
            routes: list[Any] = [Route("/", self.guarded(
                lambda r: RedirectResponse(f"{self.root(r)}fleet", status_code=303), page=True),
                methods=["GET"]), static]
        else:
            routes = [Route(path, self.guarded(_serving(read)), methods=["GET"])
                      for path, read in api.items()]
            routes += [*self.home_routes(), static]
        if self.fleet is not None and self.tenant_pages is not None:
            fleet = self.fleet
            routes += [
                Route("/fleet", self.guarded(self.fleet_page, page=True), methods=["GET"]),
                Route("/api/fleet", self.guarded(_serving(lambda r: fleet.summary(
                    state=r.query_params.get("state"), name=r.query_params.get("name")))),
                    methods=["GET"]),
                Mount("/t/{tenant}", app=self.tenant_pages),
            ]
        return routes

    def home_routes(self) -> list[Any]:
        """The pages of the migrator's own database."""
        return [
            Route("/", self.guarded(self.overview, page=True), methods=["GET"]),
            Route("/background/{name}", self.guarded(self.migration, page=True),
                  methods=["GET"]),
            Route("/background/{name}/{action}", self.control, methods=["POST"]),
            Route("/runs", self.guarded(self.runs_page, page=True), methods=["GET"]),
            Route("/runs/{run_id}", self.guarded(self.run_page, page=True), methods=["GET"]),
            Route("/audit", self.guarded(self.audit_page, page=True), methods=["GET"]),
            Route("/drift", self.guarded(self.drift_page, page=True), methods=["GET"]),
            Route("/metrics", self.guarded(self.metrics), methods=["GET"]),
        ]

    def close(self) -> None:
        """Close what the fleet's pages opened (the tenants' migrators, the fleet's clients)."""
        if self.tenant_pages is not None:
            self.tenant_pages.close()
        if self.fleet is not None:
            self.fleet.fleet.close()


class TenantPages:
    """``/t/<tenant>/…``: the ordinary pages (overview, runs, audit, drift, background) of one
    tenant of the fleet, on its cluster's shared client. The token is checked before the name is
    looked at, and only a name the fleet lists is served (else a 404): never another database.
    """

    def __init__(self, outer: Dashboard, fleet: FleetBoard) -> None:
        self.outer = outer
        self.fleet = fleet
        self._apps: dict[str, tuple[Starlette, Migrator]] = {}
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = str(scope.get("path_params", {}).get("tenant", ""))
        # a refusal or a 404 is the fleet dashboard's page: its links start at its own root
        root = str(scope.get("root_path") or "").rsplit("/t/", 1)[0]
        request = Request({**scope, "root_path": root}, receive)
        if not self.outer.guard.may_read(request):
            response = self.outer.refuse(request, "this dashboard needs its token: open the "
                                                  "URL printed at start-up", page=True)
            await response(scope, receive, send)
            return
        try:
            app = await run_in_threadpool(self.app_for, name)
        except MigronautError as error:
            app = None
            failure = self.outer.render("error.html", request,
                                        status=STATUS_OF.get(error.code, 500),
                                        error=error.to_dict())
        else:
            failure = self.outer.render("error.html", request, status=404, error={
                "code": "NOT_FOUND", "message": f"No tenant {name!r} in this fleet"})
        if app is None:
            await failure(scope, receive, send)
            return
        await app(scope, receive, send)

    def app_for(self, name: str) -> Starlette | None:
        """The tenant's pages, built on its first visit; ``None`` for a name the fleet does not
        list (looked up again on every visit of an unknown name: a tenant added since is
        found)."""
        with self._lock:
            found = self._apps.get(name)
        if found is not None:
            return found[0]
        tenant = self.fleet.tenant(name)
        if tenant is None:
            return None
        with self._lock:
            found = self._apps.get(name)
            if found is None:
                migrator = self.fleet.fleet.migrator(tenant)
                pages = Dashboard(migrator, self.outer.guard, self.outer.allow_controls,
                                  tenant=name)
                found = (Starlette(routes=pages.routes()), migrator)
                self._apps[name] = found
        return found[0]

    def close(self) -> None:
        with self._lock:
            apps, self._apps = self._apps, {}
        for _, migrator in apps.values():
            migrator.close()


def create_app(migrator: Migrator | None = None, *, config: Config | Mapping[str, Any] | None
               = None, allow_controls: bool = False, token: str | None = None) -> Starlette:
    """The dashboard as an ASGI application over ``migrator`` (or a new
    :class:`~migronaut.api.Migrator` of ``config``, closed when the application shuts down).

    ``allow_controls`` turns on pause/resume/cancel/retry; they then need ``token`` (one is
    generated when not given: read it from ``app.state.token``). With a token, every page and
    endpoint needs it. Mount it anywhere: links follow the mount's ``root_path``.

    A ``config`` with a ``[fleet]`` and no ``db`` serves the fleet page as its home page (and
    each tenant's pages), with no pages of a database of its own.
    """
    owned = migrator is None
    home = True
    if migrator is None:
        from migronaut import Migrator

        resolved = config if isinstance(config, Config) else load_config(
            dict(config or {}), require_db=False)
        if resolved.fleet is not None and not resolved.db_name:
            home = False  # its client still answers "is the server reachable" for the pages
            resolved = resolved.with_overrides(db_name=resolved.fleet.admin_db)
        migrator = Migrator(resolved)
    elif config is not None:
        raise ConfigInvalidError("create_app takes a migrator or a config, not both",
                                 {"option": "config"})
    if allow_controls and token is None:
        token = Guard.new_token()
    dashboard = Dashboard(migrator, Guard(token), allow_controls, fleet=_fleet_board(migrator),
                          home=home)
    closing = migrator

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            dashboard.close()
            if owned:
                closing.close()

    app = Starlette(routes=dashboard.routes(), lifespan=lifespan)
    app.state.token = token
    app.state.migrator = migrator
    return app


def _fleet_board(migrator: Migrator) -> FleetBoard | None:
    """The fleet page's board when the config has a ``[fleet]`` (its own shared clients, one
    per cluster, closed with the application)."""
    config = migrator.config
    if config.fleet is None:
        return None
    from migronaut import Fleet
    from migronaut.dashboard.fleet_board import FleetBoard

    return FleetBoard(Fleet(config))
