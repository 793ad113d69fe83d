"""Outputs (issue 13): every file one command writes is written only if the whole command
succeeded, atomically, through symlinks, keeping the existing file's mode, and only to regular
files or new ones; anything else is a one-line message, exit 2, and nothing changed."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from fdsl.base.errors import FdslError
from fdsl.base.files import Print, Write, perform_all

PROGRAM = "dim n = 2\nconst X : n x n\nrandom 0\nsave \"%s\" X\n"


def _npz_keys(path):
    with np.load(path) as z:
        return sorted(z.files)


@pytest.fixture
def prog(tmp_path):
    def write(out, extra=""):
        p = tmp_path / "p.fd"
        p.write_text(PROGRAM % out + extra)
        return p
    return write


def test_save_writes_through_a_symlink_and_keeps_the_mode(run_fdsl, prog, tmp_path):
    target = tmp_path / "real.npz"
    target.write_text("old")
    target.chmod(0o600)
    (tmp_path / "link.npz").symlink_to("real.npz")
    r = run_fdsl("run", prog("link.npz"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "link.npz").is_symlink()  # the link is kept, the file it names is written
    assert _npz_keys(target) == ["X"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.npz", "p.fd", "real.npz"]  # no temporaries


@pytest.mark.parametrize("out, message", [
    ("/dev/null", "a program writes only inside its own folder"),  # issue 23: no absolute paths
    (".", "it is a folder"),
    ("", "it is a folder"),  # "" is the program's own folder
])
def test_save_refuses_what_is_not_a_regular_file(run_fdsl, prog, out, message):
    r = run_fdsl("run", prog(out))
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[0].startswith(str(prog(out)) + ":4:1: ")


def test_a_program_that_fails_after_save_writes_nothing(run_fdsl, prog, tmp_path):
    r = run_fdsl("run", prog("g.npz", "show Y\n"))
    assert r.returncode == 2 and "Y" in r.stderr
    assert not (tmp_path / "g.npz").exists()
    assert r.stdout == ""


@pytest.mark.parametrize("command, bad", [
    (["grad", "--form", "w", "--random", "0", "--out"], "/dev/null"),
    (["train", "--form", "w", "--steps", "2", "--lr", "0.01", "--random", "0", "--out"], "folder"),
    (["codegen", "--form", "w", "-o"], ""),
    (["diagram", "--expr", "E", "-o"], "folder"),
])
def test_cli_outputs_refuse_devices_folders_and_empty_names(run_fdsl, examples, tmp_path, command, bad):
    (tmp_path / "folder").mkdir()
    out = {"folder": str(tmp_path / "folder"), "": ""}.get(bad, bad)
    if command[0] == "diagram" and bad == "folder":
        out += ".svg"
        os.mkdir(out)
    r = run_fdsl(command[0], examples / "encoder2.fd", *command[1:], out)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["folder"]
                                                                + (["folder.svg"] if out.endswith(".svg") else []))


def test_grad_keeps_mode_and_symlink(run_fdsl, examples, tmp_path):
    target = tmp_path / "g.npz"
    target.write_text("old")
    target.chmod(0o640)
    (tmp_path / "link.npz").symlink_to(target)
    r = run_fdsl("grad", examples / "encoder2.fd", "--form", "w", "--random", "0", "--out", tmp_path / "link.npz")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "link.npz").is_symlink() and len(_npz_keys(target)) == 13  # 12 and _sign
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_effects_are_all_or_nothing(tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("old a")

    def fail(tmp):
        raise OSError(28, "No space left on device")

    printed = []

    class Out:
        def write(self, text):
            printed.append(text)

    with pytest.raises(FdslError, match="No space left on device"):
        perform_all([Write(first, lambda tmp: tmp.write_text("new a")), Print("hello"), Write(second, fail)],
                    Out(), None)
    assert first.read_text() == "old a" and not second.exists() and printed == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    perform_all([Write(first, lambda tmp: tmp.write_text("new a")), Print("hello")], Out(), None)
    assert first.read_text() == "new a" and printed == ["hello\n"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_a_message(run_fdsl, prog, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = run_fdsl("run", prog("ro/x.npz"))
        assert r.returncode == 2 and "Permission denied" in r.stderr and "Traceback" not in r.stderr
    finally:
        ro.chmod(0o755)
