"""Writing files safely: effects performed all or nothing.

Effect     something a command or a statement does to the world once its work is done:
           ``Print`` a text, ``Write`` a file.
all or nothing  ``perform_all`` first writes every file to a temporary file beside its target,
           then, once all of them are written, renames each over its target and prints the
           texts; a write that fails removes the temporary files and changes nothing.
target     where writing a path lands: symlinks are followed, the existing file's mode is kept,
           and only regular files (or new ones) are written; never one of the command's inputs
           (a program, rule file or values file this process has read: ``inputs.was_read``), a
           read-only file, or anything reached through ``/dev``, ``/proc`` or ``/sys`` (where
           ``/dev/stdout`` leads to whatever file the shell appends to, and would replace it).
confined   a path a program names (``save``, ``plot``, ``diagram``): relative, without ``..``, and
           inside the program's folder once links are followed (``confine``); paths on the
           command line (``--out``, ``-o``, ``--log``) are the user's own choice and are not.
temporary  ``.NAME.fdsl-PID-XXXX.tmp`` beside the target; removed when the write fails or is
           interrupted (Ctrl-C), and, should the process be killed outright, by the next write of
           the same target once that process is gone: they cannot accumulate.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import FdslError, say
from .inputs import check_name, kind_of, pseudo, was_read


@dataclass
class Print:
    text: str

    def perform(self, out, program):
        perform_all([self], out, program)


@dataclass
class Note:
    """A remark on standard error, said once the program's work is done (so a later error stays
    the first line), e.g. that training ran on data drawn at random."""

    text: str


@dataclass
class Write:
    path: Path
    write: Callable  # write(path_of_temporary_file)
    note: str = ""

    def perform(self, out, program):
        perform_all([self], out, program)


def perform_all(effects, out, program) -> None:
    """Perform effects all or nothing: every file is first written beside its target, then, once
    all of them are written, each is renamed over its target and the texts are printed. A write
    that fails removes the temporary files and changes nothing."""
    staged = []
    try:
        for effect in effects:
            if isinstance(effect, Write):
                staged.append(stage(effect.path, effect.write))
    except BaseException:
        for s in staged:
            s.discard()
        raise
    for s in staged:
        s.commit()
    for effect in effects:
        if isinstance(effect, Note):
            continue
        text = effect.text if isinstance(effect, Print) else effect.note
        if text and out is not None:
            say(text, out)  # a string the program shows cannot drive the terminal
    for effect in effects:
        if isinstance(effect, Note):
            say(effect.text, sys.stderr)


def _cannot(path, why) -> FdslError:
    return FdslError("cannot write this file: %s" % why, file=str(path) or "<output>")


def target_of(path):
    """Where writing ``path`` lands, and its status (None for a new file): symlinks are followed,
    so writing a link writes the file it points to; anything but a regular file is refused, and so
    are the command's inputs, read-only files and the pseudo file systems (see ``target``)."""
    if str(path) in ("", "."):
        raise FdslError("an output file needs a name, not an empty path", file="<output>")
    check_name(path, "write this file")  # a NUL, or a lone surrogate (a JSON request's)
    try:
        top = pseudo(str(path))
        real = Path(os.path.realpath(path))
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _cannot(path, e.strerror or e) from None
    if top:
        raise _cannot(path, "it leads into %s; fdsl writes only regular files, never through %s" % (top, top))
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _cannot(path, "it is %s; fdsl writes only regular files (or new ones)" % kind_of(st.st_mode))
    if st is not None and was_read(st):
        raise _cannot(path, "it is one of this command's inputs (a program, rule file or values file it read); "
                            "write the output under another name")
    if st is not None and not st.st_mode & 0o222:
        raise _cannot(path, "it is read-only (mode %o); make it writable first if it should be replaced"
                      % stat.S_IMODE(st.st_mode))
    if st is None:  # a new file: missing folders are made, but only under a folder
        folder = real.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise _cannot(path, "%s is not a folder" % folder)
    return real, st


def confine(folder, name: str, what: str = "a program", absolute: bool = False) -> Path:
    """The path ``name`` (as a program wrote it) names inside ``folder``; an FdslError if it is
    absolute (unless ``absolute``: the repl's typed path, which must still lead inside), climbs out
    with ``..``, or leads out through a link (a folder or the file itself)."""
    check_name(name, "write %r" % name)
    where = "%s writes only inside its own folder (%s)" % (what, Path(folder).resolve())
    if (os.path.isabs(name) and not absolute) or name.startswith("~"):
        raise FdslError("cannot write %r: %s; write a name relative to it" % (name, where))
    if ".." in Path(name).parts:
        raise FdslError("cannot write %r: '..' leads out of the folder; %s" % (name, where))
    root = os.path.realpath(folder)
    path = Path(folder) / name
    try:
        real = os.path.realpath(path)
    except OSError as e:
        raise FdslError("cannot write %r: %s" % (name, e.strerror or e)) from None
    if os.path.commonpath([root, real]) != root:
        if os.path.isabs(name) and os.path.realpath(os.path.dirname(name)) == os.path.dirname(real):
            raise FdslError("cannot write %r: it is outside the folder; %s" % (name, where))
        raise FdslError("cannot write %r: it leads out of the folder through a link (to %s); %s"
                        % (name, real, where))
    return path


_TEMPORARY = re.compile(r"\.(?P<name>.+)\.fdsl-(?P<pid>\d+)-[^.]+\.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _sweep(folder: Path, name: str) -> None:
    """Remove the temporary files a killed fdsl left beside ``name`` (their process is gone)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        m = _TEMPORARY.fullmatch(entry)
        if not m or m["name"] != name or _alive(int(m["pid"])):
            continue
        try:
            st = os.lstat(folder / entry)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(folder / entry)
        except OSError:
            pass


@dataclass
class Staged:
    """A file written completely beside its target, waiting to be renamed over it."""

    target: Path
    tmp: Path
    made: tuple = ()  # the folders made for it, outermost first: removed again if it is discarded

    def commit(self) -> None:
        os.replace(self.tmp, self.target)

    def discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        for folder in reversed(self.made):
            try:
                os.rmdir(folder)  # only if empty: another output may have been staged there
            except OSError:
                pass


def stage(path, write: Callable) -> Staged:
    """``write(tmp)`` fills a new temporary file in the target's folder, given the target's mode
    (a new file: the usual mode under the umask); errors are FdslErrors and leave nothing behind."""
    real, st = target_of(path)
    made = []
    folder = real.parent
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    made.reverse()
    try:
        for folder in made:
            os.mkdir(folder)
        _sweep(real.parent, real.name)
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=".%s.fdsl-%d-" % (real.name, os.getpid()), suffix=".tmp")
    except OSError as e:
        Staged(real, real.parent / ".none", tuple(made)).discard()
        raise _cannot(path, e.strerror or e) from None
    os.close(fd)
    staged = Staged(real, Path(tmp), tuple(made))
    try:
        write(staged.tmp)
        if st is not None:
            mode = stat.S_IMODE(st.st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)  # mkstemp makes 0600
    except OSError as e:
        staged.discard()
        raise _cannot(path, e.strerror or e) from None
    except BaseException:
        staged.discard()
        raise
    return staged


def atomic_write(path, write: Callable) -> None:
    """Write one file all at once (see ``stage``): the old file or the new one, never half."""
    stage(path, write).commit()
