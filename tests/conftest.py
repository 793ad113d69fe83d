"""Shared test helpers: where the repository is, and running the ``fdsl`` command as a user would.

``run_fdsl(*args, cwd=...)`` runs ``python -m fdsl.cli ARGS`` in a subprocess with no stdin, so
the tests see exactly what a user sees: the exit code, stdout and stderr (a traceback there is a
bug). The package is taken from this checkout even when it is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# every lowering in the tests (in this process and in the fdsl commands they run) checks its
# statement IR after every pass (fdsl.codegen.ir.check)
os.environ["FDSL_CHECK_IR"] = "1"

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def _cpu_cap(seconds: int):
    def cap():
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds))
    return cap


def _run_fdsl(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    """``timeout``: the command's budget, as CPU time (RLIMIT_CPU, twice it: numpy's threads add
    up), which a machine busy with other work does not use up; the wall clock waits much longer,
    only against a command that hangs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("PYTHONIOENCODING", "utf-8")
    return subprocess.run([sys.executable, "-m", "fdsl.cli", *map(str, args)], cwd=cwd or REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          preexec_fn=_cpu_cap(int(2 * timeout)), timeout=max(600, 4 * timeout))


@pytest.fixture
def run_fdsl():
    """``run_fdsl(*args, cwd=None)``: the CompletedProcess of ``fdsl ARGS`` run in a subprocess."""
    return _run_fdsl


@pytest.fixture(scope="session")
def run_fdsl_session():
    """The same as ``run_fdsl``, for session- or module-scoped fixtures."""
    return _run_fdsl


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def examples() -> Path:
    return EXAMPLES
