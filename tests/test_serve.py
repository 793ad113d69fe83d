"""``fdsl serve`` over HTTP, without a browser: the token, the headers, the body cap, sessions apart,
the limits, confinement. The server is started as a person starts it, and after every hostile
request it must still be serving (tests/test_serve_browser.py drives the page itself)."""

from __future__ import annotations

import threading
import time

import pytest
from serve_helpers import Served, wait_for

from fdsl.serve.confine import inside


@pytest.fixture(scope="module")
def server():
    s = Served("examples/encoder2.fd", "--time-limit", "4", "--step-limit", "3000")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def session(server):
    status, reply = server.post("api/session", {})
    assert status == 200, reply
    return reply

# a command that works for a long time without reaching any limit: 80 products of 2000 x 2000
# matrices (the engine's limits stop definitions that explode within a second, so a doubling
# definition no longer runs long)
LONG_SETUP = ("dim big = 2000", "const B : big x big", "random 0")
LONG = "eval(trace(%s))" % " ".join(["B"] * 80)


def run(server, sid, text):
    status, reply = server.post("api/run", {"id": sid, "input": text})
    assert status == 200, reply
    return reply


def texts(reply, kinds=("text", "math")):
    return "\n".join(i["text"] for i in reply["items"] if i["kind"] in kinds)


def test_the_file_is_loaded_and_typeset(session):
    kinds = [i["kind"] for i in session["items"]]
    assert kinds.count("math") >= 3 and "55" in texts(session)
    form = session["items"][0]
    assert form["latex"].startswith(r"-\operatorname{trace}") and form["text"].startswith("-trace(E^t dE)")


@pytest.mark.parametrize("path", ["", "wrong/", "wrong/api/session", "static/console.js", "x/static/console.js"])
def test_a_request_without_the_token_is_refused(server, path):
    status, body, headers = server.get(server.base + path)
    assert status == 403 and b"token" in body
    status, body = server.post(path, {}, url=server.base)
    assert status == 403
    assert server.alive()


def test_a_token_one_character_off_is_refused(server):
    token = server.url.rstrip("/").rsplit("/", 1)[1]
    other = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert server.get(server.base + other + "/")[0] == 403
    assert server.get(server.url)[0] == 200


def test_every_answer_has_the_security_headers(server):
    status, body, headers = server.get(server.url)
    assert status == 200 and b"<textarea" in body
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("style-src-attr")[0]
    assert "default-src 'none'" in csp and "unsafe-eval" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert server.get(server.base + "nope/")[2]["Content-Security-Policy"] == csp  # the 403 too


def test_the_page_loads_nothing_from_elsewhere(server):
    page = server.get(server.url)[1].decode()
    assert "http" not in page.replace('http-equiv', '') and "//" not in page
    status, css, headers = server.get(server.url + "static/katex/katex.min.css")
    assert status == 200 and b"fonts/KaTeX_Main-Regular.woff2" in css
    assert server.get(server.url + "static/katex/fonts/KaTeX_Main-Regular.woff2")[0] == 200
    assert server.get(server.url + "static/katex/LICENSE")[0] == 200
    assert server.get(server.url + "static/../server.py")[0] == 404


def test_a_big_body_is_refused(server, session):
    status, body = server.post("api/run", None, raw=b'{"id": "%s", "input": "%s"}'
                               % (session["id"].encode(), b"x" * 200_000))
    assert status == 413
    assert server.alive()
    assert run(server, session["id"], "show s")["ok"]


def test_sessions_do_not_see_each_other(server, session):
    status, other = server.post("api/session", {})
    assert run(server, other["id"], "mine = X")["ok"]
    reply = run(server, session["id"], "show mine")
    assert not reply["ok"] and "unknown name 'mine'" in texts(reply, ("error",))
    assert run(server, other["id"], "show mine")["ok"]
    server.post("api/close", {"id": other["id"]})
    assert server.post("api/run", {"id": other["id"], "input": "show X"})[0] == 404


