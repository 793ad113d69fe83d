"""The server's side of the sessions: one worker process per page load, and its limits.

Vocabulary
----------
session     what one page load talks to: an id (random, in every request the page makes), a worker
            process (``fdsl.serve.worker``) and its own folder, a fresh temporary folder.
time limit  seconds one command may run. Past it the worker is interrupted (SIGINT: the command
            stops, the session keeps its definitions); a worker that does not answer within
            ``GRACE`` seconds more is killed and started afresh (FILE loaded again), and the reply
            says so. Stop (the page's button) does the same at once.
ended       a worker that exits on its own (killed for memory by the system, or a bug) is started
            afresh on the next request, with a reply that says what happened: the server, and the
            other sessions, go on. A worker that cannot start (a memory limit too small for Python)
            is reported on every request, never written to.
closed      a session closed by its page, or evicted when more than ``MAX_SESSIONS`` are open: its
            worker is killed and none is ever started for it again, whatever request was running
            (so a server has at most one worker per live session). A session with a request under
            way is evicted only when every session has one.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

GRACE = 3.0  # seconds an interrupted command has to stop before its worker is killed
START_LIMIT = 120.0  # seconds a worker may take to start and load FILE
MAX_SESSIONS = 16  # past this, the session used least recently is closed


class Options:
    def __init__(self, file=None, step_limit=None, size_limit=None, time_limit=60.0, memory_limit=None,
                 request_timeout=None, disk_limit=None):
        self.file = str(Path(file).resolve()) if file else None
        self.step_limit, self.size_limit = step_limit, size_limit
        self.time_limit, self.memory_limit = time_limit, memory_limit
        self.disk_limit = disk_limit  # MiB a session's folder may hold
        self.request_timeout = request_timeout  # seconds a client has for one request (None: the server's default)


class Worker:
    """One session's worker process and the pipe to it; one request at a time."""

    def __init__(self, options: Options, folder: Path):
        self.options = options
        self.folder = folder
        self.lock = threading.Lock()  # one request at a time; stop() does not take it
        self.busy = False
        self.serial = 0  # requests sent: Stop's kill is for the request it stopped, not a later one
        self.used = time.monotonic()
        self.proc: Optional[subprocess.Popen] = None
        self.closed = False  # set once, by close(): no worker is started after it
        self.guard = threading.Lock()  # proc and closed; held for moments, never while waiting on the worker

    def start(self) -> list:
        """Start the worker; the items of loading FILE."""
        if self.closed:
            return [error(CLOSED)]
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        o = self.options
        cmd = [sys.executable, "-m", "fdsl.serve.worker", "--own", str(self.folder)]
        for flag, value in (("--file", o.file), ("--step-limit", o.step_limit), ("--size-limit", o.size_limit),
                            ("--time-limit", o.time_limit), ("--memory-limit", o.memory_limit),
                            ("--disk-limit", o.disk_limit)):
            if value is not None:
                cmd += [flag, str(value)]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", FDSL_PROGRESS="0")
        # a session of its own: Ctrl-C in the server's terminal is the server's, not the workers'
        with self.guard:
            if self.closed:  # closed while it was being started
                return [error(CLOSED)]
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, encoding="utf-8", start_new_session=True,
                                             env=env)
            except OSError as e:  # no process to be had (a process or memory limit of the server's)
                self.proc = None
                return [error("the session could not start: %s" % (e.strerror or e))]
            self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.replies), daemon=True).start()
        try:
            reply = self._receive(START_LIMIT)
        except TimeoutError:
            reply = None
        if reply is None:
            why = self.ended() if self.proc.poll() is not None else "took more than %d s" % START_LIMIT
            self.kill()
            limit = self.options.memory_limit
            hint = " (--memory-limit %d MiB may be too small)" % limit if limit and not self.closed else ""
            return [error("the session could not start: %s%s" % (why, hint))]
        return reply.get("items", [])

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @staticmethod
    def _read(proc, replies) -> None:
        for line in proc.stdout:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
        replies.put(None)  # the worker ended

    def _receive(self, timeout: float):
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def request(self, message: dict, time_limit: Optional[float]) -> dict:
        """Send one request and wait for its reply, within the time limit."""
        with self.lock:
            self.used = time.monotonic()
            notes: list = []
            if not self.running():
                notes = self.restart("the session had ended")
                if message.get("op") == "reset" or not self.running():  # reset done, or it cannot start
                    return {"items": notes, "ok": message.get("op") == "reset" and self.running()}
            self.busy = True
            self.serial += 1
            try:
                reply = self._request(message, time_limit)
            finally:
                self.busy = False
            if notes and "items" in reply:  # the note that it was started afresh comes first
                reply["items"] = notes + reply["items"]
            return reply

    def _request(self, message: dict, time_limit: Optional[float]) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            try:
                reply = self._receive(time_limit if time_limit else 1e9)
            except TimeoutError:
                self.interrupt()
                try:
                    reply = self._receive(GRACE)
                except TimeoutError:
                    reply = None
                note = "stopped: the command ran past the time limit of %g s (fdsl serve --time-limit)" % time_limit
                if reply is None:
                    return {"items": [error(note)] + self.restart("it did not stop"), "ok": False}
                reply.setdefault("items", []).append(error(note))
                return reply
            if reply is None:
                return {"items": self.restart(self.ended()), "ok": False}
            return reply
        except (OSError, ValueError):  # a broken pipe, or the pipe closed by close()
            return {"items": self.restart(self.ended()), "ok": False}

    def ended(self) -> str:
        code = self.proc.poll() if self.proc else None
        if code is not None and code < 0:
            try:
                return "its worker was killed by %s (a memory limit, or Stop)" % signal.Signals(-code).name
            except ValueError:
                pass
        return "its worker ended (exit status %s)" % code

    def restart(self, why: str) -> list:
        self.kill()
        if self.closed:
            return [error(CLOSED)]
        items = self.start()
        return [error("the session was started afresh: %s; its definitions are gone%s"
                      % (why, " (the program was loaded again)" if self.options.file else ""))] + items

    def interrupt(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGINT)
            except OSError:
                pass

    def stop(self) -> None:
        """The page's Stop: interrupt the command; kill the worker if it does not stop."""
        if not self.busy:
            return
        self.interrupt()
        proc, serial = self.proc, self.serial

        def later():
            time.sleep(GRACE)
            if self.busy and self.serial == serial and self.proc is proc and proc.poll() is None:
                proc.kill()

        threading.Thread(target=later, daemon=True).start()

    def kill(self) -> None:
        with self.guard:
            proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        """End the worker for good: no request, however it ends, starts another."""
        with self.guard:
            self.closed = True
        self.kill()


