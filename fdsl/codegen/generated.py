"""Generated code: the coefficients of a normal form as a standalone module, numpy or torch.

Vocabulary
----------
outputs      the terms to compute, by name: for gradients, ``G_W^t`` for every weight W of a normal
             form ``w = sum_W trace(G_W d(W))`` (``fdsl.calculus.gradients.gradient_terms``).
source       a Python module: a docstring naming its origin, the runtime helpers of the target
             (``numpy_runtime``, ``torch_runtime``), and ``grads(values)`` whose body is the
             lowering's sweep as the writer spells it (``fdsl.codegen.lowering``); with a loss (``w = form(E)``,
             ``L = 1/2 ||E||^2``, or ``w = -d(L)`` for any scalar L: ``gradients.loss_of``),
             ``grads_and_loss`` and, for torch, ``loss``, ``FdslLoss`` and ``Model``.
compiled     the same source compiled in-process (``compile_gradients``), for ``grad`` and
             training: one lowering to numbers for every command.

``fdsl codegen FILE --form NAME -o grads.py`` writes such a module for the 1-form NAME (normalised
with the strategy ``backprop`` first when it is not already a normal form).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Mapping, Optional

from ..base.errors import FdslError
from ..calculus.gradients import gradient_terms  # noqa: F401  (codegen.gradient_terms: what it computes)
from ..core.printers import short
from ..core.terms import Term
from .families import families
from .lowering import Lowering, nodes
from .targets import TARGETS

# ---- the API: source, compiled function ---------------------------------------------------------


_TORCH_TRAINING = '''# ---- training with torch -----------------------------------------------------------------------

WEIGHTS = %(weights)r  # the weights, in the order of their gradients
SHAPES = %(shapes)r  # None: a dim read off the values; (): a scalar weight, 0-d
# the initial values declared (weight g : 1 x d = ones): ("ones",), ("zeros",), ("identity",) or
# ("normal", mean, std); a weight not here starts as normal entries / sqrt(rows)
INIT = %(init)r
DATA = %(data)r  # the inputs that vary per example: (rows, cols) of one ((rows,): ids)
# the weights the sweep reads side by side, held by a Model as blocks of one tensor (names, "cols"
# or "rows": along which they are concatenated; fdsl.codegen.families)
FAMILIES = %(families)r
# the gradients the sweep makes times its seed (their products' alpha; fdsl.codegen.kernels.seeded_products)
SEEDED = frozenset(%(seeded)r)
TRAINED = INPUTS + tuple(name for name in WEIGHTS if name not in INPUTS)  # and the scalar weights
_SEED = [1.0]  # the scale of the last backward on a CPU: the next step's guess of its own


class FdslLoss(torch.autograd.Function):
    """The loss L (%(loss)s) whose backward is fdsl's closed-form gradient: the forward is the generated
    sweep (it computes the gradients with the loss, without recording a graph) and the backward
    hands them out, dL/dW = -G_W^t, scaled by the incoming gradient, shaped like W as given (a
    scalar weight too, and a row weight given 1-D, as torch's biases are). Inputs that are not
    weights (the data) get no gradient."""

    @staticmethod
    def forward(ctx, scalars, *tensors):
        seed = None
        if not torch.compiler.is_compiling() and tensors and torch.is_tensor(tensors[-1]) \
                and tensors[-1].device.type == "cpu":  # training on a CPU: _keep_heap, the seed guessed
            _keep_heap()
            seed = _SEED[0]
        values = dict(scalars)
        values.update((name, _declared(name, t)) for name, t in zip(TRAINED, tensors))
        g, value = grads_and_loss(values, True, seed)
        ctx.grads, ctx.seed = g, seed
        ctx.shapes = [t.shape if torch.is_tensor(t) else None for t in tensors]
        return value

    @staticmethod
    def backward(ctx, grad_loss):
        g, shapes, seed = ctx.grads, ctx.shapes, ctx.seed
        # (torch.compile breaks its graph here: dynamo traces no del on a Function's context, and
        # then compiles the forward's sweep as a graph of its own and runs this backward as
        # written. Traced as one with this backward, the sweep held 50-60 MiB more at
        # shakespeare_char's batch 4: its gradients became the saved values of a joint graph)
        del ctx.grads, ctx.shapes
        scale = -grad_loss
        # the gradients SEEDED were made times the seed guessed in the forward (the last step's
        # scale, read here as a number: a CPU's, no device to wait for); they need scale / seed,
        # nothing where the guess holds (a training loop's mean: the same 1/tokens each step)
        ratio = None
        if seed is not None:
            now = float(scale)
            ratio = now / seed
            if now != 0.0 and abs(now) < float("inf"):  # (not nan either)
                _SEED[0] = now
        # the others (and all of them, off a CPU) scaled by one foreach product (one aten call, not
        # one per weight), in place: they are the sweep's own arrays, read by nothing else, and new
        # ones would be a step's worth of fresh memory (page faults: slower than the product
        # itself); a broadcast view (a stride 0) is scaled into a new one
        own, seeded, seen = [], [], set()
        for name, x in g.items():
            if torch.is_tensor(x) and id(x) not in seen:  # (a tensor two weights share is scaled once)
                seen.add(id(x))
                st = x.stride()
                if 0 not in st or all(s or n == 1 for s, n in zip(st, x.shape)):
                    (seeded if ratio is not None and name in SEEDED else own).append(x)
        if own:
            torch._foreach_mul_(own, scale)
        if seeded and ratio != 1.0:
            torch._foreach_mul_(seeded, ratio)
        owned = {id(x) for x in own + seeded}
        out = []
        for name, shape in zip(TRAINED, shapes):
            x = g.get(name) if shape is not None else None
            if x is None:
                out.append(None)
                continue
            if id(x) not in owned:  # a broadcast view
                x = x * (ratio if ratio is not None and name in SEEDED else scale)
            out.append(x if x.shape == shape else x.reshape(shape))
        return (None,) + tuple(out)


_ROWS = frozenset(name for name in WEIGHTS if SHAPES[name] is not None and len(SHAPES[name]) == 2
                  and SHAPES[name][0] == 1)  # the weights of one row: biases, gains


def _declared(name, x):
    """A row weight given 1-D, (d,) as torch holds a bias, as the 1 x d matrix the sweep reads (a view)."""
    return x.view(1, -1) if name in _ROWS and torch.is_tensor(x) and x.dim() == 1 else x


def loss(values: dict):
    """The loss L (%(loss)s) at ``values`` (tensors by printed name; a batch axis on the data sums the
    loss over it), differentiable in the weights through fdsl's closed-form gradient:
    ``loss(values).backward()`` fills the ``.grad`` of the weight tensors that require it. A row
    weight (1 x d) may be given 1-D, as a Model's parameter is."""
    if not torch.is_grad_enabled():  # evaluation: the forward sweep alone
        return grads_and_loss({name: _declared(name, v) for name, v in values.items()}, False)[1]
    scalars = {name: v for name, v in values.items() if name not in TRAINED}
    return FdslLoss.apply(scalars, *(values[name] for name in TRAINED))


def _tied(ps, along):
    """Whether the parameters ps are blocks of one tensor in the order and layout of _tie."""
    first = ps[0]
    if first.dim() not in (1, 2):
        return False
    rows = first.dim() == 1 or along == "rows"
    step = (first.stride(0) if rows else first.stride(1)) * first.element_size()
    at = first.data_ptr()
    for p in ps:
        if p.dim() != first.dim() or p.stride() != first.stride() or p.data_ptr() != at:
            return False
        at += (p.shape[0] if rows else p.shape[-1]) * step
    return True


def _initial(name, shape, dtype, device, generator):
    """The initial value of the weight ``name`` (of ``shape``): its declared one, else normal
    entries scaled by 1/sqrt(rows)."""
    init = INIT.get(name, ("normal", 0.0, None))
    if init[0] in ("ones", "zeros"):
        return (torch.ones if init[0] == "ones" else torch.zeros)(shape, dtype=dtype, device=device)
    if init[0] == "identity":
        return torch.eye(shape[0], dtype=dtype, device=device)
    value = torch.randn(shape, dtype=dtype, device=device, generator=generator)
    if init[2] is None:  # undeclared: as fdsl's random draws a weight
        return value / shape[0] ** 0.5 if shape else value
    return value * init[2] + init[1]


_DATA_NAMES = tuple(name for name in TRAINED if name not in WEIGHTS)  # the inputs that are not weights


class Model(torch.nn.Module):
    """The weights, and ``forward(**data)`` the loss (or ``forward(data)``, the data in one dict by
    printed name, as a constant named ``self`` must be given): a module for optimisers,
    torch.compile and DistributedDataParallel. ``weights``: initial values by name (default: the
    value the declaration gives, ``INIT``, else normal entries scaled by 1/sqrt(rows), as fdsl's
    ``random`` draws them).

    Every weight is a parameter of its own, under its printed name: ``named_parameters()`` yields
    ``Q_0``, ``K_0``, ...; ``state_dict()`` and ``load_state_dict()`` go by those names, and
    optimiser parameter groups work as for any module (weight decay on the matrices alone:
    ``[p for p in model.parameters() if p.dim() >= 2]``, as nanoGPT's). A printed name that
    torch.nn.Module uses itself (``training``, ``to``, ``forward``) gets an underscore
    (``training_``). Parameters are shaped as torch's are: a weight of one row (``1 x d``, a bias
    or a layer norm's gain) is 1-D, ``(d,)``, and a scalar weight (``weight g : scalar``) 0-d;
    initial values may be given either way. The backward hands each parameter its gradient, the
    generated sweep's tensor scaled (one foreach product for all of them), and autograd puts it
    in ``.grad`` without a copy; an optimiser's multi-tensor path (``fused=True``, or
    ``foreach=True`` on a GPU) steps them together. ``weight(name)`` and ``named_weights()`` give
    the parameters by printed name, ``gradients()`` their ``.grad``. Under ``torch.no_grad()``
    the loss is the forward sweep alone, without the gradients."""

    def __init__(self, weights=None, dtype=torch.float64, device=None, generator=None):
        super().__init__()
        taken = set(dir(self))
        self._names = {}  # printed name -> parameter name
        for name in WEIGHTS:
            param = name
            while param in taken or (param != name and param in WEIGHTS):
                param += "_"
            self._names[name] = param
            taken.add(param)
            shape = SHAPES[name]
            if weights is not None and name in weights:
                value = torch.as_tensor(weights[name], dtype=dtype, device=device)
                if shape == () and tuple(value.shape) in ((1,), (1, 1)):  # a scalar given 1 x 1
                    value = value.reshape(())
                if name in _ROWS and value.dim() == 1:  # a row given as torch holds one
                    value = value.reshape(1, -1)
                if shape is not None and None not in shape and tuple(value.shape) != shape:
                    raise ValueError("%%s has shape %%s, not %%s" %% (name, tuple(value.shape), shape))
                value = value.clone()  # the model's own numbers, whatever it was given
            else:
                if None in shape:
                    raise ValueError("the shape of %%s has a dim without a size: give its initial value" %% name)
                value = _initial(name, shape, dtype, device, generator)
            if name in _ROWS:
                value = value.reshape(-1)
            self.register_parameter(self._names[name], torch.nn.Parameter(value))
        self._tie()
        if torch.device(device or "cpu").type == "cpu":  # a model to train on a CPU: _keep_heap
            _keep_heap()

    def _tie(self):
        """Hold each family (FAMILIES) as one tensor whose blocks are its weights' parameters (the
        same Parameter objects, their values kept): the sweep's concatenation of them is then a
        view. A family whose weights differ in dtype, device or shape from what one tensor can
        hold stays as it is (the sweep copies it, as for any weights)."""
        for names, along in FAMILIES:
            ps = [self.weight(name) for name in names]
            if _tied(ps, along):
                continue
            first = ps[0]
            if any(p.dtype != first.dtype or p.device != first.device for p in ps):
                continue
            if all(p.dim() == 1 for p in ps) and along == "cols":  # rows of one held 1-D: one 1-D storage
                blocks = [p.detach() for p in ps]
            elif all(p.dim() == 2 for p in ps):
                blocks = [p.detach().mT if along == "cols" else p.detach() for p in ps]
                if len({b.shape[1] for b in blocks}) != 1:
                    continue
            else:
                continue
            storage = torch.cat(blocks, 0)
            at = 0
            with torch.no_grad():
                for p, b in zip(ps, blocks):
                    view = storage[at:at + b.shape[0]]
                    at += b.shape[0]
                    p.data = view.mT if along == "cols" and view.dim() == 2 else view

    def _apply(self, fn, recurse=True):
        # .to(), .double(), .cuda() give each parameter new data: the families are held together again
        out = super()._apply(fn, recurse)
        self._tie()
        return out

    def named_weights(self):
        """(printed name, its parameter) for every weight, in the order of WEIGHTS."""
        return ((name, self._parameters[param]) for name, param in self._names.items())

    def weight(self, name):
        """The parameter of the weight ``name``."""
        return self._parameters[self._names[name]]

    def gradients(self):
        """The gradients of the last backward by printed name (each parameter's ``.grad``), None
        before any."""
        grads = {name: p.grad for name, p in self.named_weights()}
        return None if all(g is None for g in grads.values()) else grads

    def forward(self, given=None, /, **data):
        # the data as keywords, or as one dict: model({"self": X}) for a constant torch's own
        # Module.__call__(self, ...) cannot take as a keyword
        data = dict(given, **data) if given is not None else data
        weights = dict(self.named_weights())
        if not torch.is_grad_enabled():  # evaluation (torch.no_grad()): the forward sweep alone
            return loss(dict(data, **weights))
        scalars = {name: v for name, v in data.items() if name not in _DATA_NAMES}
        return FdslLoss.apply(scalars, *(weights[name] if name in weights else data[name] for name in TRAINED))
'''


def generate(outputs: Mapping, dims: Optional[Mapping] = None, docstring: str = "Generated by fdsl.") -> str:
    """The source of a standalone module whose ``grads(values)`` returns the outputs' values."""
    with _no_collector():
        return Lowering(outputs, dims).source(docstring)


@contextmanager
def _no_collector():
    """The cyclic garbage collector off while code is generated: the lowering makes a great many
    small objects (values, reads, ops) and no cycles among them, and the collector's passes over
    every live object, more of them the deeper the program, made generation grow faster than the
    sweep (GPT-2's shape: 1.35 s at 12 blocks, 0.90 s without them). Refcounting frees them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def gradients_source(w: Term, dims: Optional[Mapping] = None, origin: str = "", target: str = "numpy",
                     dtype: Optional[str] = None, loss: Optional[Term] = None, error: Optional[Term] = None) -> str:
    """The source of a module computing every gradient G_W^t of the normal form ``w`` with
    ``target`` (numpy or torch), in ``dtype`` (None: the inputs'). With ``loss`` (``loss_of`` of
    the form: E when ``w`` is form(E), for ``1/2 ||E||^2``, or the scalar L of ``w = -d(L)``;
    ``error`` is its older name) the module computes the loss in the same sweep, and a torch
    module gets the autograd Function and the Module that use it."""
    loss = loss if loss is not None else error
    outputs = gradient_terms(w)
    lib = TARGETS[target].name if target in TARGETS else target
    lines = ["Gradients generated by fdsl codegen%s (target %s)." % (" from %s" % origin if origin else "", lib), ""]
    lines.append("grads(values) returns, for every weight W of the normal form w = sum_W trace(G_W d(W)),")
    lines.append("its gradient G_W^t (shaped like W), by printed name: %s." % _wrap(", ".join(outputs)))
    if loss is None or not loss.scalar:
        lines.append("For w = form(E) = -trace(E^t d(E)) that is -dL/dW for L = 1/2 ||E||^2, the descent direction.")
    else:
        lines.append("For w = -d(L) that is -dL/dW, the descent direction of L = %s." % short(loss, 60))
    if loss is not None:
        lines.append("grads_and_loss(values) returns (grads(values), L) from the same sweep.")
    lines.append("")
    kind = "tensors (any device)" if lib == "torch" else "arrays"
    lines.append("values: %s by printed symbol name (the declared shapes; scalars as numbers). The code" % kind)
    if dtype is not None:
        lines.append("computes in %s (generated with --dtype %s)." % (dtype, dtype))
    elif lib == "torch":  # (torch_runtime's doc: precision)
        lines.append("computes in the dtype its tensor inputs share (bfloat16 too), else their promotion, "
                     "float64 where")
        lines.append("one is not floating.")
    else:
        lines.append("computes in the dtype of its inputs: float32 if every input is float32, else float64.")
    if lib == "torch":
        lines.append("Under torch.autocast its matrix products run in autocast's dtype and the rest (softmax, layer")
        lines.append("norm, the loss, sums over the batch, the gradients) in float32.")
    lines.append("A constant that varies per example (%s) may carry a leading batch axis, (batch, rows, cols):"
                 % ", ".join(sorted(n.data[0].printed() for n in nodes(outputs.values()) if n.op == "sym"
                                    and n.data[0].kind == "const" and n.data[0].value is None)) or "none here")
    lines.append("the gradients are then those of the loss summed over the batch.")
    needed = sorted({n.data[0].printed() for n in nodes(outputs.values())
                     if n.op == "sym" and n.data[0].kind != "dim" and n.data[0].value is None})
    lines.append("Needed: %s." % _wrap(", ".join(needed)))
    known = {k: v for k, v in (dims or {}).items() if isinstance(v, int)}
    if known:
        lines.append("Dims baked in: %s." % ", ".join("%s = %d" % kv for kv in sorted(known.items())))
    lines.append("One forward and one backward sweep: each distinct subterm once, in topological order.")
    lines.append("Imports only %s." % lib)
    with _no_collector():
        return _module(outputs, dims, target, dtype, loss, lib, lines)


def _module(outputs, dims, target, dtype, loss, lib, lines) -> str:
    """The module of ``gradients_source``, its docstring's ``lines`` written."""
    lowering = Lowering(outputs, dims, target, dtype, loss=loss)
    extra = ""
    if lib == "torch":
        if loss is not None:
            extra = lambda: _torch_training(lowering, outputs, dims, loss)  # noqa: E731  (after the passes)
        else:
            lines.append("The form is neither form(E) nor -d(L), so there is no loss, Function or Module here.")
    else:
        lines.append("")
    return lowering.source("\n".join(lines) + "\n", extra)


def _torch_training(lowering: Lowering, outputs: Mapping, dims: Optional[Mapping], loss: Term) -> str:
    """The autograd Function and Module of a torch module: torch training loops use them."""
    sizes = {k: v for k, v in (dims or {}).items() if isinstance(v, int)}

    def shape(leaf):
        if leaf.data[0].scalar:  # a scalar weight: a 0-d tensor
            return ()
        return tuple(side if isinstance(side, int) else sizes.get(side) for side in leaf.data[1])

    leaves = {n.data[0].printed(): n for n in lowering.nodes if n.op == "sym"}
    shapes = {name: shape(leaves[name]) for name in outputs if name in leaves}
    data = {name: shape(leaves[name])[:1] if leaves[name].data[0].onehot else shape(leaves[name])
            for name in lowering.input_names() if leaves[name].data[0].kind == "const"}  # ids: (rows,)
    what = "1/2 ||E||^2 of w = form(E)" if not loss.scalar else "of w = -d(L)"
    init = {name: leaves[name].data[0].init for name in shapes if leaves[name].data[0].init is not None}
    weights = {op.out: op.attrs["name"] for op in lowering.inputs if op.kind == "input" and op.attrs["name"] in shapes}
    return _TORCH_TRAINING % {"weights": tuple(outputs), "shapes": shapes, "init": init, "data": data, "loss": what,
                              "families": tuple(families(lowering.sweep, weights)),
                              "seeded": tuple(sorted(lowering.seeded))}


def _wrap(s: str, width: int = 96) -> str:
    out, line = [], ""
    for word in s.split(" "):
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = (line + " " + word) if line else word
    out.append(line)
    return "\n    ".join(out)


_COMPILED: dict = {}


def compile_source(source: str, filename: str = "<fdsl generated>"):
    """Execute generated source in a fresh namespace; its ``grads`` function."""
    return compile_namespace(source, filename)["grads"]


def compile_gradients(w: Term, dims: Optional[Mapping] = None, error: Optional[Term] = None):
    # ``error``: the loss as ``gradients.loss_of`` gives it (E of form(E), or the scalar L of -d(L))
    """``grads(values) -> {printed weight name: G_W^t}`` for the normal form ``w``, from the same
    generated source as ``fdsl codegen`` (cached per form, dims and error). Dims not given (or
    without a size) are read off the shapes of the values; constants may carry a batch axis. A
    missing value or a value of the wrong shape is an FdslError; ``grads.source`` is the generated
    module, ``grads.generated`` its function. With ``error`` E (or L), ``grads.with_loss(values)``
    is (the gradients, 1/2 ||E||^2, or L) from one sweep."""
    key = (w, tuple(sorted((k, v) for k, v in (dims or {}).items() if isinstance(v, int))), error)
    fn = _COMPILED.get(key)
    if fn is None:
        if len(_COMPILED) > 64:
            _COMPILED.clear()
        source = gradients_source(w, dims, loss=error)
        namespace = compile_namespace(source)
        fn = _COMPILED[key] = _checked(namespace["grads"], source)
        if error is not None:
            fn.with_loss = _checked(namespace["grads_and_loss"], source)
    return fn


def compile_namespace(source: str, filename: str = "<fdsl generated>") -> dict:
    """Execute generated source in a fresh namespace, and return it."""
    namespace: dict = {"__name__": "fdsl_generated"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def _checked(generated, source):
    def grads(values):
        try:
            return generated(values)
        except KeyError as e:
            raise FdslError("%s has no value: give values with 'values \"FILE.npz\"' (or --values), or "
                            "random ones with 'random SEED' (or --random)" % e.args[0]) from None
        except ValueError as e:
            raise FdslError("the values do not fit the form: %s" % e) from None

    grads.source, grads.generated = source, generated
    return grads
