"""Serving the console over HTTP on the server's port, and its login sessions.

The server hands every HTTP request that is not a WebSocket handshake to :class:`Pages`
(the ``process_request`` hook of the ``websockets`` library). Without a token configured
everything is served. With one (or tenants), a browser without a session gets the login
page for ``/`` and nothing else but what that page needs (every other file: 401); it presents the token once, as ``Authorization:
Bearer`` on ``GET /login``, and gets a session in an HttpOnly, SameSite=Strict cookie
named for the server's port. That cookie admits the page's files and, on a WebSocket
handshake from the same origin, the page's connection (as the token it was opened with:
an admin's or a tenant's). ``GET /logout`` ends the session.
"""

from __future__ import annotations

import http
import secrets
import time
from importlib import resources
from typing import Callable
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

__all__ = ["Pages", "SESSION_SECONDS"]

#: How long a login session lasts (seconds).
SESSION_SECONDS = 12 * 3600

_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".txt": "text/plain; charset=utf-8"}
#: Files served without a session (they hold no data).
_PUBLIC = frozenset({"login.html", "login.js", "console.css"})
_SECURITY = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Pages:
    """The console's files and login sessions of one server.

    ``check(token)`` says whether a token admits a connection; ``secured`` whether the
    server asks for one at all (a token or tenants configured).
    """

    def __init__(self, check: Callable[[str], bool], secured: bool):
        self._check = check
        self.secured = secured
        self._files = _load_files()
        self._sessions: dict[str, tuple[str, float]] = {}  # session id -> (token, expiry)
        self.cookie = "factflow_console"

    def bind(self, port: int) -> None:
        """Name the session cookie after the server's port (browsers share cookies across ports)."""
        self.cookie = f"factflow_console_{port}"

    # ------------------------------------------------------------ WebSocket handshakes
    @staticmethod
    def is_websocket(request: Request) -> bool:
        """Whether ``request`` opens a WebSocket (else it asks for a page)."""
        return "websocket" in request.headers.get("Upgrade", "").lower()

    def session_token(self, request: Request) -> str | None:
        """The token of the session a same-origin request's cookie names (None: no session)."""
        origin = request.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("Host"):
            return None  # a page of another site may not use the console's session
        session = self._sessions.get(_cookies(request).get(self.cookie, ""))
        if session is None or session[1] < time.time():
            return None
        return session[0]

    # ------------------------------------------------------------ pages
    def respond(self, request: Request) -> Response:
        """The answer to a plain HTTP request."""
        path = urlsplit(request.path).path
        if path == "/login":
            return self._login(request)
        if path == "/logout":
            self._sessions.pop(_cookies(request).get(self.cookie, ""), None)
            return _response(http.HTTPStatus.SEE_OTHER, b"", "text/plain; charset=utf-8",
                             {"Location": "/", "Set-Cookie": f"{self.cookie}=; Path=/; Max-Age=0; HttpOnly; "
                                                               "SameSite=Strict"})
        name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
        admitted = not self.secured or self.session_token(request) is not None
        if path in ("/", "/index.html") and not admitted:
            return self._file("login.html")
        if name not in self._files or not (path.startswith("/static/") or name == "index.html"):
            return _response(http.HTTPStatus.NOT_FOUND, b"not found\n", _TYPES[".txt"])
        if not admitted and name not in _PUBLIC:
            return _response(http.HTTPStatus.UNAUTHORIZED, b"log in first\n", _TYPES[".txt"])
        return self._file(name)

    def _login(self, request: Request) -> Response:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if not self.secured:
            return _response(http.HTTPStatus.NO_CONTENT, b"", _TYPES[".txt"])
        if scheme.lower() != "bearer" or not token or not self._check(token):
            return _response(http.HTTPStatus.UNAUTHORIZED, b"wrong or missing token\n", _TYPES[".txt"])
        now = time.time()
        self._sessions = {k: v for k, v in self._sessions.items() if v[1] > now}
        session = secrets.token_urlsafe(32)
        self._sessions[session] = (token, now + SESSION_SECONDS)
        return _response(http.HTTPStatus.NO_CONTENT, b"", _TYPES[".txt"],
                         {"Set-Cookie": f"{self.cookie}={session}; Path=/; Max-Age={SESSION_SECONDS}; HttpOnly; "
                                        "SameSite=Strict"})

    def _file(self, name: str) -> Response:
        suffix = name[name.rfind("."):]
        return _response(http.HTTPStatus.OK, self._files[name], _TYPES.get(suffix, "application/octet-stream"))


def _load_files() -> dict[str, bytes]:
    """Every file under ``static/``, by its path there (``vendor/uPlot.iife.min.js``)."""
    files: dict[str, bytes] = {}

    def walk(folder, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir():
                walk(entry, f"{prefix}{entry.name}/")
            else:
                files[prefix + entry.name] = entry.read_bytes()

    walk(resources.files("factflow.console") / "static", "")
    return files


def _cookies(request: Request) -> dict[str, str]:
    cookies = {}
    for header in request.headers.get_all("Cookie"):
        for part in header.split(";"):
            name, _, value = part.strip().partition("=")
            cookies[name] = value
    return cookies


def _response(status: http.HTTPStatus, body: bytes, content_type: str,
              extra: dict[str, str] | None = None) -> Response:
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)), **_SECURITY, **(extra or {})})
    return Response(status.value, status.phrase, headers, body)
