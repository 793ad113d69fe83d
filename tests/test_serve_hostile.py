"""``fdsl serve`` under attack from outside (issue 30): connections that are held idle or sent
half a request, malformed lengths, names of other hosts, sessions closed while they run, a
worker that cannot start, the token on a browser's command line, limit options out of range.
Each server here is started as a person starts it, some under an address-space limit of 4 GB
(``ulimit -v``, as shared machines set it)."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from serve_helpers import Served, wait_for

from fdsl.serve import sessions as sessions_module
from fdsl.serve.sessions import Options, Sessions

GB = 1000 ** 3


def request(s: Served, method: str, path: str, headers=(), body: bytes = b"", host: str | None = None) -> bytes:
    """The answer to one request on a connection of its own; HOST: its Host header ('' for none)."""
    host = "127.0.0.1:%d" % s.port if host is None else host
    lines = ["%s /%s/%s HTTP/1.1" % (method, s.token, path), "Connection: close", *headers]
    if host:
        lines.append("Host: " + host)
    if body or method == "POST":
        lines.append("Content-Length: %d" % len(body))
    return s.raw(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.fixture(scope="module")
def limited():
    """A server whose process (and so its workers) may have 4 GB of address space, with a short
    request timeout."""
    s = Served("--request-timeout", "2", address_space=4 * GB)
    yield s
    s.stop()


def test_idle_connections_do_not_use_up_the_address_space(limited):
    """Ten idle connections (each held a thread with a 512 MiB stack: six used up 4 GB), then the
    owner's requests are answered, a session starts and runs under the same limit."""
    idle = [socket.create_connection(("127.0.0.1", limited.port)) for _ in range(10)]
    try:
        time.sleep(0.5)  # each has its handler thread by now
        assert limited.get(limited.url)[0] == 200
        code, reply = limited.post("api/session", {})
        assert code == 200, reply
        code, reply = limited.post("api/run", {"id": reply["id"], "input": "1 + 1"})
        assert code == 200 and reply["ok"], reply
    finally:
        for sock in idle:
            sock.close()


def test_a_half_request_line_is_cut_off(limited):
    started = time.monotonic()
    answer = limited.raw(b"GET /" + limited.token.encode(), timeout=30)
    assert time.monotonic() - started < 2 + 5
    assert status(answer) == 408 and b"within 2 s" in answer and b"Content-Security-Policy" in answer, answer
    assert limited.raw(b"", timeout=30) == b""  # a silent connection is closed, with nothing to answer


def test_a_body_shorter_than_its_length_is_cut_off(limited):
    head = ("POST /%s/api/session HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 100\r\n\r\n{"
            % (limited.token, limited.port)).encode()
    started = time.monotonic()
    answer = limited.raw(head, timeout=30)
    assert time.monotonic() - started < 2 + 5
    assert status(answer) == 408 and b"body did not arrive" in answer, answer


def test_a_request_sent_a_byte_at_a_time_is_cut_off_at_its_deadline(limited):
    """Each read has only what is left of the request's time: a trickle does not hold a thread."""
    with socket.create_connection(("127.0.0.1", limited.port), timeout=30) as sock:
        started = time.monotonic()
        answer = b""
        for byte in b"GET /%s/ HTTP/1.1\r\nX-Slow: " % limited.token.encode() + b"a" * 1000:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
            if time.monotonic() - started > 10:
                break
        try:
            answer = sock.recv(65536)
        except OSError:
            pass
    assert time.monotonic() - started < 2 + 5, "the trickle held the connection"
    assert status(answer) in (0, 408)


@pytest.mark.parametrize("length, code", [(b"\xb2", 400), (b"9" * 5000, 400), (b"-1", 400), (b"1e3", 400),
                                          (b"99999999999", 413)],
                         ids=["superscript-two", "5000-digits", "negative", "exponent", "too-big"])
def test_a_malformed_content_length_is_a_4xx(limited, length, code):
    head = b"POST /%s/api/session HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %s\r\n\r\n" % (
        limited.token.encode(), limited.port, length)
    answer = limited.raw(head)
    assert status(answer) == code and b"Traceback" not in answer, answer
    assert limited.alive()


def test_chunked_bodies_and_deep_json_are_refused(limited):
    answer = request(limited, "POST", "api/session", ["Transfer-Encoding: chunked"])
    assert status(answer) == 411, answer
    answer = request(limited, "POST", "api/run", body=b"[" * 60_000)
    assert status(answer) == 400 and b"JSON object" in answer, answer
    assert limited.alive()