def test_a_command_past_the_time_limit_is_stopped_and_the_session_goes_on(server, session):
    assert run(server, session["id"], "keep = X")["ok"]
    for statement in LONG_SETUP:
        assert run(server, session["id"], statement)["ok"]
    started = time.monotonic()
    reply = run(server, session["id"], LONG)
    assert time.monotonic() - started < 4 + 8
    errors = texts(reply, ("error",))
    assert not reply["ok"] and "time limit of 4 s" in errors, reply
    assert run(server, session["id"], "show keep")["ok"]  # interrupted, not killed: definitions kept
    assert server.alive()


def test_stop_interrupts_a_command(server):
    # a session of its own, set up here: this test once leaned on the one before it for B and keep,
    # and failed when run alone
    status, fresh = server.post("api/session", {})
    sid = fresh["id"]
    try:
        for statement in ("keep = X",) + LONG_SETUP:
            assert run(server, sid, statement)["ok"]
        done = []
        thread = threading.Thread(target=lambda: done.append(run(server, sid, LONG)))
        thread.start()
        time.sleep(1.0)
        assert server.post("api/stop", {"id": sid})[0] == 200
        thread.join(15)
        assert done and "interrupted" in texts(done[0], ("error",)), done
        assert run(server, sid, "show keep")["ok"]
    finally:
        server.post("api/close", {"id": sid})


def test_the_step_limit_holds_per_command(server, session):
    reply = run(server, session["id"], "len(forms(Y - encoder(3)))")
    assert "within 3000 steps" in texts(reply, ("error",))
    assert run(server, session["id"], "show s")["ok"]


def test_a_program_writes_only_in_its_own_folder(server, session, tmp_path):
    sid = session["id"]
    assert run(server, sid, "random 1")["ok"]
    outside = tmp_path / "outside.npz"
    reply = run(server, sid, 'save "%s" X' % outside)
    assert not reply["ok"] and "only inside its own folder" in texts(reply, ("error",)), reply
    assert not outside.exists() and not list(tmp_path.iterdir())  # not even a temporary file
    for path in ("../escaped.npz", "/tmp/escaped-fdsl.npz"):
        assert not run(server, sid, 'save "%s" X' % path)["ok"]
    reply = run(server, sid, 'save "mine.npz" X')
    assert reply["ok"], reply
    reply = run(server, sid, ':diagram X Q[0]')
    assert [i["kind"] for i in reply["items"]] == ["svg"]
    reply = run(server, sid, 'diagram(X Q[0], "xq.svg")')  # written in its own folder, and shown
    assert sorted(i["kind"] for i in reply["items"]) == ["file", "svg", "text"], reply
    assert "wrote xq.svg" in texts(reply), reply
    assert not run(server, sid, 'diagram(X Q[0], "%s")' % (tmp_path / "xq.svg"))["ok"]
    assert not (tmp_path / "xq.svg").exists()
    assert server.alive()


@pytest.mark.parametrize("statement", ['values "/etc/passwd"', 'rules "/etc/hostname"', ":load /etc/hostname"])
def test_a_program_reads_nothing_outside_its_folders(server, session, statement):
    reply = run(server, session["id"], statement)
    assert not reply["ok"] and "outside the session's folders" in texts(reply, ("error",)), reply
    assert server.alive()


def test_a_worker_that_dies_is_started_afresh(server):
    import os
    import signal
    import subprocess

    def workers():
        return set(subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split())

    before = workers()
    status, fresh = server.post("api/session", {})
    sid = fresh["id"]
    (pid,) = workers() - before  # this session's worker
    os.kill(int(pid), signal.SIGKILL)
    reply = run(server, sid, "show s")
    assert "started afresh" in texts(reply, ("error",)), reply
    assert run(server, sid, "show s")["ok"]


