"""The writers: the statement IR spelled as Python, the one place that writes generated code.

Vocabulary
----------
name        every value gets a name, in the order the lowering made the values (then the passes'):
            a hint (a let's name, an input's printed name) made an identifier, numbered where it
            clashes (``X_2``); none: ``t1``, ``t2``; a value named after another takes its name with
            a prefix or suffix (``mask_X``, ``X_h``, underscores where that clashes).
spelling    how each op kind is written for a target (``docs/ir.md``): the target supplies the
            few spellings in which numpy and torch differ (sums along an axis, constants, the
            operators' templates).
in place    decided here, last: a sum's terms after its first statement are added into the
            array that statement made (``v += x``), never into an array the writer does not own
            (a term with a batch axis that the array lacks is added out of place); a product
            scaled after the fact is scaled in place (``v *= c``).
del         a value is deleted after its last read, unless it is an input, a dim, a constant or a
            result.

``ModuleWriter`` is the part of ``fdsl.codegen.lowering.Lowering`` that writes the function around
the sweep and the module around it (docstring, imports, the target's runtime helpers, the
constants built once per dtype); the lowering decides what is computed, in which order.
"""

from __future__ import annotations

import builtins
import keyword

from ..base.errors import FdslError
from ..core.ops import OPS
from ..core.ops import shown as op_name
from ..core.printers import short
from .ir import Dim, Op, Read, Value, values_of
from .source import _indent, _natural, docstring_literal

# Names the generated module gives a meaning of its own: its imports, its globals and functions,
# the builtins. A symbol called INPUTS or grads gets a variable with a suffix (INPUTS_2): a local
# of the name would hide the global from the function reading it (UnboundLocalError).
_RESERVED = {"np", "torch", "math", "ctypes", "os", "platform", "values", "INPUTS", "IDS", "FLOATS", "DTYPE",
             "EXAMPLES", "EXAMPLE_SIZE", "WEIGHTS", "SHAPES", "INIT", "DATA", "grads", "grads_and_loss", "loss",
             "FdslLoss", "Model"} | set(dir(builtins))


def _is_temp(name: str) -> bool:
    """A name of the form t<digits>, kept for values without a hint."""
    return len(name) > 1 and name[0] == "t" and name[1:].isdigit()