@pytest.mark.parametrize("line", [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"BREW / HTTP/1.1\r\n\r\n"])
def test_a_malformed_request_has_the_security_headers(limited, line):
    answer = limited.raw(line)
    assert 400 <= status(answer) < 600 and b"Content-Security-Policy: default-src 'none'" in answer, answer


@pytest.mark.parametrize("host", ["evil.example:%d", "evil.example", "127.0.0.1:1", "127.0.0.1@evil.example:%d",
                                  "", "localhost:%d/x"])
def test_a_request_for_another_host_is_refused(limited, host):
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1."""
    value = host % limited.port if "%d" in host else host
    answer = request(limited, "GET", "", host=value)
    assert status(answer) in (400, 403), answer


@pytest.mark.parametrize("host", ["127.0.0.1:%d", "localhost:%d", "LOCALHOST:%d"])
def test_the_servers_own_names_are_answered(limited, host):
    answer = request(limited, "GET", "", host=host % limited.port)
    assert status(answer) == 200, answer[:200]


def test_a_request_from_another_origin_is_refused(limited):
    answer = request(limited, "POST", "api/session", ["Origin: http://evil.example"], body=b"{}")
    assert status(answer) == 403 and b"its own page" in answer, answer
    answer = request(limited, "POST", "api/session", ["Origin: null"], body=b"{}")
    assert status(answer) == 403
    own = "Origin: http://127.0.0.1:%d" % limited.port
    answer = request(limited, "POST", "api/session", [own], body=b"{}")
    assert status(answer) == 200, answer[:300]


def test_connections_past_the_bound_are_refused_at_once_and_the_server_goes_on(limited):
    from fdsl.serve.server import MAX_CONNECTIONS

    held = [socket.create_connection(("127.0.0.1", limited.port)) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        time.sleep(1.0)  # all accepted; none past its request timeout (2 s) yet
        answers = []
        for sock in held:
            sock.settimeout(0.1)
            try:
                answers.append(sock.recv(65536))
            except OSError:
                answers.append(b"")
        busy = [a for a in answers if status(a) == 503]
        assert len(busy) == 8 and b"too many connections" in busy[0], answers
        assert answers.count(b"") == MAX_CONNECTIONS
    finally:
        for sock in held:
            sock.close()
    assert wait_for(lambda: limited.get(limited.url)[0] == 200, timeout=10)


def test_the_server_stops_on_sigterm_and_sigint_whatever_its_connections_do():
    for sig in (signal.SIGTERM, signal.SIGINT):
        s = Served(address_space=4 * GB)
        held = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(10)]
        half = socket.create_connection(("127.0.0.1", s.port))
        half.sendall(b"POST /%s/api/session HTTP/1.1\r\nContent-Length: 10\r\n\r\n{" % s.token.encode())
        try:
            time.sleep(0.5)
            s.proc.send_signal(sig)
            s.proc.wait(20)
        finally:
            for sock in held + [half]:
                sock.close()
            s.stop()
        assert s.proc.returncode in (0, 130), (sig, s.proc.returncode, s.stderr)


# ---- sessions own their processes


LONG = "eval(trace(%s))" % " ".join(["B"] * 400)


def test_closing_a_session_while_it_runs_leaves_no_process():
    s = Served()
    try:
        for _ in range(3):
            code, fresh = s.post("api/session", {})
            sid = fresh["id"]
            for line in ("dim big = 1500", "const B : big x big", "random 0"):
                assert s.post("api/run", {"id": sid, "input": line})[1]["ok"]
            done = []
            runner = threading.Thread(target=lambda: done.append(s.post("api/run", {"id": sid, "input": LONG})))
            runner.start()
            time.sleep(1.0)
            assert s.post("api/close", {"id": sid})[0] == 200
            runner.join(30)
            assert done and done[0][0] == 200 and "session was closed" in str(done[0][1]), done
        assert wait_for(lambda: not s.workers(), timeout=10), s.workers()  # no worker for a closed session
    finally:
        s.stop()


def test_a_busy_session_is_evicted_last_and_its_process_ends(monkeypatch):
    monkeypatch.setattr(sessions_module, "MAX_SESSIONS", 2)
    pool = Sessions(Options())
    try:
        busy, _ = pool.open()
        idle, _ = pool.open()
        for line in ("dim big = 1500", "const B : big x big", "random 0"):
            assert pool.get(busy).request({"op": "run", "input": line}, 30)["ok"]
        worker = pool.get(busy)
        done = []
        runner = threading.Thread(target=lambda: done.append(worker.request({"op": "run", "input": LONG}, 60)))
        runner.start()
        time.sleep(1.0)
        third, _ = pool.open()  # one too many: the idle one goes, not the busy one
        assert pool.get(idle) is None and pool.get(busy) is worker and pool.get(third) is not None
        fourth, _ = pool.open()  # every other one busy (the third is idle): the third goes
        assert pool.get(third) is None and pool.get(busy) is worker
        worker.stop()
        runner.join(30)
        assert done and "interrupted" in str(done[0]), done
    finally:
        pool.close_all()
    assert all(w.proc is None or w.proc.poll() is not None for w in [worker])


def test_a_worker_that_cannot_start_is_reported_on_every_request():
    pool = Sessions(Options(memory_limit=1))  # 1 MiB: Python cannot start (the command line refuses it)
    try:
        sid, items = pool.open()
        assert "could not start" in str(items) and "--memory-limit 1 MiB may be too small" in str(items), items
        for _ in range(2):
            reply = pool.get(sid).request({"op": "run", "input": "1 + 1"}, 10)
            assert reply["ok"] is False and "could not start" in str(reply["items"]), reply
    finally:
        pool.close_all()


def test_a_sessions_folder_holds_at_most_its_quota():
    """--disk-limit 20: a file of 32 MB fails as it is written; three of 8 MB fill the folder, and
    the fourth is refused before it is opened. The session goes on."""
    s = Served("--disk-limit", "20")
    try:
        sid = s.post("api/session", {})[1]["id"]

        def run(text):
            return s.post("api/run", {"id": sid, "input": text})[1]

        for line in ("dim n = 1000, m = 2000", "const A : n x n, B : m x m", "random 0"):
            assert run(line)["ok"]
        reply = run('save "b.npz" B')
        assert not reply["ok"] and "File too large" in str(reply["items"]), reply
        for name in ("a1", "a2", "a3"):
            assert run('save "%s.npz" A' % name)["ok"]
        reply = run('save "a4.npz" A')
        assert not reply["ok"] and "holds its quota of 20 MiB" in str(reply["items"]), reply
        assert run("1 + 1")["ok"]
    finally:
        s.stop()


# ---- --open


def test_open_puts_no_token_on_the_browsers_command_line(tmp_path):
    """The browser is given a file readable by this user alone, which sends it on to the URL."""
    record = tmp_path / "argv"
    browser = tmp_path / "fake-browser"
    browser.write_text("#!%s\nimport sys\nopen(%r, 'w').write('\\n'.join(sys.argv))\n" % (sys.executable, str(record)))
    browser.chmod(0o755)
    s = Served("--open", env={"BROWSER": str(browser)})
    try:
        assert wait_for(record.exists, timeout=30)
        argv = wait_for(lambda: record.read_text(), timeout=10).split("\n")
        assert len(argv) == 2 and s.token not in record.read_text(), argv
        page = Path(unquote(urlsplit(argv[1]).path))
        assert argv[1].startswith("file://") and page.is_file(), argv
        assert stat.S_IMODE(page.stat().st_mode) == 0o600 and stat.S_IMODE(page.parent.stat().st_mode) == 0o700
        text = page.read_text()
        assert 'http-equiv="refresh"' in text and s.url in text
        assert s.get(s.url)[0] == 200
    finally:
        s.stop()
    assert not page.exists()  # removed when the server stops


# ---- the limit options


@pytest.mark.parametrize("args, what", [
    (["--port", "70000"], "--port: a port is 0 to 65535"), (["--port", "-1"], "--port: a port is 0 to 65535"),
    (["--port", "x"], "--port: 'x' is not a port number"),
    (["--time-limit", "inf"], "--time-limit: must be a positive"), (["--time-limit", "nan"], "--time-limit"),
    (["--time-limit", "0"], "--time-limit: must be a positive"), (["--time-limit", "-2"], "--time-limit"),
    (["--memory-limit", "0"], "--memory-limit: must be at least"), (["--memory-limit", "-5"], "--memory-limit"),
    (["--memory-limit", "1"], "--memory-limit: must be at least 1024 MiB"),
    (["--memory-limit", "1e9"], "--memory-limit: '1e9' is not a whole number"),
    (["--request-timeout", "0"], "--request-timeout: must be a positive"),
    (["--disk-limit", "0"], "--disk-limit: must be at least 1")])
def test_a_limit_option_out_of_range_is_a_usage_error(run_fdsl, args, what):
    r = run_fdsl("serve", *args, timeout=60)
    assert r.returncode == 2 and what in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_server_under_a_limit_reports_no_traceback(limited):
    """Everything above was answered without a traceback on the server's stderr."""
    assert limited.alive()
    fd = limited.proc.stderr.fileno()
    os.set_blocking(fd, False)
    try:
        text = os.read(fd, 1 << 20)
    except BlockingIOError:
        text = b""
    finally:
        os.set_blocking(fd, True)
    assert b"Traceback" not in text, text