def test_the_repl_conveniences_work(server, session):
    sid = session["id"]
    assert run(server, sid, "coeff(N, K[0])")["ok"]
    reply = run(server, sid, "depends(_, Q[1])")
    assert texts(reply) == "true, via aa(...) > mm(...) > G_encoder_1 > Q_1"
    assert "weight K[i] : d x k" in texts(run(server, sid, "K?"))


def test_stopping_the_server_ends_its_workers_and_removes_their_folders():
    import os
    import subprocess

    s = Served()
    try:
        for _ in range(2):
            assert s.post("api/session", {})[0] == 200
        pids = subprocess.run(["pgrep", "-P", str(s.proc.pid)], capture_output=True, text=True).stdout.split()
        folders = [open("/proc/%s/cmdline" % p).read().split("\0")[4] for p in pids]
        assert len(pids) == 2 and all(os.path.isdir(f) for f in folders), folders
    finally:
        s.stop()
    assert s.proc.returncode == 0
    assert not any(os.path.exists("/proc/%s" % p) for p in pids)
    assert not any(os.path.exists(f) for f in folders)


def test_inside():
    assert inside("/a/b/c", ["/a/b"]) and inside("/a/b", ["/a/b"]) and not inside("/a/bc", ["/a/b"])


def test_the_command_line_refuses_a_missing_file(run_fdsl):
    r = run_fdsl("serve", "no/such.fd", "--port", "0")
    assert r.returncode == 2 and "no/such.fd" in r.stderr and "Traceback" not in r.stderr


def test_another_host_is_warned_about():
    s = Served("--host", "0.0.0.0")
    try:
        assert wait_for(lambda: s.alive())
    finally:
        s.stop()
    assert "warning: listening on 0.0.0.0" in s.stderr


def test_the_memory_and_size_limits_hold_per_command():
    """--memory-limit caps a session's process: the CLI's memory budget then answers within it;
    --size-limit stops a rewrite that builds too much. The session goes on after both."""
    s = Served("--memory-limit", "3000", "--size-limit", "20000")
    try:
        status, fresh = s.post("api/session", {})
        sid = fresh["id"]
        for line in ("dim n = 30000, k = 3", "const A : n x n, B : k x k", "weight W : k x k", "random 1"):
            assert run(s, sid, line)["ok"]
        reply = run(s, sid, "show eval(trace(A))")
        assert "more than the memory available" in texts(reply, ("error",)), reply
        assert "GB)" in texts(reply, ("error",)) and "(1." in texts(reply, ("error",))  # half of 3000 MiB, less
        reply = run(s, sid, "len(forms(" + "(B - W B)" * 8 + "))")  # 2^8 products multiplied out
        assert "the size limit" in texts(reply, ("error",)), reply
        assert run(s, sid, "show eval(trace(B))")["ok"]
        assert s.alive()
    finally:
        s.stop()


def test_a_port_in_use_is_a_clear_error(server, run_fdsl):
    port = server.url.split(":")[2].split("/")[0]
    r = run_fdsl("serve", "--port", port, timeout=60)
    assert r.returncode == 2 and "port %s is in use; --port 0 picks a free one" % port in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and server.alive()


# ---- issue 31, item 9: what the console says stays, pictures and files come back -----------------


def files_of(reply):
    return [i["path"] for i in reply["items"] if i["kind"] == "file"]


def test_a_saved_file_is_offered_for_download_from_the_sessions_folder(server, session):
    import io

    import numpy as np

    sid = session["id"]
    assert run(server, sid, "random 1")["ok"]
    reply = run(server, sid, 'save "sub.npz" X')
    assert reply["ok"] and files_of(reply) == ["sub.npz"], reply
    status, body, headers = server.get(server.url + "files/%s/sub.npz" % sid)
    assert status == 200, body
    assert headers["Content-Disposition"].startswith('attachment; filename="sub.npz"')
    assert headers["Content-Type"] == "application/zip" and headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    with np.load(io.BytesIO(body)) as arrays:
        assert [arrays[k].shape for k in arrays.files] == [(8, 6)]
    # the same name in another session's folder, or without the token, is not this file
    status, other = server.post("api/session", {})
    assert server.get(server.url + "files/%s/sub.npz" % other["id"])[0] == 404
    server.post("api/close", {"id": other["id"]})
    assert server.get(server.base + "files/%s/sub.npz" % sid)[0] == 403


