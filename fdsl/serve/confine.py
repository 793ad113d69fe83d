"""Where a program run from the browser may read and write: a Python audit hook in the worker.

Vocabulary
----------
own folder   the session's folder (a fresh temporary folder per page load): the only place a
             program run from the page may write (``save``, ``diagram(E, "e.svg")``, the temporary
             files written beside them); typed inputs resolve relative paths against it.
readable     the own folder, the folder of the FILE given to ``fdsl serve``, and what fdsl itself
             is made of: the grammar and the stdlib, the Python installation and its packages.
refused      an open (or rename, remove, mkdir, ...) outside these raises PermissionError, which the
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


def install(own: str, readable, quota: int | None = None) -> None:
    """Confine this process: writes inside ``own`` only, reads inside ``own`` and ``readable``;
    no file opened for writing once ``own`` holds ``quota`` bytes."""
    own = _real(own)
    write_roots = (own,)
    read_roots = tuple(sorted({own} | {_real(r) for r in readable if r}))

    def refuse(path, what):
        raise Refused(13, "fdsl serve: a program run from the page may %s only inside %s"
                      % (what, "its own folder" if what == "write" else "its own folder, the program's folder "
                         "and fdsl's stdlib"), os.fspath(path) if not isinstance(path, bytes) else os.fsdecode(path))

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
            real = _real(path)
            if writing:
                if not inside(real, write_roots):
                    refuse(path, "write")
                if quota is not None and folder_bytes(own) >= quota:
                    raise Refused(122, "fdsl serve: the session's folder holds its quota of %d MiB "
                                  "already (fdsl serve --disk-limit)" % (quota >> 20), os.fspath(path))
            elif real not in _READABLE_FILES and not inside(real, read_roots):
                refuse(path, "read")
        elif event in _WRITE_EVENTS and args:
            check_write(args[0])
        elif event in _TWO_PATH_EVENTS and len(args) >= 2:
            check_write(args[1])
            if event != "shutil.copyfile" and event != "shutil.copytree":
                check_write(args[0])

    sys.addaudithook(hook)


def python_roots() -> list:
    """Python's own library and the folders its packages are imported from (not all of /usr)."""
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {e for e in sys.path if e and os.path.isdir(e) and ("site-packages" in e or "dist-packages" in e)}
    return sorted(roots)