# ---- what a page may read (item 4): the served file's folder without its hidden files, and no more


@pytest.fixture(scope="module")
def confined(tmp_path_factory):
    """A server of ``home/proj/model.fd`` (HOME is ``home``), beside secrets a page must not read:
    hidden files and folders of ``proj``, and files above it. The program loads a values file and a
    rule file of its folder, which must still work."""
    import numpy as np

    home = tmp_path_factory.mktemp("home")
    proj = home / "proj"
    (proj / ".git").mkdir(parents=True)
    (proj / "data").mkdir()
    (home / ".env").write_text("TOKEN=home-secret\n")
    (proj / ".env").write_text("TOKEN=proj-secret\n")
    (proj / ".git" / "config").write_text('[remote "origin"]\n\turl = https://user:secret@example.com/x\n')
    (proj / "data" / ".secret").write_text("hidden inside a visible folder\n")
    (home / "x").write_text("above the served folder\n")
    with open(home / "big", "wb") as f:  # 100 MB without taking the disk: only its size tells
        f.truncate(100 << 20)
    os.symlink(home / "x", proj / "up")  # a link out of the folder
    os.symlink(proj / ".env", proj / "plain")  # a link to a hidden file
    np.savez(proj / "vals.npz", X=np.eye(2))
    (proj / "extra.rules").write_text("ruleset extra\nrule swap: m(m(?A)) => m(?A)\n")
    (proj / "uses.rules").write_text('import "extra"\nimport "d"\n')  # beside it, and the stdlib
    for i, target in enumerate(TARGETS):
        (proj / ("imports%d.rules" % i)).write_text('import "%s"\n' % target(home).replace("\\", "/"))
    (proj / "model.fd").write_text('dim n = 2\nconst X : n x n\nvalues "vals.npz"\nrules "extra.rules"\n'
                                   "show eval(trace(X))\n")
    s = Served(str(proj / "model.fd"), env={"HOME": str(home)})
    code, reply = s.post("api/session", {})
    assert code == 200, reply
    yield s, reply, home
    s.stop()