@pytest.mark.parametrize("name", ["../sub.npz", "%2e%2e/sub.npz", "..%2fsub.npz", "./sub.npz", "/etc/passwd",
                                  "%2fetc%2fpasswd", "sub.npz/", "", "nothing.npz", "a%00b", "."])
def test_a_download_serves_only_files_inside_the_folder(server, session, name):
    sid = session["id"]
    assert run(server, sid, "random 1")["ok"] and run(server, sid, 'save "sub.npz" X')["ok"]
    status, body, headers = server.get(server.url + "files/%s/%s" % (sid, name))
    assert status == 404 and b"root:" not in body, (status, body[:200])
    assert "Content-Disposition" not in headers
    assert server.alive()


def test_a_download_follows_no_link_and_serves_no_folder(server, session, tmp_path):
    """A link in the session's folder (put there from outside: a program cannot make one) is not
    followed, wherever it points; a folder and a FIFO are not files to serve."""
    import os

    sid = session["id"]
    assert run(server, sid, "random 1")["ok"] and run(server, sid, 'save "kept/x.npz" X')["ok"]
    status, body, _ = server.get(server.url + "files/%s/kept/x.npz" % sid)
    assert status == 200 and body[:2] == b"PK"  # a file in a sub-folder is served
    (pid,) = [p for p in server.workers() if sid_folder(p)]  # the one worker of the module's session
    folder = sid_folder(pid)
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    os.symlink(secret, os.path.join(folder, "out.txt"))
    os.symlink(os.path.join(folder, "kept"), os.path.join(folder, "inside"))  # even one pointing inside
    os.symlink("/", os.path.join(folder, "root"))
    os.mkfifo(os.path.join(folder, "fifo"))
    for name in ("out.txt", "inside/x.npz", "root/etc/passwd", "kept", "fifo"):
        status, body, _ = server.get(server.url + "files/%s/%s" % (sid, name))
        assert status == 404 and b"not yours" not in body and b"root:" not in body, (name, status)
    assert server.alive()


def sid_folder(pid):
    """The own folder of worker PID (its --own argument), if it is the module's session's."""
    import os

    args = open("/proc/%s/cmdline" % pid).read().split("\0")
    folder = args[args.index("--own") + 1]
    return folder if os.path.isdir(folder) and os.path.exists(os.path.join(folder, "kept")) else None


def test_a_plot_comes_back_as_a_picture_and_a_file(server, session):
    sid = session["id"]
    assert run(server, sid, "random 1")["ok"]
    assert run(server, sid, "run1 = train(w, 3, 0.01, 1)")["ok"]
    reply = run(server, sid, 'plot "loss.png" run1')
    assert reply["ok"], reply
    kinds = [i["kind"] for i in reply["items"]]
    assert "png" in kinds and files_of(reply) == ["loss.png"], kinds
    png = next(i for i in reply["items"] if i["kind"] == "png")
    import base64

    assert base64.b64decode(png["png"])[:8] == b"\x89PNG\r\n\x1a\n"
    status, body, headers = server.get(server.url + "files/%s/loss.png" % sid)
    assert status == 200 and body[:4] == b"\x89PNG" and headers["Content-Type"] == "image/png"


def test_load_reads_a_file_beside_the_served_one(server):
    status, fresh = server.post("api/session", {})
    sid = fresh["id"]
    try:
        reply = run(server, sid, ":reset")
        reply = run(server, sid, ":load natural.fd")  # examples/natural.fd, beside examples/encoder2.fd
        assert reply["ok"], texts(reply, ("error",))
        assert "true, via encoder_5" in texts(reply)
        assert not run(server, sid, ":load no-such.fd")["ok"]
    finally:
        server.post("api/close", {"id": sid})
