"""The torch runtime's ``_keep_heap``: training on a CPU, glibc's malloc keeps the memory a step
frees for the next (no trim of the heap's top, no mmap for a step's arrays), unless
``FDSL_MALLOC=system``. Measured as a process sees it: its resident memory after it frees 200 MB
of 1 MB blocks, in a fresh process each (the setting is the process's)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SCRIPT = r"""
import sys
sys.path.insert(0, %(root)r)
from fdsl.codegen import torch_runtime as rt

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

rt._keep_heap()
blocks = [bytearray(1 << 20) for _ in range(200)]   # 200 MB, written (zeroed) as made
peak = resident()
del blocks
print(peak - resident())
"""


def _freed(env_value):
    env = dict(os.environ)
    env.pop("FDSL_MALLOC", None)
    if env_value is not None:
        env["FDSL_MALLOC"] = env_value
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", SCRIPT % {"root": root}], env=env, capture_output=True,
                         text=True, check=True, stdin=subprocess.DEVNULL)
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/statm"),
                    reason="glibc's malloc on Linux only: elsewhere _keep_heap does nothing")
def test_the_heap_is_kept_unless_malloc_is_left_as_it_is():
    kept = _freed(None)
    given_back = _freed("system")
    assert kept < 50 << 20, kept  # the freed blocks stay the process's, for the next step
    assert given_back > 150 << 20, given_back  # glibc's own thresholds: they go back to the system


def test_it_runs_once_a_process(monkeypatch):
    from fdsl.codegen import torch_runtime as rt

    monkeypatch.setattr(rt, "_HEAP", [])
    monkeypatch.setenv("FDSL_MALLOC", "system")  # (this process's malloc left alone)
    rt._keep_heap()
    rt._keep_heap()
    assert rt._HEAP == [True]