CLOSED = "the session was closed (the page was left, or more than %d sessions were open): reload the page" \
    % MAX_SESSIONS


def error(text: str) -> dict:
    return {"kind": "error", "text": text}


class Sessions:
    """Every session of one server. Each own folder is a temporary folder of its own, which its
    worker removes when it ends (also when the server is killed and the worker's input closes)."""

    def __init__(self, options: Options):
        self.options = options
        self.sessions: dict = {}
        self.lock = threading.Lock()

    def open(self) -> tuple:
        sid = secrets.token_urlsafe(16)
        worker = Worker(self.options, Path(tempfile.mkdtemp(prefix="fdsl-session-")))
        with worker.lock:  # a session being started counts as busy
            with self.lock:
                self.sessions[sid] = worker
                while len(self.sessions) > MAX_SESSIONS:
                    # the least recently used of those without a request under way, if any
                    others = [k for k in self.sessions if k != sid]
                    oldest = min(others, key=lambda k: (self.sessions[k].lock.locked(), self.sessions[k].used))
                    self._close(oldest)
            return sid, worker.start()

    def get(self, sid) -> Optional[Worker]:
        with self.lock:
            return self.sessions.get(sid) if isinstance(sid, str) else None

    def close(self, sid) -> None:
        with self.lock:
            self._close(sid)

    def _close(self, sid) -> None:
        worker = self.sessions.pop(sid, None)
        if worker is not None:
            worker.close()
            shutil.rmtree(worker.folder, ignore_errors=True)

    def close_all(self) -> None:
        with self.lock:
            for sid in list(self.sessions):
                self._close(sid)
