"""Evaluate terms with torch: the autograd oracle that gradients are held against.

Vocabulary
----------
oracle      an evaluation of a term that shares nothing with the rules or the numpy lowering:
            each built-in operator is written here from its definition (DESIGN.md), in torch,
            float64, so that ``torch.autograd`` differentiates the plain term. The gradients of
            a normal form (rules, then numpy evaluation or generated code) must agree with it.
builtin     ``sym``, ``num``, ``zero``, ``eye``, ``add``, ``mul``, ``had``, ``t``, ``pow``, ``trace``,
            ``m`` (relu), ``a`` (row-wise softmax), ``mm(A, B) = [A > 0] o B``,
            ``aa(A, B) = S o (B - rowsum(S o B) 1^t)`` and ``let`` (its body).
user op     an operator a rule file declared (``operator tanh(A) numpy tanh``, or by a value
            ``= B - tanh(A) * tanh(A) * B``): its numpy template (fdsl's own text, composed from the
            fixed table ``fdsl.core.ops.NUMPY_FUNCTIONS`` and the built-in templates) is run with ``np``
            and the runtime helpers standing for torch (``np.tanh`` is ``torch.tanh``); a template
            torch cannot run is an ``FdslError`` naming the operator, never a wrong number.
values      arrays by printed symbol name, as for ``fdsl.numbers.numpy_eval``; ``weights`` lists
            the names whose gradients are wanted (their tensors require grad).

torch is optional: ``available()`` says whether it can be imported; nothing else in fdsl needs it.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from typing import Mapping

from ..base.errors import FdslError
from ..core.ops import OPS
from ..core.ops import shown as op_name
from ..core.terms import Term, postorder


def available() -> bool:
    """Whether torch can be imported."""
    return importlib.util.find_spec("torch") is not None


def _torch():
    import torch

    return torch


class _NumpyInTorch:
    """The numpy that operator templates call (``fdsl.core.ops.NUMPY_FUNCTIONS`` and the built-in
    templates), in torch: ``np.tanh`` is ``torch.tanh``, numbers become float64 tensors."""

    def __init__(self, torch):
        self.torch = torch

    def __getattr__(self, name):
        torch = self.torch
        special = {"cbrt": lambda x: torch.sign(x) * torch.abs(x) ** (1.0 / 3.0),
                   "trace": lambda x: torch.trace(x)}
        fn = special.get(name) or getattr(torch, name, None)
        if fn is None or not callable(fn):
            raise AttributeError("np.%s has no torch counterpart here" % name)
        return lambda *args: fn(*(self.tensor(a) for a in args))

    def tensor(self, a):
        return a if self.torch.is_tensor(a) else self.torch.tensor(float(a), dtype=self.torch.float64)


def _helpers(torch) -> dict:
    """The runtime helpers of ``fdsl.numbers.numpy_runtime`` that templates call, in torch."""

    def mul(*factors):
        scale, product = None, None
        for x in factors:
            if not torch.is_tensor(x) or x.numel() == 1 and x.dim() < 2 or tuple(x.shape) == (1, 1):
                x = x if torch.is_tensor(x) else torch.tensor(float(x), dtype=torch.float64)
                scale = x.reshape(()) if scale is None else scale * x.reshape(())
            else:
                product = x if product is None else product @ x
        if product is None:
            return scale.reshape(1, 1)
        return product if scale is None else scale * product

    def softmax(x):
        return torch.softmax(x, dim=1)

    def mm(a, b):
        return (a > 0).to(torch.float64) * b

    def aa(a, b):
        s = torch.softmax(a, dim=1)
        return s * (b - (s * b).sum(dim=1, keepdim=True))

    helpers = {"_mul": mul, "_softmax": softmax, "_mm": mm, "_aa": aa}
    helpers.update(_issue12_helpers(torch))
    return helpers


def _issue12_helpers(torch) -> dict:
    """The componentwise functions, layer norm and log-softmax from torch's own definitions, and
    their derivative operators as torch's Jacobian-vector products of those (differentiable again,
    so autograd reaches through them): nothing here repeats fdsl's formulas. (torch's fused
    layer_norm has no exact third derivative, so layer norm is written out.)"""

    def layernorm(a):  # from elementary operations: differentiable to every order
        c = a - a.mean(dim=1, keepdim=True)
        return c / torch.sqrt((c * c).mean(dim=1, keepdim=True) + 1e-5)

    primal = {
        "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "tanh": torch.tanh,
        "sigmoid": torch.sigmoid, "gelu": lambda a: 0.5 * a * (1.0 + torch.erf(a * 0.7071067811865476)),
        "layernorm": layernorm,
        "logsoftmax": lambda a: a - torch.logsumexp(a, dim=1, keepdim=True),
    }

    def jvp(f, a, b):
        # J(a) b by the double-vjp trick, differentiable in a and b alike (torch.autograd.
        # functional.jvp detaches b, so gradients through b would be lost)
        if not a.requires_grad:
            a = a.detach().requires_grad_(True)
        out = f(a)
        dummy = torch.zeros_like(out, requires_grad=True)
        (vjp,) = torch.autograd.grad(out, a, dummy, create_graph=True)
        (j,) = torch.autograd.grad(vjp, dummy, b, create_graph=True)
        return j

    out = {"_" + name: f for name, f in primal.items()}
    for name, f in primal.items():
        out["_d" + name] = (lambda f: lambda a, b: jvp(f, a, b))(f)
    # second derivatives: f''(A) o B for gelu (an elementwise f'(A) is f's jvp along ones)
    out["_ddgelu"] = lambda a, b: jvp(lambda x: jvp(primal["gelu"], x, torch.ones_like(x)), a, b)
    out["_ddlayernorm"] = lambda a, u, b: jvp(lambda x: jvp(primal["layernorm"], x, u), a, b)
    return out


class TorchEvaluator:
    """Evaluates terms as float64 torch tensors over fixed values; one tensor per distinct node."""

    def __init__(self, values: Mapping, dims: Mapping, weights=()):
        self.torch = _torch()
        self.dims = {k: v for k, v in dims.items() if v is not None}
        self.leaves: dict = {}  # printed name -> tensor (weights require grad)
        for name, array in values.items():
            self.leaves[name] = self.torch.tensor(array, dtype=self.torch.float64,
                                                  requires_grad=name in set(weights))
        self.memo: dict = {}

    def value(self, term: Term):
        memo = self.memo
        for node in postorder(term, descend=lambda n: n not in memo):
            if node not in memo:
                memo[node] = self._node(node)
        return memo[term]

    def gradients(self, loss: Term, weights) -> dict:
        """d loss / d W for each printed weight name (zeros where the loss does not involve W)."""
        if not weights:
            return {}
        out = self.value(loss).reshape(())
        leaves = [self.leaves[w] for w in weights]
        if not out.requires_grad:  # no weight reaches the loss through a differentiable path
            # (mm(U, X) = [U > 0] o X is flat in U): autograd has no graph to go back through
            return {w: self.torch.zeros_like(x).detach().numpy() for w, x in zip(weights, leaves)}
        grads = self.torch.autograd.grad(out, leaves, allow_unused=True)
        return {w: (g.detach().numpy() if g is not None else self.torch.zeros_like(x).detach().numpy())
                for w, g, x in zip(weights, grads, leaves)}

    # -- nodes

    def _size(self, dim) -> int:
        if isinstance(dim, int):
            return dim
        if dim not in self.dims:
            raise FdslError("the torch oracle needs the size of dim %s" % dim)
        return self.dims[dim]

    def _full(self, value, shape):
        return self.torch.full(tuple(self._size(s) for s in shape), float(value), dtype=self.torch.float64)

    def _node(self, node: Term):
        torch = self.torch
        op, args = node.op, [self.memo[a] for a in node.args]
        if op == "sym":
            symbol, shape = node.data
            if symbol.kind == "dim":
                return self._full(self._size(symbol.name) if symbol.value is None else symbol.value, (1, 1))
            if symbol.value == "ones":
                return self._full(1.0, shape)
            if symbol.value == "identity":
                return torch.eye(self._size(shape[0]), dtype=torch.float64)
            if symbol.value == "causal":  # 0 on and below the diagonal, -inf above
                n = self._size(shape[0])
                return torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), diagonal=1)
            if isinstance(symbol.value, Term):
                return self.value(symbol.value)
            if symbol.printed() not in self.leaves:
                raise FdslError("the torch oracle has no value for %s" % symbol.printed())
            return self.leaves[symbol.printed()]
        if op == "num":
            return self._full(node.data, (1, 1))
        if op == "zero":
            return self._full(0.0, node.data)
        if op == "eye":
            return torch.eye(self._size(node.data), dtype=torch.float64)
        if op == "ones":
            return self._full(1.0, node.data)
        if op == "div":
            return args[0] / args[1]
        if op in ("rowsum", "rowmean", "rowvar"):
            x = args[0]
            return {"rowsum": lambda: x.sum(dim=1, keepdim=True), "rowmean": lambda: x.mean(dim=1, keepdim=True),
                    "rowvar": lambda: x.var(dim=1, keepdim=True, unbiased=False)}[op]()
        if op == "let":
            return args[0]
        if op == "add":
            out = args[0]
            for x in args[1:]:
                out = out + x
            return out
        if op == "mul":
            scale, product = None, None
            for x, a in zip(args, node.args):
                if a.scalar:
                    scale = x if scale is None else scale * x
                else:
                    product = x if product is None else product @ x
            if product is None:
                return scale
            return product if scale is None else scale.reshape(()) * product
        if op == "had":
            out = args[0]
            for x in args[1:]:
                out = out * x
            return out
        if op == "t":
            return args[0].T
        if op == "pow":
            return args[0] ** float(node.data)
        if op == "trace":
            return torch.trace(args[0]).reshape(1, 1)
        if op == "m":
            return torch.relu(args[0])
        if op == "a":
            return torch.softmax(args[0], dim=1)
        if op == "mm":
            return (args[0] > 0).to(torch.float64) * args[1]
        if op == "aa":
            s = torch.softmax(args[0], dim=1)
            return s * (args[1] - (s * args[1]).sum(dim=1, keepdim=True))
        if op == "d":
            raise FdslError("the torch oracle evaluates matrices of numbers, not differentials")
        return self._template(node, args)

    def _template(self, node: Term, args):
        spec = OPS.get(node.op)
        if spec is None or spec.numpy is None:
            raise FdslError("operator %s has no definition the torch oracle can run" % op_name(node.op))
        names = ["x%d" % i for i in range(len(args))]
        data = float(node.data) if isinstance(node.data, Fraction) else node.data
        try:
            expr = spec.numpy.format(*names, args=", ".join(names), args_sum=" + ".join(names),
                                     args_had=" * ".join(names), value="data", exponent="data")
            # the template is the operator's definition, from a rule file already loaded (and
            # compiled the same way) by fdsl.numbers.numpy_eval; no builtins are reachable
            code = compile(expr, "<torch oracle of %s>" % node.op, "eval")
            env = {"__builtins__": {}, "np": _NumpyInTorch(self.torch), "data": data, **_helpers(self.torch)}
            env.update(zip(names, args))
            out = eval(code, env)  # noqa: S307 - see above
        except Exception as e:  # whatever the template does, torch cannot run it: say so
            raise FdslError("the torch oracle cannot run operator %s's numpy template %r: %s"
                            % (op_name(node.op), spec.numpy, e)) from None
        if not self.torch.is_tensor(out):
            raise FdslError("operator %s's numpy template %r gave no tensor in the torch oracle"
                            % (op_name(node.op), spec.numpy))
        return out
