"""The files a session wrote, offered for download: ``GET TOKEN/files/SESSION/NAME``.

Vocabulary
----------
session file  a regular file inside one session's own folder (what ``save``, ``plot`` and
              ``diagram`` wrote there): the only thing this route serves. NAME is a path relative
              to that folder, its parts each a plain name (no ``..``, no ``.``, no empty part).
opened        walked part by part from the folder with ``O_NOFOLLOW`` (a symbolic link anywhere on
              the way, even one pointing back inside, is refused: nothing the folder links to is
              served, and no link swapped in between a check and the open can lead out), the last
              part opened without blocking (a FIFO does not hang the handler) and served only if it
              is a regular file.
answer        as an attachment (``Content-Disposition``), never shown in the page: its type from its
              name (``application/octet-stream`` when unknown), with the server's usual headers
              (``nosniff``, the content security policy).
"""

from __future__ import annotations

import mimetypes
import os
import re
import stat
from typing import Optional
from urllib.parse import quote, unquote

CHUNK = 1 << 16  # bytes copied to the connection at a time: a saved array may be large
TYPES = {".npz": "application/zip", ".npy": "application/octet-stream", ".csv": "text/csv; charset=utf-8",
         ".svg": "image/svg+xml", ".png": "image/png", ".dot": "text/plain; charset=utf-8",
         ".fd": "text/plain; charset=utf-8", ".rules": "text/plain; charset=utf-8"}


def parts_of(name: str) -> Optional[list]:
    """The parts of a URL's NAME (percent-decoded), or None when it is not a plain relative path."""
    try:
        text = unquote(name, errors="strict")
    except UnicodeDecodeError:
        return None
    parts = text.split("/")
    if not text or "\0" in text or "\\" in text or any(p in ("", ".", "..") for p in parts):
        return None
    return parts


def open_file(folder: str, parts: list) -> Optional[tuple]:
    """``(file object, size)`` of the regular file ``folder/parts...``, or None (see *opened*)."""
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fds = []
    try:
        fds.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | nofollow))
        for part in parts[:-1]:
            fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fds[-1]))
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | nofollow, dir_fd=fds[-1])
    except (OSError, ValueError):
        return None
    finally:
        for d in fds:
            os.close(d)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), info.st_size


def content_type(name: str) -> str:
    suffix = os.path.splitext(name)[1].lower()
    return TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


def disposition(name: str) -> str:
    """``attachment`` with the file's name: an ASCII stand-in, and the name itself (RFC 6266)."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", name) or "download"
    return "attachment; filename=\"%s\"; filename*=UTF-8''%s" % (plain, quote(name, safe=""))
