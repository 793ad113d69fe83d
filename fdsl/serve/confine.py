"""Where a program run from the browser may read and write: a gate on the paths it names, and a
Python audit hook in the worker.

Vocabulary
----------
own folder   the session's folder (a fresh temporary folder per page load): the only place a
             program run from the page may write (``save``, ``diagram(E, "e.svg")``, the temporary
             files written beside them); typed inputs resolve relative paths against it.
served       the FILE given to ``fdsl serve`` and its folder: the page may read the file and what
             lies under its folder, except hidden files (a name on the way that starts with '.':
             ``.env``, ``.git/config``, ``.ssh/``), and nothing above it.
named        a path a program names (``values``, ``rules``, ``import``, ``:load``) may be read in
             the own folder (its hidden files too: the page wrote them), the served folder (as
             above), and fdsl's stdlib; links are followed first, so a link leads no further.
gate         the check of a named path, before anything looks at it (``fdsl.base.inputs.admit``):
             stat, exists and open come after it, so a refused path is told only ``OUTSIDE``,
             the same whether it exists or not, is a folder, a device, a big file or a hidden one.
hook         the audit hook on every open (and rename, remove, mkdir...) in the worker, whatever
             statement or library opens: reads as named paths, plus what fdsl itself is made of
             (the grammar, the Python installation and its packages); writes in the own folder.
refused      a path the hook refuses raises PermissionError with the gate's words, which the
             session reports like any file error; the worker goes on.
quota        bytes the own folder may hold: a file is opened for writing only while the folder holds
             less, and the worker's RLIMIT_FSIZE caps each file at the same size (a write past it
             fails with EFBIG), so the folder never holds more than twice the quota.

fdsl programs are never Python, so the hook is not a sandbox against Python code: it confines
what the language's statements and functions do with the paths a person types (``save
"/home/me/.bashrc" E``, ``values "/etc/shadow"``), whatever statement or library opens them.
It is installed after the worker has imported what it needs, so imports are not its business.
"""

from __future__ import annotations

import os
import sys

from ..base.errors import FdslError
from ..base.inputs import OUTSIDE, set_gate

# opening with any of these writes (or creates) the file
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# events whose first argument is a path written (or removed, or changed)
_WRITE_EVENTS = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                 "shutil.rmtree", "os.chflags", "os.setxattr", "os.removexattr"}
# events with a source and a destination, both confined
_TWO_PATH_EVENTS = {"os.rename", "os.replace", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree",
                    "shutil.move"}
# files the memory budget reads (fdsl.base.inputs)
_READABLE_FILES = {"/proc/meminfo", "/proc/self/statm", "/dev/null", "/dev/urandom"}


def _real(path) -> str:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return os.path.realpath(os.fspath(path))


def inside(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


class Refused(PermissionError):
    pass


def folder_bytes(folder: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def hidden(path: str, root: str) -> bool:
    """Whether ``path`` (inside ``root``) passes through a hidden name below ``root``."""
    rest = path[len(root.rstrip(os.sep)):]
    return any(part.startswith(".") for part in rest.split(os.sep))


class Folders:
    """What a session may read: ``named`` is the gate's rule, ``opened`` the hook's."""

    def __init__(self, own: str, served=None, stdlib=(), system=()):
        self.own = _real(own)
        self.served_file = _real(served) if served else None
        self.served = os.path.dirname(self.served_file) if served else None
        self.stdlib = tuple(_real(r) for r in stdlib)
        self.system = tuple(sorted({_real(r) for r in system if r}))

    def named(self, real: str) -> bool:
        if real == self.served_file or inside(real, self.stdlib) or inside(real, (self.own,)):
            return True
        return self.served is not None and inside(real, (self.served,)) and not hidden(real, self.served)

    def opened(self, real: str) -> bool:
        # fdsl's own files first: a virtual environment in a hidden folder of the served one (.venv) is read
        return real in _READABLE_FILES or inside(real, self.system) or self.named(real)


def refusal(what: str = "file") -> str:
    return "cannot read this %s: %s" % (what, OUTSIDE)


def install(own: str, readable, quota: int | None = None, served=None, stdlib=()) -> None:
    """Confine this process: writes inside ``own`` only; reads as ``Folders`` says, with
    ``readable`` what fdsl is made of (``stdlib``: the stdlib's rule files, which a program may
    name); no file opened for writing once ``own`` holds ``quota`` bytes. Named paths pass the gate
    (``fdsl.base.inputs.set_gate``)."""
    folders = Folders(own, served, stdlib, list(readable) + [own])
    own = folders.own
    write_roots = (own,)

    def gate(path, what):
        try:
            real = _real(path)
        except (OSError, ValueError):  # a name that cannot be looked up is not inside either
            real = None
        if real is None or not folders.named(real):
            raise FdslError(refusal(what), file=os.fsdecode(path) if isinstance(path, bytes) else os.fspath(path))

    def refuse(path, what):
        shown = os.fspath(path) if not isinstance(path, bytes) else os.fsdecode(path)
        if what == "read":  # the gate's words: a path that slipped past it is told no more
            raise Refused(13, OUTSIDE, shown)
        raise Refused(13, "fdsl serve: a program run from the page may write only inside its own folder", shown)

    def check_write(path):
        if isinstance(path, int) or path is None:
            return  # a file descriptor already open
        if not inside(_real(path), write_roots):
            refuse(path, "write")

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if path is None or isinstance(path, int):
                return
            writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or \
                      (isinstance(mode, str) and any(c in mode for c in "wax+"))
            try:
                real = _real(path)
            except (OSError, ValueError):  # a name no file system holds: open would refuse it too
                return
            if writing:
                if not inside(real, write_roots):
                    refuse(path, "write")
                if quota is not None and folder_bytes(own) >= quota:
                    raise Refused(122, "fdsl serve: the session's folder holds its quota of %d MiB "
                                  "already (fdsl serve --disk-limit)" % (quota >> 20), os.fspath(path))
            elif not folders.opened(real):
                refuse(path, "read")
        elif event in _WRITE_EVENTS and args:
            check_write(args[0])
        elif event in _TWO_PATH_EVENTS and len(args) >= 2:
            check_write(args[1])
            if event != "shutil.copyfile" and event != "shutil.copytree":
                check_write(args[0])

    set_gate(gate)
    sys.addaudithook(hook)


def python_roots() -> list:
    """Python's own library and the folders its packages are imported from (not all of /usr)."""
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {e for e in sys.path if e and os.path.isdir(e) and ("site-packages" in e or "dist-packages" in e)}
    return sorted(roots)
