"""Starting ``fdsl serve`` for the tests, and talking to it over HTTP (tests/test_serve*.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Served:
    """A running ``fdsl serve`` (its own process, as a person starts it) and its URL."""

    def __init__(self, *args, env=None, address_space=None):
        """``env``: more environment variables; ``address_space``: bytes, the server's RLIMIT_AS
        (``ulimit -v``, as a shared machine sets it), which its workers inherit."""
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))

        def limit():
            if address_space:
                import resource

                resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

        self.proc = subprocess.Popen([sys.executable, "-m", "fdsl", "serve", "--port", "0", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=limit)
        line = self.proc.stdout.readline()
        m = re.search(r"(http://\S+/)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError("fdsl serve did not print its URL: %r %r" % (line, self.proc.stderr.read()))
        self.url = m.group(1)
        self.base = self.url.rsplit("/", 2)[0] + "/"  # without the token
        self.token = self.url.rstrip("/").rsplit("/", 1)[1]
        self.port = int(self.base.rsplit(":", 1)[1].strip("/"))

    def workers(self) -> list:
        """The pids of the server's child processes (its sessions' workers), zombies left out."""
        pids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        alive = []
        for pid in pids:
            try:
                with open("/proc/%s/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                        alive.append(pid)
            except OSError:
                pass
        return alive

    def raw(self, data: bytes, timeout: float = 30.0, wait: float = 0.0) -> bytes:
        """Send DATA on a fresh connection (after WAIT seconds, nothing more) and read until the server closes it."""
        import socket

        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(data)
            time.sleep(wait)
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)

    def alive(self) -> bool:
        return self.proc.poll() is None and self.get(self.url)[0] == 200

    def get(self, url):
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read(), dict(e.headers)

    def post(self, path, body, url=None, raw=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request((url or self.url) + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr = self.proc.stderr.read()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()


def wait_for(predicate, timeout=60.0, every=0.1):
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        time.sleep(every)
