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
            ``{"id", "input"}``, ``api/stop``, ``api/reset``, ``api/help``, ``api/close``; and
            ``GET TOKEN/files/ID/NAME``, a file the session wrote in its own folder (``downloads``).
CSP         scripts and styles from this server only, no inline script, no eval, nothing loaded
            from elsewhere; inline style attributes are allowed because KaTeX positions with them.
host        the ``Host`` a request names must be this server (an address, ``localhost`` or the
            ``--host`` name, with its port): a page of another site whose name was made to point
            here (DNS rebinding) is refused; an ``Origin``, where a browser sends one, must be the
            page's own.
held        a connection is given ``REQUEST_TIMEOUT`` seconds for each request, from waiting for
            its first byte to the last byte of its body (a slow or silent client is then cut off,
            with 408 if it had begun); at most ``MAX_CONNECTIONS`` are open at once, and one more
            gets 503 at once. Handler threads have an ordinary stack (``HANDLER_STACK``): the deep
            stack that term walks need is the workers', so idle connections cannot use up the
            address space of a server under ``ulimit -v``.
"""

from __future__ import annotations

import hmac
import html
import io
import ipaddress
import json
import mimetypes
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..base.errors import printable, say
from . import downloads
from .sessions import Options, Sessions

STATIC = Path(__file__).resolve().parent / "static"
MAX_BODY = 64 * 1024  # bytes: a command is a line or a few, not a file
MAX_INPUT = 16 * 1024  # characters of one command
REQUEST_TIMEOUT = 10.0  # seconds a client has for one request (line, headers and body), and to take an answer
MAX_CONNECTIONS = 32  # open at once; a browser opens about six to one server
HANDLER_STACK = 4 * 1024 * 1024  # bytes: a handler parses a small JSON body and waits on a pipe
SERVER_RECURSION = 1000  # Python's default: the server walks no terms (a nested JSON body stops here)

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


def _raw_answer(status: int, text: str) -> bytes:
    """A whole HTTP answer, for a connection that has no handler (503) or no request (408)."""
    body = ("%d: %s\n" % (status, text)).encode("utf-8")
    head = ["HTTP/1.1 %d %s" % (status, HTTPStatus(status).phrase), "Connection: close",
            "Content-Type: text/plain; charset=utf-8", "Content-Length: %d" % len(body)]
    head += ["%s: %s" % item for item in HEADERS.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


# a Host header: a name or an IPv4 address, or an IPv6 address in brackets, and a port
HOST = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")
BUSY = _raw_answer(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections are open to this fdsl serve; try again")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # connections waiting to be accepted: each is then answered, 503 past the bound

    def __init__(self, address, options: Options, token: str | None = None):
        self.token = token or secrets.token_urlsafe(24)
        self.sessions = Sessions(options)
        self.options = options
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, Handler)
        host = address[0].strip("[]").lower()
        port = self.server_address[1]
        # the names a request's Host may give: any address (a browser that reached us by address
        # came here), localhost, and the --host name; a name of someone else's domain is refused
        self.host_names = {"localhost", host}
        self.port = port

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):  # full: answered at once, from this thread
            try:
                request.settimeout(1.0)
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread could not start: its slot is free again
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address):
        kind, e = sys.exc_info()[:2]
        if isinstance(e, (MemoryError, RuntimeError, OSError)):  # no thread, memory or socket to be had
            say("fdsl serve: a connection was dropped: %s" % (e,), sys.stderr)
        else:
            super().handle_error(request, client_address)

    def host_ok(self, value) -> bool:
        """Whether a request's Host names this server (see *host* above)."""
        if not value or not HOST.fullmatch(value):
            return False
        try:
            split = urlsplit("//" + value)
            name, port = (split.hostname or ""), split.port
        except ValueError:
            return False
        if (port or 80) != self.port:
            return False
        if name in self.host_names:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = "[%s]" % host if ":" in host else host
        return "http://%s:%d/%s/" % (host, port, self.token)

    def server_close(self) -> None:
        super().server_close()
        self.sessions.close_all()


