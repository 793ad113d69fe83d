"""Inputs: reading the files a user names (programs, rule files, value files) without trusting them.

Vocabulary
----------
source      a program (.fd) or rule file (.rules): read only if it is a regular file (not a device
            such as /dev/zero, a pipe or a folder) of at most ``MAX_SOURCE_BYTES``, as UTF-8; a
            leading byte-order mark is accepted and dropped.
budget      the memory an allocation may take: half of what the system reports available
            (``MemAvailable``, capped by the process's own address-space limit), since an operation
            holds its operands and its result at once. Arrays (values read from files, random
            values, results of evaluation) are checked against it before they are made, so a huge
            dim is a message instead of a MemoryError or the machine swapping.
gate        the confinement of the paths a program names, where one is set (``fdsl serve``'s
            worker: ``fdsl.serve.confine``): ``admit`` passes a path through it before anything
            looks at the path (stat, exists, open), so a path outside gets one message, the same
            whether it exists or not, is a folder, a device, a big file or a hidden one.
"""

from __future__ import annotations

import os
import resource
import stat
from pathlib import Path

from .errors import FdslError, printable

MAX_SOURCE_BYTES = 64 * 1024 * 1024  # a program or rule file larger than this is not a program

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
          (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"))


def kind_of(mode: int) -> str:
    """'a folder', 'a device', ... for a file mode that is not a regular file's."""
    return next((k for test, k in _KINDS if test(mode)), "not a regular file")


_PSEUDO = ("/dev", "/proc", "/sys")


def pseudo(path: str):
    """The pseudo file system (/dev, /proc, /sys) writing ``path`` would pass through, or None:
    the path itself, each folder on the way and each link followed, hop by hop."""
    seen = 0
    current = os.path.abspath(path)
    while True:
        for p in (current, os.path.realpath(os.path.dirname(current))):
            top = next((t for t in _PSEUDO if p == t or p.startswith(t + "/")), None)
            if top:
                return top
        if not os.path.islink(current) or seen > 40:
            return None
        seen += 1
        current = os.path.join(os.path.realpath(os.path.dirname(current)), os.readlink(current))


# the confinement of the paths a program names (None: any path may be looked at): gate(path, what)
# raises an FdslError for a path outside; set in a session's worker by fdsl.serve.confine
_GATE = None

# the whole of what a path outside the gate is told, whatever is there
OUTSIDE = "it is outside the session's folders"


def set_gate(gate) -> None:
    global _GATE
    _GATE = gate


def check_name(path, doing: str) -> None:
    """An FdslError if ``path`` cannot be a file name: a NUL character, or a lone surrogate that no
    file system encoding writes (``\\ud800``, which a JSON request may carry; ``\\udcff``, a byte
    of a name that is not UTF-8, is that byte and is a name). ``doing``: "read this values file"..."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        return
    if "\0" in text:
        raise FdslError("cannot %s: a file name cannot hold a NUL character" % doing, file=repr(text))
    try:
        os.fsencode(text)
    except UnicodeEncodeError as e:
        raise FdslError("cannot %s: a file name cannot hold %s, a lone surrogate (no file system can write one)"
                        % (doing, printable(text[e.start:e.end])), file=text) from None


def admit(path, what: str) -> None:
    """Before anything looks at ``path`` (a ``what`` to read: "rule file", "values file"...): an
    FdslError if it cannot be a file name, or if the gate, where one is set, refuses it."""
    check_name(path, "read this %s" % what)
    if _GATE is not None:
        _GATE(path, what)


# (device, inode, time of change) of every program, rule file and values file this process has read: outputs never
# replace one of them (fdsl/base/files.py), whatever name or link leads there
_READ: set = set()


def remember(path) -> None:
    """Mark ``path`` as an input (before it is read), if it is a regular file."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    if stat.S_ISREG(st.st_mode):
        _READ.add((st.st_dev, st.st_ino, st.st_mtime_ns))


def was_read(st: os.stat_result) -> bool:
    return (st.st_dev, st.st_ino, st.st_mtime_ns) in _READ


def regular_file(path, what: str) -> os.stat_result:
    """The status of ``path`` if it is a regular file (symlinks followed); else an FdslError. The
    file is remembered as an input, which no output may replace. The path passes the gate first."""
    admit(path, what)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FdslError("cannot read this %s: no such file" % what, file=str(path)) from None
    except OSError as e:
        raise FdslError("cannot read this %s: %s" % (what, e.strerror or e), file=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        raise FdslError("cannot read this %s: it is %s, not a file" % (what, kind_of(st.st_mode)), file=str(path))
    _READ.add((st.st_dev, st.st_ino, st.st_mtime_ns))
    return st


def read_source(path, what: str = "file") -> str:
    """The text of a program or rule file: a regular file, at most MAX_SOURCE_BYTES, UTF-8 text.
    Never a file of /proc, /sys or /dev (``/proc/self/environ`` is a regular file holding every
    environment variable: its "syntax error" would print them), nor a binary file (a NUL byte):
    both are refused without a word of their contents."""
    path = Path(path)
    st = regular_file(path, what)
    top = pseudo(str(path))
    if top:
        raise FdslError("cannot read this %s: it is a file of the system (%s), not a program or rule file; "
                        "its contents are not shown" % (what, top), file=str(path))
    if st.st_size > MAX_SOURCE_BYTES:
        raise FdslError("this %s is %s, more than the %s a program or rule file may have"
                        % (what, size_text(st.st_size), size_text(MAX_SOURCE_BYTES)), file=str(path))
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except OSError as e:
        raise FdslError("cannot read this %s: %s" % (what, e.strerror or e), file=str(path)) from None
    try:
        text = data.decode("utf-8-sig")  # -sig: a byte-order mark at the start is dropped
    except UnicodeDecodeError as e:
        raise FdslError("this %s is not UTF-8 text (byte %d)" % (what, e.start), file=str(path)) from None
    if "\0" in text:
        raise FdslError("this %s is binary, not text (a NUL byte at byte %d); its contents are not shown"
                        % (what, data.index(b"\0")), file=str(path))
    return text


def memory_budget() -> int:
    """Bytes an allocation may take now: half of the memory left."""
    return memory_left() // 2  # an operation holds its operands and its result at once


def memory_left() -> int:
    """Bytes this process may still take: what the system has available, within what is left of
    the process's address-space limit (``ulimit -v``: the limit less what the process maps)."""
    budget = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    budget = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if budget is None:
        try:
            budget = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            budget = 1 << 34
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        budget = min(budget, soft - _mapped())
    return max(budget, 0)


def _mapped() -> int:
    """Bytes of address space this process maps now (what RLIMIT_AS limits); 0 if unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_allocation(nbytes: int, what: str) -> None:
    """An FdslError if ``nbytes`` more would not fit the memory budget."""
    if nbytes > (1 << 26):  # below 64 MB nothing is worth the look at /proc
        budget = memory_budget()
        if nbytes > budget:
            raise FdslError("%s would take %s, more than the memory available (%s)"
                            % (what, size_text(nbytes), size_text(budget)))


def size_text(n: int) -> str:
    """``1.5 GB``, ``12.0 MB``, ``300 bytes``: a number of bytes for a message."""
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d bytes" % n
