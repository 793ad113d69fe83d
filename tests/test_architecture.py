"""The house is wired one way: every module of fdsl/ imports only its own folder (without loops)
or the floors below it, and nothing below the command line imports it.

The imports are read from the source with ``ast``: module-level and deferred ones (inside a
function), ``importlib.import_module("fdsl...")`` strings included. Two exceptions, both named
here: the printing hooks of core objects (``__str__``, ``__repr__``, ``_repr_latex_``,
``_repr_html_``, ``_repr_svg_``) may import their own folder's printers lazily, as SymPy's
printing hooks do, closing a loop that a module-level import would make (never a floor up: the
pictures a term or a program shows of itself come down through ``fdsl.base.assembly``); and a
deferred import may go down anywhere (that is simply downward).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fdsl"

# bottom up; folders on one floor are siblings and may not import each other
FLOORS = [
    ("base",),
    ("core",),
    ("rewrite", "calculus"),
    ("lang",),
    ("numbers", "pictures"),  # the values of terms; their pictures
    ("codegen",),  # generated code: the IR, lowering, passes, writers, runtimes
    ("learn",),
    ("verify",),
    ("cli", "repl", "serve", "api", "compose", "__init__", "__main__"),  # the faces and the composition root
]
FLOOR_OF = {folder: i for i, names in enumerate(FLOORS) for folder in names}
# the printing hooks: they may close a loop inside their own folder (Term.__str__ and the printers)
HOOKS = {"__str__", "__repr__", "_repr_latex_", "_repr_html_", "_repr_svg_", "_repr_mimebundle_"}
# the faces may import one another only as written here (the CLI's repl command starts the repl, its
# serve command the server; the server's sessions are the repl's, and import the composition root)
# (fdsl/__init__.py hands the composition root to fdsl.base.assembly; the CLI prints its version)
FACES = {("cli", "repl"), ("cli", "api"), ("repl", "api"), ("__main__", "cli"), ("__init__", "api"),
         ("__init__", "compose"), ("cli", "__init__"), ("cli", "serve"), ("serve", "repl"), ("serve", "compose")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room(module: str) -> str:
    """The folder (floor room) of a module: fdsl.core.terms -> core; fdsl.api -> api; fdsl -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def known(dotted: str) -> str:
    """The longest prefix of ``dotted`` that is a module or package of fdsl."""
    parts = dotted.split(".")
    while parts:
        rel = Path(*parts[1:]) if len(parts) > 1 else Path()
        if (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return "fdsl"


def imports_of(path: Path):
    """(line, imported module, name of the enclosing function or None) for every fdsl import."""
    module, is_package = module_name(path), path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.ImportFrom):
                target = resolve(module, is_package, child.level, child.module) if child.level else child.module
                if target and target.split(".")[0] == "fdsl":
                    for alias in child.names:
                        found.append((child.lineno, known(target + "." + alias.name), function))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.split(".")[0] == "fdsl":
                        found.append((child.lineno, known(alias.name), function))
            elif (isinstance(child, ast.Call) and getattr(child.func, "attr", getattr(child.func, "id", None))
                  in ("import_module", "__import__") and child.args and isinstance(child.args[0], ast.Constant)
                  and str(child.args[0].value).startswith("fdsl")):
                found.append((child.lineno, known(child.args[0].value), function))
            visit(child, inner)

    visit(tree, None)
    return [(line, target, fn) for line, target, fn in found if target != module]


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def violations(paths=None):
    """Every import that runs up a floor, across siblings, or into the CLI from outside it."""
    out, graph = [], nx.DiGraph()
    for path in paths or modules():
        module = module_name(path)
        here = room(module)
        for line, target, function in imports_of(path):
            there = room(target)
            where = "%s:%d" % (path.relative_to(PACKAGE.parent), line)
            if function in HOOKS and here == there:
                continue
            if there == "cli" and here != "cli" and (here, there) not in FACES:
                out.append("%s: %s imports the command line (%s)" % (where, module, target))
            elif here == there:
                graph.add_edge(module, target, where=where)
            elif FLOOR_OF[there] > FLOOR_OF[here]:
                out.append("%s: %s (floor %s) imports %s, a floor up (%s)" % (where, module, here, target, there))
            elif FLOOR_OF[there] == FLOOR_OF[here] and (here, there) not in FACES:
                out.append("%s: %s imports its sibling %s (%s and %s stand side by side)"
                           % (where, module, target, here, there))
    for cycle in nx.simple_cycles(graph):
        edges = [graph.edges[a, b]["where"] for a, b in zip(cycle, cycle[1:] + cycle[:1])]
        out.append("a loop: %s (%s)" % (" -> ".join(cycle + cycle[:1]), ", ".join(edges)))
    return out


