"""The package as a user gets it: build the wheel, install it into a fresh virtual environment,
and run ``fdsl run`` on an example from another directory.

The wheel must carry ``grammar/`` and ``stdlib/`` (mapped to ``fdsl.grammar`` and ``fdsl.stdlib``):
a checkout finds them beside the package, an installed package only inside itself, so this is
the test that notices when they are left out. The virtual environment is plain (no system site
packages, no PYTHONPATH), so nothing from this checkout or this interpreter can stand in for a
missing file. The test is skipped only when no virtual environment can be made at all, and says so.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# what the wheel is built from: the checkout without its tests, caches and build products
_NOT_SOURCES = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist", ".hypothesis",
                                      ".pytest_cache", ".venv", "venv", "tests", "bench", "examples", "*.pyc")


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=600, **kw)


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _pip_can_target_another_python() -> bool:
    # pip >= 22.3 installs into another interpreter with --python, which spares the new
    # environment its own copy of pip (ensurepip is the slowest part of making one). Its version
    # read from its metadata, not by importing pip: setuptools' distutils shim hooks that import
    # and warns when distutils is already loaded (torch.compile's inductor loads it)
    from importlib.metadata import version

    return tuple(int(x) for x in version("pip").split(".")[:2]) >= (22, 3)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source") / "fdsl"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCES)
    out = tmp_path_factory.mktemp("dist")
    # with setuptools and wheel at hand, build with them rather than fetching them for an isolated build
    local = importlib.util.find_spec("setuptools") is not None and importlib.util.find_spec("wheel") is not None
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *(["--no-build-isolation"] if local else []),
                 "-w", out, source])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("fdsl-*.whl")
    return built


def test_wheel_carries_grammar_and_stdlib(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    grammars = sorted(p.name for p in (REPO / "grammar").glob("*.lark"))
    assert "fdsl.lark" in grammars
    for name in grammars:
        assert "fdsl/grammar/" + name in names, "grammar/%s is not in the wheel" % name
        # the parser's tables, made ahead of time as JSON (issue 23: no pickle cache)
        tables = name.replace(".lark", ".tables.json")
        assert "fdsl/grammar/" + tables in names, "grammar/%s is not in the wheel" % tables
    for name in sorted(p.name for p in (REPO / "stdlib").glob("*.rules")):
        assert "fdsl/stdlib/" + name in names, "stdlib/%s is not in the wheel" % name
    assert ("fdsl/cli/main.py" in names and "fdsl/core/terms.py" in names
            and any(n.endswith("entry_points.txt") for n in names))


def test_wheel_carries_the_console_page_and_katex(wheel):
    """fdsl serve's page, its script, and KaTeX with its fonts and licence, as installed files."""
    names = set(zipfile.ZipFile(wheel).namelist())
    static = REPO / "fdsl" / "serve" / "static"
    files = [p.relative_to(REPO).as_posix() for p in static.rglob("*") if p.is_file()]
    assert "fdsl/serve/static/katex/LICENSE" in files and len(files) > 20
    missing = [f for f in files if f not in names]
    assert not missing, missing


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh virtual environment with the wheel installed; its bin/ folder."""
    root = tmp_path_factory.mktemp("venv") / "env"
    lean = _pip_can_target_another_python()
    made = _run([sys.executable, "-m", "venv", *(["--without-pip"] if lean else []), root])
    if made.returncode != 0:
        pytest.skip("cannot create a virtual environment here: %s" % (made.stderr.strip() or made.stdout.strip()))
    bindir = root / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    install = [sys.executable, "-m", "pip", "--python", python] if lean else [python, "-m", "pip"]
    proc = _run([*install, "install", "--quiet", "--disable-pip-version-check", wheel], env=_clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return bindir


def test_installed_package_is_the_wheel(venv, tmp_path):
    proc = _run([venv / "python", "-c", "import fdsl, fdsl.base.resources as r; print(fdsl.__file__); "
                 "print(r.grammar_path('fdsl.lark')); print(r.stdlib_dir())"], cwd=tmp_path, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.splitlines():
        assert Path(line).resolve().is_relative_to(venv.parent.resolve()), line
        assert not Path(line).resolve().is_relative_to(REPO), line


def test_fdsl_run_from_another_directory(venv, tmp_path, run_fdsl):
    example = (REPO / "examples" / "encoder2.fd").resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _run([venv / "fdsl", "run", example], cwd=elsewhere, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    # the form (with the binding of E, at its first show), then its summands
    assert proc.stdout.startswith("-trace(E^t dE)\nwhere\n  encoder_1 = ") and "\n55\n" in proc.stdout
    assert proc.stdout == run_fdsl("run", example).stdout  # installed as in the checkout


def test_installed_stdlib_rules_work(venv, tmp_path, run_fdsl):
    """A program that needs the standard rule library gives the same output installed as in the checkout."""
    program = tmp_path / "rules.fd"
    program.write_text("dim n\nconst X : n x n, Y : n x n\nweight W : n x n\nE = Y - X W\n"
                       "show expandAll(form(E))\n")
    installed = _run([venv / "fdsl", "run", program], cwd=tmp_path, env=_clean_env())
    checkout = run_fdsl("run", program, cwd=tmp_path)
    assert installed.returncode == checkout.returncode == 0, installed.stderr + checkout.stderr
    assert installed.stdout == checkout.stdout and installed.stdout.strip()