# each path a page may not look at, as a function of HOME: what is there varies (a hidden file or
# folder, a file above, a link out or to a hidden file, a device, a folder, a big file, nothing)
TARGETS = [lambda h: str(h / "proj" / ".env"), lambda h: str(h / "proj" / ".git" / "config"),
           lambda h: str(h / "proj" / ".git"), lambda h: str(h / "proj" / "data" / ".secret"),
           lambda h: str(h / "proj" / ".nothing"), lambda h: str(h / "proj" / "up"),
           lambda h: str(h / "proj" / "plain"), lambda h: str(h / "proj" / ".." / "x"), lambda h: str(h / "x"),
           lambda h: str(h / "big"), lambda h: str(h / "nothing"), lambda h: str(h), lambda h: "~/.env",
           lambda h: "/etc/passwd", lambda h: "/dev/zero", lambda h: "/etc", lambda h: "/no/such/folder/x"]
TARGET_IDS = ["hidden", "git-config", "hidden-folder", "hidden-in-folder", "hidden-nothing", "link-out",
              "link-to-hidden", "dotdot", "above", "big", "nothing-above", "folder-above", "tilde", "passwd",
              "device", "folder", "nothing"]
OUTSIDE = "it is outside the session's folders"


def _errors(reply) -> str:
    return "\n".join(i["text"] for i in reply["items"] if i["kind"] == "error")


@pytest.mark.parametrize("statement", ['values "%s"', 'rules "%s"', ":load %s"], ids=["values", "rules", "load"])
def test_a_path_outside_gets_one_refusal_whatever_is_there(confined, statement):
    """Each path above, named by a statement or a command, is refused with the same words: not a
    word of whether it exists, is a folder, a device, a big or a hidden file (before, ``os.stat``
    ran first, and the hidden files of the served folder were read)."""
    s, first, home = confined
    said = {}
    for target in TARGETS:
        path = target(home)
        if path.startswith("~") and not statement.startswith(":"):
            continue  # only :load expands ~ (in a statement it is a folder of the session's own)
        reply = s.post("api/run", {"id": first["id"], "input": statement % path})[1]
        assert not reply["ok"], (path, reply)
        said[path] = _errors(reply).replace(path.replace("~", str(home), 1), "PATH").replace(path, "PATH")
    assert len(set(said.values())) == 1, said
    text = set(said.values()).pop()
    assert OUTSIDE in text and "secret" not in text and "Traceback" not in text, text


