"""The web server of ``fdsl serve``: the page, its assets, and the JSON calls of its sessions.

Built on the standard library's ``http.server`` (``ThreadingHTTPServer``): the console is one
page, a handful of JSON calls and some static files, served to one person on their own machine.
That needs no routing, templating or async framework, and a library kept with CPython itself
adds no dependency to audit; the things a web framework would not do for us anyway (the token,
the content security policy, the body cap, escaping) are written out here and tested.

Vocabulary
----------
token       a random secret in the path of every URL (``http://127.0.0.1:PORT/TOKEN/``), printed
            once by ``fdsl serve``; a request without it, or with another, gets 403, as a Jupyter
            server does. In the path rather than a cookie or query, the page's relative URLs (the
            fonts KaTeX's stylesheet names) carry it without any script.
calls       ``POST TOKEN/api/session`` (a new session: its id and FILE's output), ``api/run``
            ``{"id", "input"}``, ``api/stop``, ``api/reset``, ``api/help``, ``api/close``.
CSP         scripts and styles from this server only, no inline script, no eval, nothing loaded
            from elsewhere; inline style attributes are allowed because KaTeX positions with them.
"""

from __future__ import annotations

import hmac
import json
import mimetypes
import secrets
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from .sessions import Options, Sessions

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY = 64 * 1024  # bytes: a command is a line or a few, not a file
MAX_INPUT = 16 * 1024  # characters of one command

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; "
       "img-src 'self' data:; font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".html": "text/html; charset=utf-8", ".woff2": "font/woff2", ".png": "image/png",
         ".svg": "image/svg+xml"}


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, options: Options, token: str | None = None):
        self.token = token or secrets.token_urlsafe(24)
        self.sessions = Sessions(options)
        self.options = options
        super().__init__(address, Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = "[%s]" % host if ":" in host else host
        return "http://%s:%d/%s/" % (host, port, self.token)

    def server_close(self) -> None:
        super().server_close()
        self.sessions.close_all()


class Handler(BaseHTTPRequestHandler):
    server: Server
    server_version = "fdsl"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    # ---- answers
    def send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        for name, value in HEADERS.items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, obj, status: int = 200) -> None:
        self.send(status, json.dumps(obj).encode("utf-8"), "application/json")

    def refuse(self, status: int, why: str) -> None:
        self.close_connection = True
        self.send(status, ("%d: %s\n" % (status, why)).encode("utf-8"))

    def log_message(self, format, *args) -> None:
        pass  # the request line carries the token: nothing is logged

    # ---- the token
    def route(self):
        """The path after the token, or None (then 403 has been sent)."""
        path = urlsplit(self.path).path
        parts = path.split("/", 2)  # '', TOKEN, rest
        given = parts[1] if len(parts) > 1 else ""
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.server.token.encode("utf-8")):
            self.refuse(HTTPStatus.FORBIDDEN, "this fdsl serve answers only the URL with the token it printed")
            return None
        if len(parts) == 2:  # /TOKEN without the slash: the page's relative URLs need it
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", "/%s/" % self.server.token)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return "/" + parts[2]

    def do_GET(self):
        rest = self.route()
        if rest is None:
            return
        if rest == "/":
            rest = "/static/index.html"
        if not rest.startswith("/static/"):
            return self.refuse(HTTPStatus.NOT_FOUND, "no such page")
        name = rest[len("/static/"):]
        target = (STATIC / name).resolve()
        if ".." in name.split("/") or STATIC not in target.parents or not target.is_file():
            return self.refuse(HTTPStatus.NOT_FOUND, "no such file")
        kind = TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        self.send(HTTPStatus.OK, target.read_bytes(), kind)

    do_HEAD = do_GET

    def do_POST(self):
        rest = self.route()
        if rest is None:
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return self.refuse(HTTPStatus.LENGTH_REQUIRED, "a request needs its Content-Length")
        if int(length) > MAX_BODY:
            return self.refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "a request may have %d bytes at most" % MAX_BODY)
        try:
            body = json.loads(self.rfile.read(int(length)) or b"{}")
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return self.refuse(HTTPStatus.BAD_REQUEST, "a request is a JSON object")
        sessions = self.server.sessions
        if rest == "/api/session":
            sid, items = sessions.open()
            file = self.server.options.file
            return self.send_json({"id": sid, "items": items, "file": Path(file).name if file else None,
                                   "time_limit": self.server.options.time_limit})
        worker = sessions.get(body.get("id"))
        if worker is None:
            return self.send_json({"error": "no such session (the server was restarted, or the session closed): "
                                   "reload the page"}, HTTPStatus.NOT_FOUND)
        limit = self.server.options.time_limit
        if rest == "/api/run":
            text = body.get("input")
            if not isinstance(text, str) or len(text) > MAX_INPUT:
                return self.refuse(HTTPStatus.BAD_REQUEST, "input is a string of %d characters at most" % MAX_INPUT)
            return self.send_json(worker.request({"op": "run", "input": text}, limit))
        if rest == "/api/reset":
            return self.send_json(worker.request({"op": "reset"}, limit))
        if rest == "/api/help":
            return self.send_json(worker.request({"op": "help"}, limit))
        if rest == "/api/stop":
            worker.stop()
            return self.send_json({"stopping": True})
        if rest == "/api/close":
            sessions.close(body.get("id"))
            return self.send_json({"closed": True})
        return self.refuse(HTTPStatus.NOT_FOUND, "no such call")


def serve(options: Options, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = False,
          out=None, err=None) -> None:
    """Serve until interrupted; print the URL (with its token) first."""
    out, err = out or sys.stdout, err or sys.stderr
    server = Server((host, port), options)
    try:
        if host not in ("127.0.0.1", "localhost", "::1"):
            err.write("fdsl serve: warning: listening on %s, not only on this machine (127.0.0.1): anyone who "
                      "can reach it and has the URL's token can run programs here\n" % host)
        out.write("fdsl serve: %s\n" % server.url)
        out.write("(the token in the URL is the key; Ctrl-C stops the server)\n")
        out.flush()
        if open_browser:
            import webbrowser

            webbrowser.open(server.url)
        server.serve_forever(poll_interval=0.25)
    finally:
        server.server_close()
