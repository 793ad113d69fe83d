"""Writing files safely: effects performed all or nothing.

Effect     something a command or a statement does to the world once its work is done:
           ``Print`` a text, ``Write`` a file.
all or nothing  ``perform_all`` first writes every file to a temporary file beside its target,
           then, once all of them are written, renames each over its target and prints the
           texts; a write that fails removes the temporary files and changes nothing.
target     where writing a path lands: symlinks are followed, the existing file's mode is kept,
           and only regular files (or new ones) are written.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import FdslError
from .inputs import kind_of


@dataclass
class Print:
    text: str

    def perform(self, out, program):
        perform_all([self], out, program)


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
        text = effect.text if isinstance(effect, Print) else effect.note
        if text and out is not None:
            out.write(text + "\n")


def _cannot(path, why) -> FdslError:
    return FdslError("cannot write this file: %s" % why, file=str(path) or "<output>")


def target_of(path):
    """Where writing ``path`` lands, and its status (None for a new file): symlinks are followed,
    so writing a link writes the file it points to; anything but a regular file is refused."""
    if str(path) in ("", "."):
        raise FdslError("an output file needs a name, not an empty path", file="<output>")
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _cannot(path, e.strerror or e) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _cannot(path, "it is %s; fdsl writes only regular files (or new ones)" % kind_of(st.st_mode))
    if st is None:  # a new file: missing folders are made, but only under a folder
        folder = real.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise _cannot(path, "%s is not a folder" % folder)
    return real, st


@dataclass
class Staged:
    """A file written completely beside its target, waiting to be renamed over it."""

    target: Path
    tmp: Path

    def commit(self) -> None:
        os.replace(self.tmp, self.target)

    def discard(self) -> None:
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def stage(path, write: Callable) -> Staged:
    """``write(tmp)`` fills a new temporary file in the target's folder, given the target's mode
    (a new file: the usual mode under the umask); errors are FdslErrors and leave nothing behind."""
    real, st = target_of(path)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix="." + real.name + ".", suffix=".tmp")
    except OSError as e:
        raise _cannot(path, e.strerror or e) from None
    os.close(fd)
    staged = Staged(real, Path(tmp))
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