class Writer:
    """The spelling of the IR for one target (see the module doc)."""

    def __init__(self, target):
        self.target = target
        self.names: set = set(_RESERVED)
        self.counter = 0
        self.device = ", _dev" if target.device else ""
        # the products' dtype under autocast, an argument of the product helpers (torch: _lp)
        self.lp = ", _lp" if target.autocast else ""
        self._unsqueeze: set = set()  # the values the op being written reads with a head axis
        self.coalesced: set = set()  # sums written into the array of their first term (see coalesce)

    # -- names

    def name_all(self, values) -> None:
        """Name ``values`` (in creation order) that have no name yet."""
        for v in sorted(values, key=lambda v: v.id):
            if v.name is None:
                v.name = self._fresh(v)

    def _fresh(self, v: Value) -> str:
        hint = v.hint
        if isinstance(hint, Value):
            if hint.name is None:
                self.name_all([hint])
            hint = v.prefix + hint.name + v.suffix
        if hint is not None and not v.numbered:
            name = hint
            while name in self.names:
                name += "_"
            self.names.add(name)
            return name
        if hint is not None:
            base = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in hint)
            if not base.isidentifier() or keyword.iskeyword(base) or base.startswith("_") or _is_temp(base):
                base = "v_" + base
            name, i = base, 1
            while name in self.names:
                i += 1
                name = "%s_%d" % (base, i)
            self.names.add(name)
            return name
        while True:
            self.counter += 1
            name = "t%d" % self.counter
            if name not in self.names:
                self.names.add(name)
                return name

    # -- operands

    def scalar(self, s) -> str:
        """A scalar operand: a float, a scalar value, a dim's size."""
        if isinstance(s, Value):  # (a number of each example read by a stacked op: with a head axis)
            return "_head_axis(%s)" % s.name if s in self._unsqueeze else s.name
        if isinstance(s, Dim):
            return "float(%s)" % (s.size.name if isinstance(s.size, Value) else s.size)
        return repr(float(s))

    def size(self, s) -> str:
        return s.name if isinstance(s, Value) else str(s)

    def read(self, r: Read, bare: bool = False) -> str:
        """A read: ``x``, ``x.mT``, ``(c * x)``; ``bare``: a scaled read without its brackets."""
        if not isinstance(r, Read):
            return self.scalar(r)
        name = r.value.name
        if r.value in self._unsqueeze:  # a head axis of 1: broadcasts against stacks, not the batch
            name += ".unsqueeze(-3)"
        text = name + (".mT" if r.t and not r.value.scalar else "")
        if not r.scale:
            return text
        if r.scale == (-1.0,):
            return ("-%s" if bare else "(-%s)") % text
        if r.t and not bare:  # scaled as stored, then the view (the scale made once, either way)
            return "(%s * %s).mT" % (" * ".join(self.scalar(s) for s in r.scale), name)
        text = "%s * %s" % (" * ".join(self.scalar(s) for s in r.scale), text)
        return text if bare else "(%s)" % text

    def reads(self, items) -> str:
        """A tuple literal of reads, as the runtime helpers take them: ``(a, b,)``."""
        return "(%s,)" % ", ".join(self.read(r) for r in items)

    # -- ops

    def lines(self, op) -> list:
        """The statements of ``op``."""
        return [text for text, _ in self.statements(op)]

    def statements(self, op) -> list:
        """(statement, the values it reads) for each statement of ``op``: a value read by the
        first lines of an op and not after is deleted as soon as they are done."""
        self._unsqueeze = set(op.attrs.get("unsqueeze", ()))
        if any(v.heads for v in op.outs) or any(r.value.heads for r in op.reads()):
            # a number of each example, (batch, 1, 1), scaling a stack of heads takes a head axis
            scales = [s for r in op.reads() for s in r.scale] + list(op.attrs.get("out_scale", ()))
            self._unsqueeze |= {s for s in scales if isinstance(s, Value) and s.scalar and s.batched}
        if op.kind == "sum":
            return self._sum(op)
        lines = self._lines(op)
        scale = op.attrs.get("out_scale")
        if not scale:
            return [(lines[0], op.values_read())]
        first = [v for v in op.values_read() if v not in [s for s in scale if isinstance(s, Value)]]
        return [(lines[0], first), (lines[1], [op.out] + [s for s in scale if isinstance(s, Value)])]

    @staticmethod
    def _batched(r) -> bool:
        """Whether a read may carry a batch axis: its value's, or a number of each example in its scale."""
        return r.value.batched or any(isinstance(s, Value) and s.batched for s in r.scale)

    def _lines(self, op) -> list:
        kind, a = op.kind, op.args
        outs = ", ".join(v.name for v in op.outs)
        out = op.outs[0].name
        tgt = self.target
        if kind == "input":
            shape = "(%s)" % ", ".join(map(str, op.attrs["shape"])) if op.attrs["shape"] is not None else "None"
            return ["%s = _input(values, %r, %s, %s, _dt%s)" % (out, op.attrs["name"], shape, op.attrs["batched"],
                                                              self.device)]
        if kind == "ids_input":
            return ["%s = _ids(values, %r, %s, %d%s)" % (out, op.attrs["name"], op.attrs["rows"], op.attrs["vocab"],
                                                        self.device)]
        if kind == "scalar_input":
            return ["%s = _scalar(values, %r)" % (out, op.attrs["name"])]
        if kind == "dim":
            return ["%s = %s.shape[%d]" % (out, a[0].value.name, op.attrs["axis"])]
        if kind == "const":
            sizes = [self.size(s) for s in op.attrs["shape"]]
            make = op.attrs["make"]
            args = sizes[0] if make in ("eye", "causal") else "(%s)" % ", ".join(sizes)
            return ["%s = %s" % (out, tgt.constant(make, args))]
        code = self._code(op)
        lines = ["%s = %s" % (outs, code)]
        scale = op.attrs.get("out_scale")
        if scale:  # scaled after the product, in place: the product's array is its own ...
            code = " * ".join(self.scalar(s) for s in scale)
            if any(isinstance(s, Value) and s.batched for s in scale) and not any(
                    self._batched(r) for r in op.reads()):  # ... unless a number of each example widens it
                lines.append("%s = %s * %s" % (out, out, code))
            else:
                lines.append("%s *= %s" % (out, code))
        return lines

    def _code(self, op) -> str:
        """The expression of an op that makes its outputs by one call (every kind but the inputs,
        dims, constants and sums)."""
        kind, a = op.kind, op.args
        tgt = self.target
        lp = self.lp
        if kind == "matmul":
            if op.attrs.get("total"):
                code = "_matmul_total(%s, %s, _nb%s%s)" % (self.read(a[0]), self.read(a[1]), lp,
                                                           ", alpha=_seed" if op.attrs.get("seeded") else "")
            elif op.attrs.get("causal"):  # triangular by a causal mask (fdsl.codegen.causal)
                code = "_bmm_causal(%s, %s, %r%s)" % (self.read(a[0]), self.read(a[1]), op.attrs["causal"], lp)
            elif op.attrs.get("bmm"):
                code = "_bmm(%s, %s%s)" % (self.read(a[0]), self.read(a[1]), lp)
            elif lp:
                code = "_matmul(%s, %s%s)" % (self.read(a[0]), self.read(a[1]), lp)
            else:
                code = "%s @ %s" % (self.read(a[0]), self.read(a[1]))
        elif kind == "causal_softmax":  # the product's scales are its alpha (fdsl.codegen.causal)
            scales = [self.scalar(x) for r in a[:2] for x in r.scale]
            code = "_causal_softmax(%s, %s, %s, %s%s)" % (
                self.read(a[0]._replace(scale=())), self.read(a[1]._replace(scale=())), self.read(a[2]),
                " * ".join(scales) if scales else "None", lp)
        elif kind == "scatter":
            if op.attrs.get("total"):
                code = "_scatter_total(%s, %s, %d, _nb)" % (self.read(a[0]), self.read(a[1]), op.attrs["vocab"])
            else:
                code = "_scatter(%s, %s, %d)" % (self.read(a[0]), self.read(a[1]), op.attrs["vocab"])
        elif kind == "scatter_into":
            code = "_scatter_into(%s, %s, %s, %d, %s, %s)" % (
                self.read(a[0]), self.read(a[1]), self.read(a[2]), op.attrs["vocab"],
                "_nb" if op.attrs.get("total") else "None", bool(op.attrs.get("t")))
        elif kind == "onehot":  # (in the working dtype: it is multiplied with the floats)
            code = "_onehot(%s, %d, _dt)" % (self.read(a[0]), op.attrs["vocab"])
        elif kind == "add_ids":
            # the sign, times the scalar operands after the ids (fdsl.codegen.onehot)
            sign = " * ".join([repr(op.attrs["sign"])] + [self.scalar(s) for s in a[2:]])
            code = "_add_ids(%s, %s, %s)" % (self.read(a[0]), self.read(a[1]), sign)
        elif kind == "sum_axis":
            axis = op.attrs["axis"]
            if op.attrs.get("total"):
                code = "_sum_total(%s, %d, _nb)" % (self.read(a[0]), axis)
            else:
                code = tgt.sum_axis(self.read(a[0]), axis)
            if op.attrs.get("view_t"):
                code += ".mT"
        elif kind == "scale":
            code = self.read(a[0], bare=True)
        elif kind == "template":
            code = self.template(op, [self.read(r) for r in a])
        elif kind == "remade":  # (torch: a traced graph makes it again; eagerly, the value kept)
            attrs = dict(op.attrs)
            again = Op(attrs.pop("of", "template"), op.outs, a[1:], **attrs)
            code = "%s if torch.compiler.is_compiling() else %s" % (self._code(again), self.read(a[0]))
        elif kind == "scalar_template":
            arrays = [tgt.constant("full", "(1, 1), %s" % self.scalar(s)) if not isinstance(s, Read) else self.read(s)
                      for s in a]
            code = "_as_float(%s)" % self.template(op, arrays)
        elif kind == "scalar_op":
            if op.attrs["op"] == "pow":
                code = "(%s) ** %r" % (self.scalar(a[0]), op.attrs["exponent"])
            else:
                code = (" + " if op.attrs["op"] == "add" else " * ").join("(%s)" % self.scalar(s) for s in a)
        elif kind == "grouped":
            side, total = op.attrs["side"], op.attrs.get("total")
            helper = {("cols", False): "_grouped", ("rows", False): "_grouped_rows",
                      ("cols", True): "_grouped_total", ("rows", True): "_grouped_total_rows"}[side, bool(total)]
            first, second = (self.read(a[0]), self.reads(a[1:])) if side == "cols" else (self.reads(a[:-1]),
                                                                                       self.read(a[-1]))
            code = "%s(%s, %s%s%s)" % (helper, first, second, ", _nb" if total else "", lp)
        elif kind == "sum_of_products":
            n = op.attrs["n"]
            code = "_sum_of_products(%s, %s%s)" % (self.reads(a[:n]), self.reads(a[n:]), lp)
        elif kind == "cat_addmm":
            code = "_addmm(%s, %s, _cat(%s, -2)%s)" % (self.read(a[0]), self.read(a[1]), self.reads(a[2:]), lp)
        elif kind == "cat_matmul":
            if lp:
                code = "_matmul(%s, _cat(%s, -2)%s)" % (self.read(a[0]), self.reads(a[1:]), lp)
            else:
                code = "%s @ _cat(%s, -2)" % (self.read(a[0]), self.reads(a[1:]))
        elif kind == "split_total":
            code = "_split_total(%s, %s, _nb, %d, %d%s%s)" % (self.read(a[0]), self.read(a[1]), op.attrs["n"],
                                                              op.attrs["axis"], lp,
                                                              ", alpha=_seed" if op.attrs.get("seeded") else "")
        elif kind == "stack":
            code = "torch.stack(%s, -3)" % self.reads(a)
        elif kind == "split":
            code = "%s.chunk(%d, %d)" % (self.read(a[0]), op.attrs["n"], op.attrs["axis"])
        elif kind == "unbind":
            code = "%s.unbind(-3)" % self.read(a[0])
        elif kind == "grouped_heads":
            half = 1 + (len(a) - 1) // 2  # biased: the B, then a bias row for each
            bs, rows = (a[half:], a[1:half])[::-1] if op.attrs.get("biased") else (a[1:], ())
            bias = ", bias=%s" % self.reads(rows) if rows else ""
            if len(bs) > 1 and all(r.t and not r.scale and not r.value.scalar for r in bs):
                # all read transposed (Q^t, as nn.Linear's rows): given as they are, joined along
                # the rows and the join transposed, one view where there were a transpose a weight
                bs, bias = [r._replace(t=False) for r in bs], bias + ", t=True"
            code = "_grouped_heads(%s, %s, %d%s%s)%s" % (self.read(a[0]), self.reads(bs), op.attrs["h"], lp, bias,
                                                         "" if len(op.outs) > 1 else "[0]")
        elif kind == "side_products":  # each product into its columns (fdsl.codegen.heads)
            code = "_side_products((%s,)%s)" % (", ".join(
                "(%s, %s, %r, %r)" % (self.read(a[2 * i]), self.read(a[2 * i + 1]), k, c)
                for i, (k, c) in enumerate(zip(op.attrs["kinds"], op.attrs["scales"]))), lp)
        elif kind == "side_by_side":  # each stack scaled (its read's scale) as it is copied in
            scales = ", (%s,)" % ", ".join(" * ".join(map(self.scalar, r.scale)) if r.scale else "None"
                                           for r in a) if any(r.scale for r in a) else ""
            code = "_side_by_side(%s%s)" % (self.reads([r._replace(scale=()) for r in a]), scales)
        elif kind == "mask":
            code = "%s > 0" % self.read(a[0])
        elif kind == "scalar_matrix":
            code = "_scalar_matrix(%s, _dt%s)" % (self.scalar(a[0]), self.device)
        else:
            if kind == "trace_product" and a[0].t and not a[0].scale:  # trace(A^t B): the sum of A o B
                kind, a = "inner", (a[0].T(), a[1])
            helper = _HELPERS.get(kind + ("_heads" if op.attrs.get("heads") else ""))
            if kind in ("layernorm_affine", "dlayernorm_affine") and len(op.outs) + len(a) in (5, 7):
                helper = _GAIN_ONLY[kind]  # (no bias row: kernels.affine_layernorms)
            if helper is None:
                raise FdslError("internal: the %s writer cannot spell an op of kind %r" % (tgt.name, kind))
            code = helper % tuple(self.read(r) for r in a)
            if kind == "addmm" and lp:  # a product: in the autocast dtype
                code = code[:-1] + lp + ")"
        return code

    def _sum(self, op) -> list:
        """``v = a + b`` (the first statement's terms, an array of its own), then ``v += c``."""
        terms = list(zip(op.attrs["signs"], op.args))
        head = op.attrs.get("head", 2)
        if head == 1 and terms[0][0] > 0 and len(terms) > 1 and op not in self.coalesced:
            head = 2  # v = a alone would be a's array: never add into an array the writer does not own
        out = op.outs[0].name

        def joined(items) -> str:
            sign, first = items[0]
            text = ("-%s" if sign < 0 else "%s") % self.read(first)
            return text + "".join(" %s %s" % ("-" if s < 0 else "+", self.read(r)) for s, r in items[1:])

        def values(items) -> list:
            return [v for _, r in items for v in values_of(r)]

        if op in self.coalesced:  # the first term's array is this sum's: add the rest into it
            lines = []
        else:
            lines = [("%s = %s" % (out, joined(terms[:head])), values(terms[:head]))]
        # the leading axes the array has: a batch, a stack of heads
        batched = any(self._batched(r) for _, r in terms[:head])
        stacked = any(r.value.heads for _, r in terms[:head])
        for sign, r in terms[head:]:
            if (self._batched(r) and not batched) or (r.value.heads and not stacked):
                # broadcasts to a larger array: not into this one
                lines.append(("%s = %s %s %s" % (out, out, "-" if sign < 0 else "+", self.read(r)),
                              [op.out] + values([(sign, r)])))
                batched, stacked = batched or self._batched(r), stacked or bool(r.value.heads)
            else:
                lines.append(("%s %s= %s" % (out, "-" if sign < 0 else "+", self.read(r)),
                              [op.out] + values([(sign, r)])))
        return lines

    def template(self, op, exprs) -> str:
        """An operator's template for this target, with its operands."""
        name = op.attrs["op"]
        spec = OPS.get(name)
        template = self.target.template(spec, name) if spec is not None else None
        data = op.attrs.get("data")
        data = repr(data)
        try:
            return template.format(*exprs, args=", ".join(exprs), args_sum=" + ".join(exprs),
                                   args_had=" * ".join(exprs), value=data, exponent=data)
        except (KeyError, IndexError) as e:
            raise FdslError("the numpy template of operator %s, %r, uses an unknown placeholder %s"
                            % (op_name(name), spec.numpy, e)) from None