def test_an_import_outside_gets_the_same_refusal(confined):
    """A rule file of the served folder that imports one of the paths: refused at its import, in
    the same words whatever is there."""
    s, first, home = confined
    said = set()
    for i, target in enumerate(TARGETS):
        if target(home).startswith("~"):
            continue
        importer = str(home / "proj" / ("imports%d.rules" % i))
        reply = s.post("api/run", {"id": first["id"], "input": 'rules "%s"' % importer})[1]
        assert not reply["ok"], reply
        said.add(_errors(reply).replace(importer, "IMPORTER").replace(target(home).replace("\\", "/"), "PATH"))
    assert len(said) == 1 and OUTSIDE in said.pop(), "\n\n".join(said)


def test_what_the_program_needs_is_still_read(confined):
    """The served file, its values file and rule file, another rule file beside it importing one
    beside it and one of the stdlib, a file of the session's own folder: all read; a missing file
    inside the served folder is said to be missing."""
    s, first, home = confined
    proj = home / "proj"
    assert "2" in "\n".join(i.get("text", "") for i in first["items"]) and not _errors(first), first
    sid = first["id"]

    def ok(text):
        reply = s.post("api/run", {"id": sid, "input": text})[1]
        assert reply["ok"], (text, reply)
        return reply

    ok('values "%s"' % (proj / "vals.npz"))
    ok('rules "%s"' % (proj / "uses.rules"))
    ok('save "mine.npz" X')
    ok('values "mine.npz"')  # relative: the session's own folder
    reply = s.post("api/reset", {"id": sid})[1]  # the served file loaded again
    assert reply["ok"] and [i["text"] for i in reply["items"]] == ["2"], reply
    reply = s.post("api/run", {"id": sid, "input": 'values "%s"' % (proj / "missing.npz")})[1]
    assert "no such file" in _errors(reply), reply


# ---- names that are not file names (item 7): a lone surrogate in a request


@pytest.mark.parametrize("statement", ['values "%s.npz"', 'rules "%s.rules"', ":load %s.fd", 'save "%s.npz" X',
                                       'diagram(X, "%s.svg")', 'plot(X, "%s.png")'],
                         ids=["values", "rules", "load", "save", "diagram", "plot"])
def test_a_lone_surrogate_in_a_path_is_refused_with_a_message(confined, statement):
    """A JSON request may carry "\\ud800", which no file name can hold: each place a session takes a
    path says so (before, "internal error, a bug in fdsl" for rules and :load, numpy's encoding
    error for values); the session goes on."""
    s, first, _ = confined
    reply = s.post("api/run", {"id": first["id"], "input": statement % "a\ud800b"})[1]
    text = _errors(reply)
    assert not reply["ok"] and "internal error" not in text and "Traceback" not in text, reply
    if not statement.startswith("plot"):  # plot may say first that matplotlib is missing
        assert "a lone surrogate" in text and "a\\ud800b" in text, text
    assert s.post("api/run", {"id": first["id"], "input": "1 + 1"})[1]["ok"]


def test_a_name_that_is_not_utf8_is_written_and_shown_escaped(confined):
    """``\\udcff`` is the byte 0xff of a name that is not UTF-8: written under that byte, said as
    ``\\xff``, and every text of the reply is printable (no lone surrogate reaches the page)."""
    s, first, _ = confined
    reply = s.post("api/run", {"id": first["id"], "input": 'diagram(X, "a\udcff.svg")\nshow "\x1b[2J\ud800"'})[1]
    assert reply["ok"], reply
    texts = [i.get("text", i.get("caption")) for i in reply["items"]]
    assert any("wrote a\\xff.svg" in t for t in texts) and any("\\x1b[2J\\ud800" in t for t in texts), texts
    assert not any(re.search("[\x00-\x08\x0b-\x1f\ud800-\udfff]", t) for t in texts), texts


def test_a_served_file_whose_name_is_not_utf8_is_loaded_and_named_escaped(tmp_path):
    name = os.fsdecode(b"m\xff.fd")
    (tmp_path / name).write_text("dim n = 2\nshow 1 + 1\n")
    s = Served(str(tmp_path / name))
    try:
        code, reply = s.post("api/session", {})
        assert code == 200 and reply["file"] == "m\\xff.fd" and not _errors(reply), reply
        assert reply["items"] and reply["items"][0]["text"] == "2", reply
    finally:
        s.stop()
