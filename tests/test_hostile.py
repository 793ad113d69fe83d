"""The hostile corpus (issue 13): inputs written as an attacker would, through the command line.

Each case is a folder of files and a command. It runs ``python -m fdsl.cli`` in a subprocess under
a CPU-time and address-space cap (``resource.setrlimit`` in ``preexec_fn``) and must end with the
expected exit code (2 with a one-line ``file:line:col: message`` on stderr, or 0 where the input is
legal), never a traceback, within the cap, changing nothing outside its folder and leaving no
partial output in it. The cases run in parallel from one fixture (the machine has two cores) and
each is then checked by its own test.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CPU_SECONDS = 60
MEMORY_BYTES = 2 << 30
DEEP = 50_000

HEAD = "dim n = 2\nconst X : n x n\nweight W : n x n\n"


def nested(open_, close, inner="X", n=DEEP):
    return open_ * n + inner + close * n


def _npz(**arrays):
    def make(path):
        np.savez(path, **arrays)
    return make


def _bomb(path):
    """An .npz whose one array's header claims 100000 x 100000 floats (80 GB), with no data."""
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": (100000, 100000)})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("X.npy", b"\x93NUMPY\x01\x00" + buf.getvalue()[8:])


@dataclass
class Case:
    name: str
    files: dict  # name -> text, bytes, or a function(path) that writes it
    argv: list
    code: int = 2
    message: str = ""  # a regex the first line of stderr must match (search)
    stdout: str = ""  # a regex stdout must match (search), for legal inputs
    absent: tuple = ()  # files that must not exist afterwards (outputs of a failed command)
    check: object = None  # check(folder) -> None, more assertions
    usage: bool = False  # an argparse refusal: usage lines, then the message on the last line
    progress: bool = False  # the command reports progress on stdout before it stops
    links: dict = field(default_factory=dict)  # name -> target, symlinks made before the run


# Symbols named as the generated module's own globals (INPUTS, DTYPE), its functions (grads) and
# builtins (sum): each must not hide the global of that name from the function that reads it.
CODEGEN_NAMES = ("dim n = 3, k = 2\nconst values : n x k, Y : n x k\nweight INPUTS, grads, DTYPE, sum : k x k\n"
                 "w = form(Y - values INPUTS grads DTYPE sum)\n")


def _check_codegen_names(path):
    """Run the generated module; the gradient of INPUTS against numpy: for E = Y - V A B C D,
    -dL/dA = V^t E (B C D)^t, L = 1/2 ||E||^2."""
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    rng = np.random.default_rng(0)
    v = {"values": rng.standard_normal((3, 2)), "Y": rng.standard_normal((3, 2))}
    v.update({name: rng.standard_normal((2, 2)) for name in ("INPUTS", "grads", "DTYPE", "sum")})
    e = v["Y"] - v["values"] @ v["INPUTS"] @ v["grads"] @ v["DTYPE"] @ v["sum"]
    want = v["values"].T @ e @ (v["grads"] @ v["DTYPE"] @ v["sum"]).T
    got = namespace["grads"](v)
    assert set(got) == {"INPUTS", "grads", "DTYPE", "sum"}
    assert np.allclose(got["INPUTS"], want, rtol=1e-12, atol=1e-12)


PWNED = 'operator f(A) numpy "__import__(\\"os\\").system(\\"touch PWNED\\")"\n'
TEMPLATE = 'operator f(A) numpy "np.tanh({0})"\n'