# the kinds that are one runtime helper of their reads
_HELPERS = {
    "masked": "%s * %s",
    "lookup": "_lookup(%s, %s)",
    "pick_sum": "_pick_sum(%s, %s)",
    "aa_ids": "_aa_ids(%s, %s)",
    "softmax": "_softmax(%s)",
    "aa_given": "_aa_given(%s, %s)",
    "layernorm_stats": "_layernorm_stats(%s)",
    "dlayernorm_stats": "_dlayernorm_stats(%s, %s, %s, %s)",
    "layernorm_affine": "_layernorm_affine(%s, %s, %s)",
    "dlayernorm_affine": "_dlayernorm_affine(%s, %s, %s, %s, %s, %s, _nb)",
    "dlogsoftmax_given": "_dlogsoftmax_given(%s, %s)",
    "addmm": "_addmm(%s, %s, %s)",
    "add_into": "_add_into(%s, %s)",
    "trace": "_trace(%s)",
    "trace_product": "_trace_product(%s, %s)",
    "trace_product_heads": "_trace_product_heads(%s, %s)",
    "inner": "_inner(%s, %s)",
    "inner_heads": "_inner_heads(%s, %s)",
}


# an affine layer norm with its gain alone (no bias row)
_GAIN_ONLY = {
    "layernorm_affine": "_layernorm_affine(%s, %s, None)",
    "dlayernorm_affine": "_dlayernorm_affine(%s, %s, %s, %s, %s, None, _nb)[:2]",
}


