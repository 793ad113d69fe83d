"""The grammar cache (issue 13): Lark's tables are a pickle, so they are kept only in a folder of
the user's own, checked before every use; never in the shared temp folder."""

from __future__ import annotations

import importlib
import os

import pytest

parse = importlib.import_module("fdsl.lang.parse")  # the module; fdsl.parse is also a function


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("FDSL_NO_CACHE", raising=False)
    return tmp_path


def test_the_cache_is_a_private_folder_of_the_user(cache_home):
    file = parse._cache_file("fdsl.lark", "start", "grammar text")
    folder = cache_home / "fdsl"
    assert file and os.path.dirname(file) == str(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert not file.startswith("/tmp/.lark_cache")
    # the key changes with the grammar: an edited grammar never loads old tables
    assert parse._cache_file("fdsl.lark", "start", "other text") != file


def test_a_folder_others_can_write_is_not_used(cache_home):
    parse._cache_file("fdsl.lark", "start", "g")
    (cache_home / "fdsl").chmod(0o777)
    assert parse._cache_file("fdsl.lark", "start", "g") is False


def test_a_planted_link_or_foreign_file_is_not_loaded(cache_home, tmp_path):
    file = parse._cache_file("fdsl.lark", "start", "g")
    planted = tmp_path / "evil.pickle"
    planted.write_bytes(b"not tables")
    os.symlink(planted, file)
    assert parse._cache_file("fdsl.lark", "start", "g") is False
    os.unlink(file)
    with open(file, "wb") as f:
        f.write(b"x")
    os.chmod(file, 0o666)  # writable by others: someone could have swapped its contents
    assert parse._cache_file("fdsl.lark", "start", "g") is False
    if os.geteuid() == 0:
        os.chmod(file, 0o644)
        os.chown(file, 65534, 65534)  # owned by someone else
        assert parse._cache_file("fdsl.lark", "start", "g") is False


def test_a_folder_that_is_a_link_is_not_used(cache_home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.symlink(elsewhere, cache_home / "fdsl")
    assert parse._cache_file("fdsl.lark", "start", "g") is False


def test_no_cache_on_request(cache_home, monkeypatch):
    monkeypatch.setenv("FDSL_NO_CACHE", "1")
    assert parse._cache_file("fdsl.lark", "start", "g") is False