CASES = [
    # ---- 1. rule files are data: no Python from them, ever -------------------------------------
    Case("template-run", {"p.fd": 'rules "t.rules"\n' + HEAD + "show f(X)\n", "t.rules": TEMPLATE},
         ["run", "p.fd"], message=r"^t\.rules:1:15: numpy \"TEMPLATE\" is Python text.*write numpy tanh$",
         absent=("PWNED",)),
    Case("template-code-run", {"p.fd": 'rules "t.rules"\n' + HEAD, "t.rules": PWNED},
         ["run", "p.fd"], message=r"^t\.rules:1:", absent=("PWNED",)),
    Case("template-rules-check", {"t.rules": TEMPLATE}, ["rules", "--check", "t.rules"],
         message=r"^t\.rules:1:15: numpy \"TEMPLATE\"", absent=("PWNED",)),
    Case("template-codegen", {"p.fd": HEAD + "w = form(W)\n", "t.rules": TEMPLATE},
         ["codegen", "p.fd", "--form", "w", "--rules", "t.rules", "-o", "g.py"],
         message=r"^t\.rules:1:15: ", absent=("g.py",)),
    Case("operator-unknown-numpy-function", {"p.fd": 'rules "t.rules"\n', "t.rules": "operator f(A) numpy system\n"},
         ["run", "p.fd"], message=r"^t\.rules:1:15: no numpy function 'system' in fdsl's table"),
    Case("operator-value-uses-a-name", {"p.fd": 'rules "t.rules"\n', "t.rules": "operator f(A) = A + os\n"},
         ["run", "p.fd"], message=r"^t\.rules:1:21: 'os' in the value of an operator"),
    Case("operator-value-is-legal", {"p.fd": 'rules "t.rules"\n' + HEAD + "random 0\nshow eval(f(X) - 2 X)\n",
                                     "t.rules": "operator f(A) = A + A\n"},
         ["run", "p.fd"], code=0, stdout=r"\[\[0\. 0\.\]\n \[0\. 0\.\]\]"),
    Case("latex-injection", {"p.fd": 'rules "t.rules"\n' + HEAD + "show latex(f(X))\n",
                             "t.rules": 'operator f(A) latex "}\\input{/etc/passwd}{" = A\n'},
         ["run", "p.fd"], code=0,
         stdout=r"^\\operatorname\{\\\}\\textbackslash\{\}input\\\{/etc/passwd\\\}\\\{\}\\left"),
    Case("import-cycle", {"p.fd": 'rules "a.rules"\n', "a.rules": 'import "b"\n', "b.rules": 'import "a"\n'},
         ["run", "p.fd"], message=r"^b\.rules:1:1: import cycle: a\.rules imports b\.rules imports a"),
    # ---- 3. outputs -----------------------------------------------------------------------------
    Case("save-to-device", {"p.fd": HEAD + 'random 0\nsave "/dev/null" X\n'}, ["run", "p.fd"],
         message=r"^p\.fd:5:1: cannot write this file: it is a device"),
    Case("save-to-folder", {"p.fd": HEAD + 'random 0\nsave "sub" X\n', "sub/keep": ""}, ["run", "p.fd"],
         message=r"^p\.fd:5:1: cannot write this file: it is a folder"),
    Case("save-then-fail", {"p.fd": HEAD + 'random 0\nsave "g.npz" X\nshow Y\n'}, ["run", "p.fd"],
         message=r"^p\.fd:6:6: unknown name 'Y'", absent=("g.npz",)),
    Case("save-through-link", {"p.fd": HEAD + 'random 0\nsave "link.npz" X\n', "target.npz": "old"},
         ["run", "p.fd"], code=0, links={"link.npz": "target.npz"},
         check=lambda d: (os.path.islink(d / "link.npz") and np.load(d / "target.npz")["X"].shape == (2, 2))
         or pytest.fail("the link was replaced or its target not written")),
    Case("grad-out-empty", {"p.fd": HEAD + "w = form(W)\n"}, ["grad", "p.fd", "--form", "w", "--random", "0",
                                                              "--out", ""],
         message=r"an output file needs a name"),
    Case("codegen-backslash-path", {"a\\x41 dir/p.fd": HEAD + "w = form(W)\n"},
         ["codegen", "a\\x41 dir/p.fd", "--form", "w", "-o", "g.py"], code=0,
         check=lambda d: compile((d / "g.py").read_text(), "g.py", "exec")
         and "a\\\\x41 dir" in (d / "g.py").read_text()),
    # ---- 4. exhaustion --------------------------------------------------------------------------
    Case("growing-rule", {"p.fd": 'rules "g.rules"\n' + HEAD + "show grow(m(X))\n",
                          "g.rules": "ruleset grow\nrule g: m(?A) => m(?A + ?A)\n"},
         ["run", "p.fd"],
         message=r"^p\.fd:5:6: grow: one step of rule g \(g\.rules:2\) built \d+ term cells.*--size-limit"),
    Case("growing-rule-size-limit", {"p.fd": 'rules "g.rules"\n' + HEAD + "show grow(m(X))\n",
                                     "g.rules": "ruleset grow\nrule g: m(?A) => m(?A + X^t)\n"
                                     .replace("X^t", "?A^t")},
         ["run", "--size-limit", "100000", "p.fd"],
         message=r"^p\.fd:5:6: grow built more than 100000 term cells in \d+ steps \(the size limit, --size-limit N\)"),
    Case("looping-rule-step-limit", {"p.fd": 'rules "g.rules"\n' + HEAD + "show spin(m(X))\n",
                                     "g.rules": "ruleset spin\nrule a: m(?A) => m(?A^t)\n"},
         ["run", "--step-limit", "1000", "p.fd"], message=r"^p\.fd:5:6: spin (loops|did not reach)"),
    Case("step-limit-zero", {"p.fd": HEAD}, ["run", "--step-limit", "0", "p.fd"],
         message=r"argument --step-limit: must be at least 1, not 0", usage=True),
    Case("step-limit-negative", {"p.fd": HEAD}, ["run", "--step-limit", "-1", "p.fd"],
         message=r"argument --step-limit: must be at least 1, not -1", usage=True),
    Case("power-tower", {"p.fd": HEAD + "show 10^(10^10)\n"}, ["run", "p.fd"],
         message=r"^p\.fd:4:6: out of range: 10 to the power 10000000000"),
    Case("power-7-3-17", {"p.fd": HEAD + "show 7^(3^17)\n"}, ["run", "p.fd"], message=r"^p\.fd:4:6: out of range"),
    Case("power-2-1e8", {"p.fd": HEAD + "show 2^100000000 X\n"}, ["run", "p.fd"], message=r"^p\.fd:4:6: out of range"),
    Case("literal-1e400", {"p.fd": HEAD + "show 1.0e400 X\n"}, ["run", "p.fd"],
         message=r"^p\.fd:4:6: the number 1\.0e400 is out of range"),
    Case("literal-many-digits", {"p.fd": HEAD + "show %s\n" % ("9" * 5000)}, ["run", "p.fd"],
         message=r"^p\.fd:4:6: the number 9+\.\.\. \(5000 digits\) is out of range"),
    Case("literal-1e308", {"p.fd": HEAD + "show 1e308 / 1e307\n"}, ["run", "p.fd"], code=0, stdout=r"^10$"),
    Case("huge-dim", {"p.fd": "dim n = 1000000000, k = 3\nconst X : n x k\nrandom 0\nshow eval(X)\n"},
         ["run", "p.fd"],
         message=r"^p\.fd:4:6: the value of X, 1000000000 x 3 floats, would take .* more than the memory"),
    Case("dim-too-many-digits", {"p.fd": "dim n = %s\n" % ("9" * 30)}, ["run", "p.fd"],
         message=r"^p\.fd:1:9: 9+\.\.\. is too large for a size or an index"),
    Case("values-dev-zero", {"p.fd": HEAD + 'values "/dev/zero"\n'}, ["run", "p.fd"],
         message=r"^p\.fd:4:1: cannot read this values file: it is a device"),
    Case("values-bomb", {"p.fd": HEAD + 'values "b.npz"\n', "b.npz": _bomb}, ["run", "p.fd"],
         message=r"^p\.fd:4:1: the arrays of this values file would take 74\.5 GB"),
    Case("values-object-array", {"p.fd": HEAD + 'values "o.npz"\n',
                                 "o.npz": lambda p: np.savez(p, X=np.array([{"a": 1}], dtype=object))},
         ["run", "p.fd"], message=r"^p\.fd:4:1: X in this values file must hold real numbers"),
    Case("values-nan", {"p.fd": HEAD + 'values "v.npz"\nshow eval(X)\n', "v.npz": _npz(X=np.full((2, 2), np.nan))},
         ["run", "p.fd"], message=r"^p\.fd:4:1: the value of X in .*v\.npz is not finite: nan at \[0, 0\]"),
    Case("program-dev-zero", {}, ["run", "/dev/zero"], message=r"^/dev/zero: cannot read this file: it is a device"),
    Case("rules-dev-zero", {"p.fd": 'rules "/dev/zero"\n'}, ["run", "p.fd"],
         message=r"^p\.fd:1:1: cannot read this rule file: it is a device"),
    Case("deep-relu", {"p.fd": HEAD + "x = %s\nshow nodes(x)\n" % nested("m(", ")")}, ["run", "p.fd"],
         code=0, stdout=r"^%d$" % (DEEP + 1)),
    Case("deep-negation", {"p.fd": HEAD + "x = %s\nshow nodes(x)\n" % nested("-(", ")")}, ["run", "p.fd"],
         code=0, stdout=r"^1$"),
    Case("deep-transpose", {"p.fd": HEAD + "x = %s\nshow nodes(x)\n" % nested("(", ")^t")}, ["run", "p.fd"],
         code=0, stdout=r"^%d$" % (DEEP + 1)),
    Case("deep-parentheses", {"p.fd": HEAD + "x = %s\nshow x\n" % nested("(", ")")}, ["run", "p.fd"],
         code=0, stdout=r"^X$"),
    Case("deep-derivative", {"p.fd": HEAD + "random 0\nx = %s\nshow nodes(expandAll(d(x)))\nshow eval(x)\n"
                             % nested("m(", ")", "W", 20_000)}, ["run", "p.fd"], code=0, stdout=r"^40001\n"),
    Case("deep-printing", {"p.fd": HEAD + "x = %s\nshow x\nshow string(x)\nshow latex(x)\n"
                           % nested("a(", ")", "X", 50_000)},
         ["run", "p.fd"], code=0, stdout=r"^a\(a\(a\("),
    Case("deep-rule", {"p.fd": 'rules "r.rules"\n',
                       "r.rules": "ruleset r\nrule x: %s => ?A\n" % nested("m(", ")", "?A")},
         ["run", "p.fd"], message=r"^r\.rules:2:9: rule x nests more than 1000 levels deep"),
    Case("deep-operator-value", {"p.fd": 'rules "r.rules"\n',
                                 "r.rules": "operator f(A) = %s\n" % nested("m(", ")", "A")},
         ["run", "p.fd"], message=r"^r\.rules:1:17: the value of operator f nests more than 1000 levels deep"),
    Case("deep-sum-of-many", {"p.fd": HEAD + "x = %s\nshow nodes(x)\n" % " + ".join(["X"] * 100_000)},
         ["run", "p.fd"], code=0, stdout=r"^2$"),  # 100000 X: the number and X
    # ---- 5. numbers and text --------------------------------------------------------------------
    Case("overflow-in-eval", {"p.fd": HEAD + "scalar s = 1e300\nrandom 0\nshow eval(s s X)\n"}, ["run", "p.fd"],
         message=r"^p\.fd:6:6: s s X is not finite \(-?inf at \[\d, \d\]\) though its operands are"),
    Case("training-diverges", {}, ["train", str(EXAMPLES / "train.fd"), "--form", "w", "--steps", "20",
                                   "--lr", "1e6", "--random", "0"],
         message=r"train\.fd: training stopped at step \d+: .* (is not finite|diverges).*lower the learning rate",
         progress=True),
    Case("byte-order-mark", {"p.fd": b"\xef\xbb\xbf" + HEAD.encode() + b"show X^t\n"}, ["run", "p.fd"], code=0,
         stdout=r"^X\^t$"),
    Case("not-utf8", {"p.fd": b"dim n\n\xff\xfe\n"}, ["run", "p.fd"],
         message=r"^p\.fd: this file is not UTF-8 text \(byte 6\)$"),
    Case("nul-bytes", {"p.fd": "dim n\x00 = 2\n"}, ["run", "p.fd"], message=r"^p\.fd:1:6: unexpected character"),
    Case("long-string-in-message", {"p.fd": HEAD + 'show m("%s")\n' % ("x" * 100_000)}, ["run", "p.fd"],
         message=r"^p\.fd:4:6: .*the string 'x+\.\.\. \(100002 characters\)$"),
    Case("program-is-folder", {"p.fd/keep": ""}, ["run", "p.fd"],
         message=r"^p\.fd: cannot read this file: it is a folder"),
    # ---- more, found by trying (see the commits that added them) ---------------------------------
    Case("many-definitions", {"p.fd": HEAD + "x0 = X\n" + "".join("x%d = m(x%d)\n" % (i + 1, i) for i in range(50_000))
                              + "show nodes(x50000)\n"}, ["run", "p.fd"], code=0, stdout=r"^50001$"),
    Case("growing-sum-fills-memory", {"p.fd": 'rules "g.rules"\n' + HEAD + "show grow(m(X))\n",
                                      "g.rules": "ruleset grow\nrule g: m(?A) => m(-?A) + m(?A^t)\n"},
         ["run", "p.fd"], message=r"^p\.fd:5:6: (the terms built so far fill the memory|grow built more than)"),
    Case("dim-zero", {"p.fd": "dim n = 0\nconst X : n x n\nrandom 0\nshow eval(a(X))\n"}, ["run", "p.fd"],
         message=r"^p\.fd:1:9: a size is at least 1, not 0$"),
    Case("shape-zero", {"p.fd": "dim n = 2\nconst X : n x 0\n"}, ["run", "p.fd"],
         message=r"^p\.fd:2:15: a size is at least 1, not 0$"),
    Case("values-empty-array", {"p.fd": "dim n, k\nconst X : n x k\nvalues \"v.npz\"\nshow eval(a(X))\n",
                                "v.npz": _npz(X=np.zeros((2, 0)))}, ["run", "p.fd"],
         message=r"^p\.fd:3:1: the value of X in .*v\.npz is empty \(shape 2 x 0\)"),
    Case("grad-huge-random", {"p.fd": "dim n = 100000\nconst X : n x n\nweight W : n x n\nw = form(X W)\n"},
         ["grad", "p.fd", "--form", "w", "--random", "0", "--out", "g.npz"], absent=("g.npz",),
         message=r"^p\.fd: random values for (X|W), 100000 x 100000 floats, would take 74\.5 GB, more than the memory"),
    Case("train-huge-located", {"p.fd": "dim n = 100000\nconst X : n x n\nweight W : n x n\nw = form(X W)\n"},
         ["train", "p.fd", "--form", "w", "--random", "0", "--steps", "1", "--lr", "0.1"],
         message=r"^p\.fd: .*100000 x 100000 floats, would take 74\.5 GB"),
    Case("form-name-with-newline", {"p.fd": HEAD + "w = form(W)\n"},
         ["codegen", "p.fd", "--form", 'w"""\nimport os', "-o", "g.py"], absent=("g.py",),
         message=r"^--form 'w\"\"\"\\nimport os': unexpected character"),
    Case("rule-file-message-names-no-grammar-internals", {"p.fd": 'rules "r.rules"\n',
                                                          "r.rules": "ruleset z\nrule a: m(?A) => ?A "
                                                                     "if __import__(?A)\n"},
         ["run", "p.fd"], message=r"^r\.rules:2:24: unexpected character '_'; (?!.*fdsl__).*a number"),
    Case("codegen-names-of-the-module", {"p.fd": CODEGEN_NAMES}, ["codegen", "p.fd", "--form", "w", "-o", "g.py"],
         code=0, check=lambda d: _check_codegen_names(d / "g.py")),
]