class _Deadline(io.RawIOBase):
    """A connection's reads, each allowed only what is left of its request's time."""

    def __init__(self, sock):
        self.sock = sock
        self.deadline = time.monotonic() + REQUEST_TIMEOUT
        self.got = 0  # bytes of the present request
        self.timed_out = False

    def begin(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.got = 0
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("the request took too long")
            self.sock.settimeout(left)
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        self.got += n
        return n


class Handler(BaseHTTPRequestHandler):
    server: Server
    server_version = "fdsl"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    # ---- the connection: every read within the request's time
    def setup(self) -> None:
        super().setup()
        self.reader = _Deadline(self.connection)
        self.rfile = io.BufferedReader(self.reader)

    def handle_one_request(self) -> None:
        timeout = self.server.options.request_timeout or REQUEST_TIMEOUT
        self.reader.begin(timeout)
        super().handle_one_request()  # a TimeoutError there closes the connection
        if self.reader.timed_out and self.reader.got:
            try:  # it had begun a request: say why it is cut off
                self.connection.settimeout(1.0)
                self.connection.sendall(_raw_answer(HTTPStatus.REQUEST_TIMEOUT, "a request must arrive whole "
                                                    "within %g s" % timeout))
            except OSError:
                pass

    def end_headers(self) -> None:
        # an answer is written within the request's time again, whatever the reads left of it
        self.connection.settimeout(self.server.options.request_timeout or REQUEST_TIMEOUT)
        super().end_headers()

    def send_error(self, code, message=None, explain=None) -> None:
        """The standard library's malformed-request answers (400, 414, 431, 501), with our headers."""
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        self.refuse(code, message or phrase)

    # ---- answers
    def send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.1"  # HTTP/0.9 has no status line and no headers: answered in 1.1
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

    # ---- the host, the origin and the token
    def route(self):
        """The path after the token, or None (then 403 has been sent)."""
        host = self.headers.get("Host")
        if not self.server.host_ok(host):
            self.refuse(HTTPStatus.FORBIDDEN, "this fdsl serve answers only requests for its own address "
                        "(127.0.0.1 or localhost, port %d)" % self.server.port)
            return None
        origin = self.headers.get("Origin")
        if origin is not None and origin.lower() != "http://" + host.lower():
            self.refuse(HTTPStatus.FORBIDDEN, "this fdsl serve answers only its own page")
            return None
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
        if rest.startswith("/files/"):
            return self.send_session_file(rest[len("/files/"):])
        if not rest.startswith("/static/"):
            return self.refuse(HTTPStatus.NOT_FOUND, "no such page")
        name = rest[len("/static/"):]
        target = (STATIC / name).resolve()
        if ".." in name.split("/") or STATIC not in target.parents or not target.is_file():
            return self.refuse(HTTPStatus.NOT_FOUND, "no such file")
        kind = TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        self.send(HTTPStatus.OK, target.read_bytes(), kind)

    do_HEAD = do_GET

    def send_session_file(self, rest: str) -> None:
        """``files/SESSION/NAME``: a file of that session's own folder, as an attachment (see
        ``downloads``); anything else is 404, the same answer whether or not it exists elsewhere."""
        sid, _, name = rest.partition("/")
        worker = self.server.sessions.get(unquote(sid))
        parts = downloads.parts_of(name)
        found = downloads.open_file(str(worker.folder), parts) if worker is not None and parts else None
        if found is None:
            return self.refuse(HTTPStatus.NOT_FOUND, "no such file in this session's folder")
        stream, size = found
        with stream:
            self.send_response(HTTPStatus.OK)
            for key, value in HEADERS.items():
                self.send_header(key, value)
            self.send_header("Content-Type", downloads.content_type(parts[-1]))
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Disposition", downloads.disposition(parts[-1]))
            self.end_headers()
            if self.command != "HEAD":
                shutil.copyfileobj(stream, self.wfile, downloads.CHUNK)

    def do_POST(self):
        rest = self.route()
        if rest is None:
            return
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") is not None or length is None:
            return self.refuse(HTTPStatus.LENGTH_REQUIRED, "a request needs its Content-Length (and no "
                               "Transfer-Encoding)")
        if not re.fullmatch(r"[0-9]{1,12}", length.strip()):  # ASCII digits only: not '²', not 5,000 of them
            return self.refuse(HTTPStatus.BAD_REQUEST, "Content-Length is a number of bytes")
        if int(length) > MAX_BODY:
            return self.refuse(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "a request may have %d bytes at most" % MAX_BODY)
        try:
            data = self.rfile.read(int(length))
        except TimeoutError:
            self.reader.timed_out = False  # answered here
            return self.refuse(HTTPStatus.REQUEST_TIMEOUT, "the request's body did not arrive within %g s"
                               % (self.server.options.request_timeout or REQUEST_TIMEOUT))
        if len(data) < int(length):
            return self.refuse(HTTPStatus.BAD_REQUEST, "the request's body is shorter than its Content-Length")
        try:
            body = json.loads(data or b"{}")
            if not isinstance(body, dict):
                raise ValueError
        except (ValueError, RecursionError):
            return self.refuse(HTTPStatus.BAD_REQUEST, "a request is a JSON object")
        sessions = self.server.sessions
        if rest == "/api/session":
            sid, items = sessions.open()
            file = self.server.options.file
            return self.send_json({"id": sid, "items": items, "file": printable(Path(file).name) if file else None,
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


def redirect_file(url: str) -> Path:
    """A page that sends the browser on to URL, in a new folder readable by this user alone (as
    Jupyter's ``use_redirect_file``): the browser's command line, which any local user can read in
    /proc, then names this file, not the token."""
    folder = Path(tempfile.mkdtemp(prefix="fdsl-serve-"))  # mode 0700
    path = folder / "open.html"
    link = html.escape(url, quote=True)
    page = ('<!DOCTYPE html>\n<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=%s">'
            '<title>fdsl serve</title></head>\n<body><p><a href="%s">fdsl serve</a></p></body></html>\n' % (link, link))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def serve(options: Options, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = False,
          out=None, err=None) -> None:
    """Serve until interrupted; print the URL (with its token) first."""
    out, err = out or sys.stdout, err or sys.stderr
    # process-wide, restored after: handler threads get an ordinary stack and recursion limit (the
    # command line set deep ones for term walks, which happen only in the workers)
    stack, recursion = threading.stack_size(), sys.getrecursionlimit()
    threading.stack_size(HANDLER_STACK)
    sys.setrecursionlimit(SERVER_RECURSION)
    server = Server((host, port), options)
    redirect = None
    try:
        if host not in ("127.0.0.1", "localhost", "::1"):
            say("fdsl serve: warning: listening on %s, not only on this machine (127.0.0.1): anyone who "
                "can reach it and has the URL's token can run programs here" % host, err)
        say("fdsl serve: %s" % server.url, out)
        say("(the token in the URL is the key; Ctrl-C stops the server)", out)
        out.flush()
        if open_browser:
            import webbrowser

            redirect = redirect_file(server.url)
            webbrowser.open(redirect.as_uri())
        server.serve_forever(poll_interval=0.25)
    finally:
        server.server_close()
        if redirect is not None:
            shutil.rmtree(redirect.parent, ignore_errors=True)
        threading.stack_size(stack)
        sys.setrecursionlimit(recursion)
