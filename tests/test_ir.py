"""The statement IR (fdsl.codegen.ir): its checker catches what a broken pass would leave, the
pass driver refuses to loop, and no module of the generated code reads code back as text."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fdsl.base.errors import FdslError
from fdsl.codegen import ir
from fdsl.codegen.ir import Op, Read, Sweep, Value, check, graph_rewrite

CODEGEN = Path(__file__).resolve().parents[1] / "fdsl" / "codegen"


def _inputs():
    return Value((2, 3), hint="A"), Value((3, 4), hint="B")


def test_a_well_formed_sweep_passes_the_check():
    a, b = _inputs()
    p, q = Value((2, 4)), Value((2, 4))
    s = Sweep([Op("matmul", [p], [Read(a), Read(b)]), Op("scale", [q], [Read(p, scale=(0.5,))])])
    check(s, [a, b])
    assert s.maker[p].kind == "matmul" and s.users(p) == [s.ops[1]]


@pytest.mark.parametrize("case", ["twice", "before", "inner", "after_in_place", "stale_index"])
def test_the_checker_catches_a_broken_sweep(case):
    a, b = _inputs()
    p, q, r = Value((2, 4)), Value((2, 4)), Value((2, 4))
    if case == "twice":  # single assignment
        s = Sweep([Op("matmul", [p], [Read(a), Read(b)])])
        s.ops.append(Op("scale", [p], [Read(a, scale=(2.0,))]))
    elif case == "before":  # a read before the value is made
        s = Sweep([Op("scale", [q], [Read(p, scale=(2.0,))]), Op("matmul", [p], [Read(a), Read(b)])])
    elif case == "inner":  # the inner sizes of a product differ
        s = Sweep([Op("matmul", [p], [Read(a), Read(b, t=True)])])
    elif case == "after_in_place":  # P is added into and dies, then read
        s = Sweep([Op("matmul", [p], [Read(a), Read(b)]), Op("add_into", [q], [Read(p), Read(p)]),
                   Op("scale", [r], [Read(p, scale=(2.0,))])])
    else:  # an op removed from the list behind the indexes' back
        s = Sweep([Op("matmul", [p], [Read(a), Read(b)])])
        s.ops.clear()
    with pytest.raises(FdslError):
        check(s, [a, b])


def test_rewrites_keep_the_indexes():
    a, b = _inputs()
    p, q = Value((2, 4)), Value((2, 4))
    first = Op("matmul", [p], [Read(a), Read(b)])
    second = Op("scale", [q], [Read(p, scale=(0.5,))])
    s = Sweep([first, second])
    merged = Op("matmul", [q], [Read(a, scale=(0.5,)), Read(b)])
    s.rewrite({first: [], second: [merged]})
    check(s, [a, b])
    assert s.ops == [merged] and p not in s.maker and s.users(a) == [merged] and not s.users(p)


def test_the_driver_refuses_to_loop():
    a, b = _inputs()
    p = Value((2, 4))
    s = Sweep([Op("matmul", [p], [Read(a), Read(b)])])

    def flip(sweep, op, pos, ctx):  # rewrites the product into itself forever
        return {op: [Op("matmul", op.outs, op.args)]}

    with pytest.raises(FdslError, match="infinite loop"):
        graph_rewrite(s, {"matmul": [flip]})


def test_every_kind_has_a_doc():
    assert all(k.doc for k in ir.KINDS.values())
    with pytest.raises(FdslError):
        Op("no such kind", [])


@pytest.mark.parametrize("module", ["lowering", "products", "fusion", "heads", "kernels", "schedule", "writer", "ir"])
def test_no_module_of_the_generated_code_reads_code_as_text(module):
    # the passes rewrite the IR; text is written by the writer and never parsed back
    tree = ast.parse((CODEGEN / (module + ".py")).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "re" not in imported, "%s imports re" % module