def test_every_folder_has_a_floor():
    folders = {room(module_name(p)) for p in modules()}
    assert folders <= set(FLOOR_OF), sorted(folders - set(FLOOR_OF))


def test_imports_go_only_down():
    found = violations()
    assert not found, "\n".join(found)


@pytest.mark.parametrize("victim, line, expected", [
    ("calculus/backprop.py", "from ..learn.train import Trainer", "a floor up"),
    ("codegen/generated.py", "from ..cli.common import set_limits", "imports the command line"),
    ("rewrite/engine.py", "from ..calculus.forms import order", "sibling"),
    ("core/terms.py", "import fdsl.lang.program", "a floor up"),
    ("lang/program.py", "importlib.import_module('fdsl.numbers.values')", "a floor up"),
])
def test_a_planted_import_fails(monkeypatch, victim, line, expected):
    """The test can fail: one wrong import planted (deferred, in a function) in a module is named
    with its file and line."""
    _assert_planted_import_fails(monkeypatch, victim, "planted", line, expected)


@pytest.mark.parametrize("hook", ["__str__", "_repr_svg_", "diagram"])
def test_a_hook_that_imports_a_floor_up_fails(monkeypatch, hook):
    """The printing hooks may import their own folder lazily, not a floor above: a term's
    pictures come down through fdsl.base.assembly."""
    _assert_planted_import_fails(monkeypatch, "core/terms.py", hook, "from ..pictures import graphviz", "a floor up")


def _assert_planted_import_fails(monkeypatch, victim, function, line, expected):
    path = PACKAGE / victim
    text = path.read_text() + "\n\ndef %s():\n    import importlib\n\n    %s\n" % (function, line)
    monkeypatch.setattr(Path, "read_text", lambda self, *a, _orig=Path.read_text, **k:
                        text if self == path else _orig(self, *a, **k))
    where = "fdsl/%s:%d" % (victim, text.count("\n"))
    found = violations([path])
    assert any(v.startswith(where) and expected in v for v in found), found


def test_a_planted_loop_fails(monkeypatch):
    """A loop inside one folder is named with both ends."""
    terms, ops = PACKAGE / "core" / "terms.py", PACKAGE / "core" / "ops.py"
    planted = ops.read_text() + "\nfrom .terms import Term\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, _orig=Path.read_text, **k:
                        planted if self == ops else _orig(self, *a, **k))
    found = violations([terms, ops])
    assert any(v.startswith("a loop") and "fdsl.core.ops" in v for v in found), found


def test_the_command_line_names_the_backends_targets():
    """fdsl codegen's --target and --dtype choices are written out in the CLI (no numpy to build the
    parser); they must be the backends' own."""
    from fdsl.cli import codegen
    from fdsl.codegen import targets

    assert codegen.TARGETS == tuple(sorted(targets.TARGETS)) and codegen.DTYPES == targets.DTYPES


def test_only_the_composition_root_loads_modules_by_name():
    named = [(path, line) for path in modules() for line, _, _ in _named_imports(path)
             if module_name(path) != "fdsl.compose"]
    assert not named, named


def _named_imports(path):
    tree = ast.parse(path.read_text())
    return [(node.lineno, node.args[0].value, None) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("fdsl")]