def _limits():
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def _snapshot(folder: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*") if not p.is_symlink()}


def _run(case: Case, root: Path):
    folder = root / case.name
    folder.mkdir()
    for name, content in case.files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    for name, target in case.links.items():
        (folder / name).symlink_to(target)
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONIOENCODING="utf-8", XDG_CACHE_HOME=str(root / "cache"))
    before = _snapshot(root.parent / "outside")
    proc = subprocess.run([sys.executable, "-m", "fdsl.cli", *case.argv], cwd=folder, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                          preexec_fn=_limits, timeout=4 * CPU_SECONDS)
    return proc, folder, before == _snapshot(root.parent / "outside")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    outside = base / "outside"  # a neighbour folder no case may touch
    outside.mkdir()
    (outside / "precious.txt").write_text("untouched")
    root = base / "cases"
    root.mkdir()
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.name: pool.submit(_run, c, root) for c in CASES}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input(results, case):
    proc, folder, outside_untouched = results[case.name]
    err = proc.stderr
    assert "Traceback" not in err and "Error:" not in err.split(":", 1)[0], err[-2000:]
    assert proc.returncode == case.code, (proc.returncode, err[-2000:], proc.stdout[-500:])
    assert outside_untouched
    assert not any(p.name.endswith(".tmp") for p in folder.rglob("*")), "a temporary file was left behind"
    for name in case.absent:
        assert not (folder / name).exists(), "%s was written by a failing command" % name
    if case.code == 2:
        lines = err.splitlines()
        message = lines[-1] if case.usage else lines[0]
        assert re.search(case.message, message), message[:500]
        if not case.usage:
            # the message, then (when it has a line number) the source line and a caret
            assert len(lines) == 1 or (len(lines) == 3 and lines[2].strip() == "^"), err[:2000]
        if not case.progress:
            assert proc.stdout == "", "a failing program printed: %r" % proc.stdout[:200]
    else:
        assert err == "", err[-2000:]
        assert re.search(case.stdout, proc.stdout, re.M), proc.stdout[:500]
    if case.check is not None:
        case.check(folder)


def test_the_corpus_covers_every_kind_of_the_issue():
    names = {c.name for c in CASES}
    for kind in ("template-run", "import-cycle", "save-then-fail", "save-through-link", "growing-rule",
                 "power-tower", "literal-1e400", "huge-dim", "values-dev-zero", "deep-relu", "deep-negation",
                 "deep-transpose", "overflow-in-eval", "training-diverges", "byte-order-mark", "literal-1e308",
                 "latex-injection", "codegen-backslash-path", "step-limit-zero", "step-limit-negative"):
        assert kind in names