# the kinds whose result is a new array of their own (not a view of an operand, not an input)
_OWNED = {"addmm", "cat_addmm", "matmul", "cat_matmul", "sum_of_products", "add_into"}


class ModuleWriter:
    """Writing out a ``Lowering``: its sweep as a function, and the module around it."""

    def _named(self) -> None:
        """Give every value its name: the lowering's in the order it made them, then the passes'."""
        self.writer.name_all(self.values)
        made = [v for op in self.sweep for v in op.outs]
        self.writer.name_all(made + [v for op in self.sweep for v in op.values_read()])

    def _coalesce(self, kept: set) -> None:
        """A sum whose first statement would be its first term alone, ``Y = P``, where P is a new
        array that only this sum reads (an addmm that did the head of a longer sum): P is written
        under Y's name and the rest added into it, as the sum would have been."""
        for op in self.sweep:
            if op.kind != "sum" or op.attrs.get("head") != 1 or op.attrs["signs"][0] < 0 or len(op.args) < 2:
                continue
            first = op.args[0]
            maker = self.sweep.maker.get(first.value)
            if first.t or first.scale or maker is None or maker.kind not in _OWNED or first.value in kept:
                continue
            if self.sweep.users(first.value) != [op] or sum(r.value is first.value for r in op.reads()) != 1:
                continue
            first.value.name = op.out.name
            self.writer.coalesced.add(op)
            if op.out in self._comments:  # the binding's comment goes where its array is made
                self._comments.setdefault(first.value, self._comments.pop(op.out))

    def function_body(self, results, loss=None, name="grads") -> list:
        """The lines of the sweep's body (the function ``name``): dtype, inputs, dims, constants,
        the sweep with deletions, return (with ``loss``, the code of 1/2 ||E||^2 and the values it
        reads, the pair (gradients, loss))."""
        w = self.writer
        inputs = sorted(self.inputs, key=lambda op: _natural(op.out.name))
        dev = w.device
        ids = [op for op in inputs if op.kind == "ids_input"]
        lines = ["%s = _dtype(values, %s, DTYPE)" % ("_dt, _dev" if dev else "_dt", "FLOATS" if ids else "INPUTS")]
        if w.lp:  # the products' dtype: torch.autocast's where it is on (the runtime's module doc)
            lines.append("_lp = _low_precision(_dt, _dev)")
        lines += [line for op in inputs for line in w.lines(op)]
        # ids carry a batch as their first of two axes: read with a last axis of 1, as a matrix's
        examples = [op.out.name + ("[..., None]" if op.kind == "ids_input" else "")
                    for op in inputs if op.out in self.batch_inputs]
        lines.append("_nb = _batch(%s)" % ", ".join(examples) if examples else "_nb = 0")
        if self.target.pieces and examples:
            # a large batch goes through in pieces of a few examples (see targets: pieces)
            lines.append("if _nb and _piece(_nb, EXAMPLE_SIZE, _dt):\n"
                         "    return _in_pieces%s(%s, values, EXAMPLES, _piece(_nb, EXAMPLE_SIZE, _dt)%s)"
                         % ("_ids" if ids else "", name, ", IDS" if ids else ""))
        lines += [line for op in self.dim_stmts for line in w.lines(op)]
        if self.module_consts:
            targets = [op.out.name for op in self.module_consts]
            lines.append("%s = _constants(_dt%s)" % (", ".join(targets) + ("," if len(targets) == 1 else ""), dev))
        lines += [line for op in self.runtime_consts for line in w.lines(op)]
        keep = set(self.given())
        returned = {r.var for _, r, _ in results.values() if isinstance(r.var, Value)}
        if loss is not None:
            returned |= set(loss[1])
        self._coalesce(keep | returned)
        statements = [w.statements(op) for op in self.sweep]
        last = {}  # value -> (op, statement) of its last read
        for i, stmts in enumerate(statements):
            for k, (_, reads) in enumerate(stmts):
                for v in reads:
                    last[v] = (i, k)
        # torch: a call that wants the loss alone (no gradients: evaluation, torch.no_grad) returns
        # once the loss is known, so it costs the forward sweep only
        early = loss is not None and self.target.device and name == "grads_and_loss"
        loss_at = max((i for i, op in enumerate(self.sweep) if set(loss[1]) & set(op.outs)), default=-1) \
            if early else None
        if early and loss_at < 0:
            lines.append("if not _grads:\n    return None, %s" % loss[0])
        for i, op in enumerate(self.sweep):
            comment = self._comments.get(op.out) if len(op.outs) == 1 else None
            if comment:
                lines.append("# " + comment)
            for k, (text, reads) in enumerate(statements[i]):
                lines.append(text)
                if early and i == loss_at and k == len(statements[i]) - 1:
                    lines.append("if not _grads:\n    return None, %s" % loss[0])
                dead = sorted({v.name for v in reads if last.get(v) == (i, k) and v not in keep
                               and v not in returned and v.name not in {o.name for o in op.outs}})
                if dead:
                    lines.append("del " + ", ".join(dead))

        def result(how, ref, extra, batched: bool) -> str:
            if how == "full":
                code = "_full((%s), %s, _nb, _dt%s)" % (", ".join(w.size(s) for s in extra), w.scalar(ref.var), dev)
                return code
            code = w.read(ref.read())
            if how == "copy":
                code = "_copy(%s)" % code
                return "_total(%s, _nb)" % code if batched and not extra else code
            return "_total(%s, _nb)" % code if batched and not extra else code

        def returned_value(batched: bool) -> str:
            items = ["%r: %s" % (key, result(*spec, batched)) for key, spec in results.items()]
            if len(items) < 2:
                value = "{%s}" % ", ".join(items)
            else:
                value = "{\n" + "".join("    %s,\n" % i for i in items) + "}"
            return "return " + (value if loss is None else "%s, %s" % (value, loss[0]))

        if examples:  # a batch: every gradient summed over it (one test, not one per gradient)
            lines.append("if _nb:\n" + _indent(returned_value(True)))
        lines.append(returned_value(False))
        return lines

    def example_size(self) -> int:
        """Entries of the largest array that one example's sweep makes (dims without a size
        guessed), for cutting a batch into pieces."""
        return max((self._guess(b.shape[0]) * self._guess(b.shape[1]) for b in self.batched if b.shape),
                   default=1)

    def input_names(self) -> list:
        """The printed names of the array inputs, in the order the module reads them."""
        self.writer.name_all(op.out for op in self.inputs)  # the first values the lowering made
        return [self.array_inputs[op.out] for op in sorted(self.inputs, key=lambda op: _natural(op.out.name))
                if op.out in self.array_inputs]

    def source(self, docstring: str, extra="") -> str:
        """The generated module (``extra``: more of it, after the functions; a function of no
        arguments is called once the sweep is final, for what reads it)."""
        results = self.lower()
        self._named()
        w = self.writer
        loss = None
        if self.loss is not None:
            ref = self.ref(self.loss)
            if self.loss.scalar:  # w = -d(L): L itself, summed over a batch
                loss = ("_loss_total(%s, _nb%s)" % (w.scalar(ref.var), ", _dt, _dev" if self.target.device else ""),
                        (ref.var,) if isinstance(ref.var, Value) else ())
            else:  # w = form(E): 1/2 ||E||^2
                loss = ("_half_sq(%s, _nb)" % w.read(ref.read()), (ref.var,))
        for base, name in self.let_names.items():
            ref = self.refs.get(base)
            if ref is not None and not ref.scalar:
                self._comments.setdefault(ref.var, "%s := %s" % (name, short(base, 110)))
        target = self.target
        out = [docstring_literal(docstring), ""] + list(target.imports) + ["", ""]
        head = "# ---- runtime helpers (%s) " % target.origin
        out.append(head + "-" * max(3, 95 - len(head)))
        out.append("")
        out.append(target.runtime(ids=any(op.kind == "ids_input" for op in self.inputs)))
        out.append("")
        out.append("")
        out.append("# ---- constants " + "-" * 80)
        out.append("")
        out.append("DTYPE = %s  # None: compute in the dtype of the inputs" % target.dtype_code(self.dtype))
        names = self.input_names()
        out.append("INPUTS = %r  # the array inputs" % (tuple(names),))
        ids = tuple(op.attrs["name"] for op in sorted(self.inputs, key=lambda op: _natural(op.out.name))
                    if op.kind == "ids_input")
        if ids:
            out.append("IDS = %r  # the inputs given as ids (onehot constants): integers, (rows,) or (batch, rows)"
                       % (ids,))
            out.append("FLOATS = tuple(name for name in INPUTS if name not in IDS)  # the dtype is theirs")
        if target.pieces and self.batch_inputs:
            out.append("EXAMPLES = %r  # the inputs that may carry a batch axis"
                       % (tuple(self.array_inputs[v] for v in sorted(self.batch_inputs,
                                                                     key=lambda v: _natural(v.name))),))
            out.append("EXAMPLE_SIZE = %d  # entries of the largest array of one example" % self.example_size())
        if self.module_consts:
            dev = ", _dev" if target.device else ""
            key = "(_dt, _dev)" if dev else "_dt"
            out += ["_CONSTANTS: dict = {}", "", "",
                    "def _constants(_dt%s):" % dev,
                    '    """The constant arrays, built once per dtype%s."""'
                    % (" and device (in a traced graph, made in it each call:\n    stored, they would change the "
                       "state it was traced against, and it would recompile)" if dev else "")]
            if dev:
                # torch.compile traces against the module's state: a first call that stored the
                # constants would change it, and the next call recompile (a second graph of the
                # whole sweep, held with the first). Traced, they are made in the graph, which
                # folds them
                out += ["    traced = torch.compiler.is_compiling()",
                        "    got = None if traced else _CONSTANTS.get(%s)" % key]
            else:
                out.append("    got = _CONSTANTS.get(%s)" % key)
            out.append("    if got is None:")
            out += ["        " + line for op in self.module_consts for line in w.lines(op)]
            targets = [op.out.name for op in self.module_consts]
            made = ", ".join(targets) + ("," if len(targets) == 1 else "")
            if dev:
                out += ["        got = (%s)" % made, "        if not traced:", "            _CONSTANTS[%s] = got" % key]
            else:
                out.append("        got = _CONSTANTS[%s] = (%s)" % (key, made))
            out.append("    return got")
        out.append("")
        out.append("")
        body = [("    " + line).rstrip() if "\n" not in line else _indent(line)
                for line in self.function_body(results, loss, "grads_and_loss" if loss is not None else "grads")]
        if loss is not None:
            if target.device:
                out.append("def grads_and_loss(values: dict, _grads: bool = True, _seed=None):")
                out.append('    """(every gradient G_W^t by printed weight name, the loss %s), from one sweep; with '
                           '``_grads``\n    false, (None, the loss) from the forward sweep alone. ``_seed``: a number '
                           'the gradients\n    SEEDED are made times (their products\' alpha), None: 1."""'
                           % ("L" if self.loss.scalar else "1/2 ||E||^2"))
            else:
                out.append("def grads_and_loss(values: dict):")
                out.append('    """(every gradient G_W^t by printed weight name, the loss %s), from one sweep."""'
                           % ("L" if self.loss.scalar else "1/2 ||E||^2"))
            out.extend(body)
            out += ["", ""]
            body = ["    return grads_and_loss(values)[0]"]
        out.append("def grads(values: dict) -> dict:")
        out.append('    """Every gradient G_W^t of the form, by printed weight name; values: arrays by printed '
                   'name."""')
        out.extend(body)
        if callable(extra):
            extra = extra()
        if extra:
            out += ["", "", extra.rstrip()]
        out.append("")
        return "\n".join(out)
