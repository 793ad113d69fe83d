"""fdsl.codegen.cse (the ops a sweep makes twice, made once) and the transposes written out in a
product's word: two spellings of one attention, ``a(Z Q (Z K)^t)`` and ``a(Z Q K^t Z^t)``, are one
product and one softmax (each was made twice); the gradients are those of the module without the
pass (float64, 1e-12) and of the differential oracle (the interpreter, torch autograd, finite
differences); an op whose value is updated in place, or returned, is not shared."""

from __future__ import annotations

import pytest

import fdsl
from fdsl.calculus.gradients import gradient_terms, loss_of
from fdsl.codegen import lowering
from fdsl.codegen.cse import shared_ops
from fdsl.codegen.generated import compile_namespace, gradients_source
from fdsl.codegen.ir import Op, Read, Sweep, Value, check

TWICE = """
dim n = 4, d = 3, k = 2
const Z : n x d, Y : n x d
weight Q : d x k, K : d x k, V : d x d
A := a(Z Q (Z K)^t) Z V
B := a(Z Q K^t Z^t) Z V
E := Y - A - B
w = form(E)
"""


def _lowered(source, target):
    p = fdsl.parse(source)
    w = p["w"]
    low = lowering.Lowering(gradient_terms(p.normal_form(w)), p.dims, target, loss=loss_of(w))
    low.lower()
    return low


@pytest.mark.parametrize("target", ["numpy", "torch"])
def test_two_spellings_of_one_attention_are_one_product_and_one_softmax(target):
    low = _lowered(TWICE, target)
    assert len([op for op in low.sweep.ops if op.kind == "softmax"]) == 1  # (the program has no other)
    # Z Q K^t Z^t: one product of the two grouped ones (torch: a bmm of Z Q and Z K) for the scores
    scores = [op for op in low.sweep.ops if op.kind == "matmul" and low.sweep.users(op.out)
              and any(u.kind == "softmax" for u in low.sweep.users(op.out))]
    assert len(scores) == 1


def test_the_words_of_the_two_spellings_are_one():
    p = fdsl.parse(TWICE)
    low = lowering.Lowering(gradient_terms(p.normal_form(p["w"])), p.dims, "numpy", loss=loss_of(p["w"]))
    a, b = (p.expr(s) for s in ("Z Q (Z K)^t", "Z Q K^t Z^t"))
    assert [(x.op, f) for x, f in low._word(a)[2]] == [(x.op, f) for x, f in low._word(b)[2]]
    assert [f for _, f in low._word(a)[2]] == [False, False, True, True]


def test_the_gradients_are_those_without_the_pass_and_the_oracles(monkeypatch):
    from fdsl.numbers.values import program_values, random_values
    from fdsl.verify import differential

    torch = pytest.importorskip("torch")
    p = fdsl.parse(TWICE)
    random_values(p, 5)
    store = program_values(p)
    bodies = []  # the generated function's text, with the pass and without

    def grads_and_loss():
        src = gradients_source(p.normal_form(p["w"]), p.dims, "test", "torch", loss=loss_of(p["w"]))
        bodies.append(src.split("def grads_and_loss")[1])
        module = compile_namespace(src)
        return module["grads_and_loss"]({name: torch.as_tensor(store[name]) for name in module["INPUTS"]})

    g, loss = grads_and_loss()
    monkeypatch.setattr(lowering, "shared_ops", lambda sweep, kept: None)
    g_off, loss_off = grads_and_loss()
    assert [body.count("_softmax(") for body in bodies] == [1, 2]
    assert abs(float(loss) - float(loss_off)) <= 1e-12 * abs(float(loss_off))
    for name in g_off:
        assert float((g[name] - g_off[name]).abs().max()) <= 1e-12 * max(1.0, float(g_off[name].abs().max()))
    monkeypatch.undo()
    # w = form(E) is -d(L) for L = 1/2 ||E||^2
    report = differential.check(TWICE + "L = trace(E^t E) / 2\n", sign=-1, seed=3)
    assert report.ok, report.describe()


def _two_of_one(kind="template", **attrs):
    a = Value((2, 3), hint="A")
    p, q = Value((2, 3)), Value((2, 3))
    return a, p, q, Op(kind, [p], [Read(a)], **attrs), Op(kind, [q], [Read(a)], **attrs)


def test_a_same_op_is_dropped_and_its_readers_read_the_first():
    a, p, q, first, second = _two_of_one(op="exp", data=None)
    r = Value((2, 3))
    use = Op("sum", [r], [Read(p), Read(q, scale=(2.0,))], signs=(1, 1), head=2)
    s = Sweep([first, second, use])
    shared_ops(s, set())
    check(s, [a])
    assert [op.kind for op in s.ops] == ["template", "sum"]
    assert [x.value for x in s.ops[1].args] == [p, p] and s.ops[1].args[1].scale == (2.0,)


@pytest.mark.parametrize("case", ["updated", "returned", "other_op"])
def test_what_is_not_shared(case):
    a, p, q, first, second = _two_of_one(op="exp", data=None)
    z, r = Value((2, 3)), Value((2, 3))
    if case == "other_op":  # another operator: not the same op
        second = Op("template", [q], [Read(a)], op="tanh", data=None)
    ops = [first, second]
    if case == "updated":  # P + Z written into P: the first value is gone after it
        ops.append(Op("add_into", [r], [Read(p), Read(a)]))
    ops.append(Op("scale", [z], [Read(q, scale=(3.0,))]))
    s = Sweep(ops)
    shared_ops(s, {q} if case == "returned" else set())
    check(s, [a])
    assert second in s.ops and s.ops[-1].args[0].value is q
