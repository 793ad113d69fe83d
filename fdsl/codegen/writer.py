"""The module around the lowering's statements: the generated function's body (inputs, constants,
the sweep with its deletions, the return of the gradients, and of the loss) and the module's
source (docstring, imports, the target's runtime helpers, the constants built once per dtype).

``ModuleWriter`` is the part of ``fdsl.codegen.lowering.Lowering`` that writes; the lowering
decides what is computed, in which order (its module doc).
"""

from __future__ import annotations

from ..core.printers import short
from .fusion import targets as targets_of
from .source import _indent, _natural, docstring_literal


class ModuleWriter:
    """Writing out a ``Lowering``: its statements as a function, and the module around it."""

    # -- the module

    def _module_vars(self) -> set:
        return {v for v, _ in self.module_consts}

    def _runtime_const_vars(self) -> set:
        return {v for v, _ in self.runtime_consts}

    def function_body(self, results, loss=None, name="grads") -> list:
        """The lines of the sweep's body (the function ``name``): dtype, inputs, dims, constants,
        the sweep with deletions, return (with ``loss``, the code of 1/2 ||E||^2, the pair
        (gradients, loss))."""
        inputs = sorted(self.inputs, key=lambda s: _natural(s.target))
        dev = ", _dev" if self.target.device else ""
        lines = ["%s = _dtype(values, INPUTS, DTYPE)" % ("_dt, _dev" if dev else "_dt")]
        lines += [s.code for s in inputs]
        examples = [s.target for s in inputs if s.target in self.batch_inputs]
        lines.append("_nb = _batch(%s)" % ", ".join(examples) if examples else "_nb = 0")
        if self.target.pieces and examples:
            # a large batch goes through in pieces of a few examples (see targets: pieces)
            lines.append("if _nb and _piece(_nb, EXAMPLE_SIZE, _dt):\n"
                         "    return _in_pieces(%s, values, EXAMPLES, _piece(_nb, EXAMPLE_SIZE, _dt))" % name)
        lines += [s.code for s in self.dim_stmts]
        if self.module_consts:
            targets = [v for v, _ in self.module_consts]
            lines.append("%s = _constants(_dt%s)" % (", ".join(targets) + ("," if len(targets) == 1 else ""), dev))
        lines += [code for _, code in self.runtime_consts]
        keep = set(v for v, _ in self.module_consts) | {s.target for s in self.inputs}
        keep |= {s.target for s in self.dim_stmts} | self._runtime_const_vars()
        returned = {u for _, uses in results.values() for u in uses}
        if loss is not None:
            returned |= set(loss[1])
        last = {}
        for i, s in enumerate(self.body):
            for u in s.uses:
                last[u] = i
        # torch: a call that wants the loss alone (no gradients: evaluation, torch.no_grad) returns
        # once the loss is known, so it costs the forward sweep only
        early = loss is not None and self.target.device and name == "grads_and_loss"
        loss_at = max((i for i, s in enumerate(self.body) if set(loss[1]) & set(targets_of(s))), default=-1) \
            if early else None
        if early and loss_at < 0:
            lines.append("if not _grads:\n    return None, %s" % loss[0])
        for i, s in enumerate(self.body):
            comment = self._comments.get(s.target) if s.target and s.code.startswith(s.target + " = ") else None
            if comment:
                lines.append("# " + comment)
            lines.append(s.code)
            if early and i == loss_at:
                lines.append("if not _grads:\n    return None, %s" % loss[0])
            dead = sorted({u for u in s.uses if last.get(u) == i and u not in keep and u not in returned
                           and u != s.target})
            if dead:
                lines.append("del " + ", ".join(dead))

        def returned_value(batched: bool) -> str:
            items = ["%r: %s" % (name, code[batched]) for name, (code, _) in results.items()]
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
        return [self.array_inputs[s.target] for s in sorted(self.inputs, key=lambda s: _natural(s.target))
                if s.target in self.array_inputs]

    def source(self, docstring: str, extra: str = "") -> str:
        """The generated module (``extra``: more of it, after the functions)."""
        results = self.lower()
        loss = None
        if self.loss is not None:
            ref = self.ref(self.loss)
            if self.loss.scalar:  # w = -d(L): L itself, summed over a batch
                loss = ("_loss_total(%s, _nb%s)" % (ref.var, ", _dt, _dev" if self.target.device else ""),
                        (ref.var,) if ref.var.isidentifier() else ())
            else:  # w = form(E): 1/2 ||E||^2
                loss = ("_half_sq(%s, _nb)" % ref.expr(), (ref.var,))
        for base, name in self.let_names.items():
            ref = self.refs.get(base)
            if ref is not None and not ref.scalar:
                self._comments.setdefault(ref.var, "%s := %s" % (name, short(base, 110)))
        target = self.target
        out = [docstring_literal(docstring), ""] + list(target.imports) + ["", ""]
        head = "# ---- runtime helpers (%s) " % target.origin
        out.append(head + "-" * max(3, 95 - len(head)))
        out.append("")
        out.append(target.runtime())
        out.append("")
        out.append("")
        out.append("# ---- constants " + "-" * 80)
        out.append("")
        out.append("DTYPE = %s  # None: compute in the dtype of the inputs" % target.dtype_code(self.dtype))
        names = self.input_names()
        out.append("INPUTS = %r  # the array inputs" % (tuple(names),))
        if target.pieces and self.batch_inputs:
            out.append("EXAMPLES = %r  # the inputs that may carry a batch axis"
                       % (tuple(self.array_inputs[v] for v in sorted(self.batch_inputs, key=_natural)),))
            out.append("EXAMPLE_SIZE = %d  # entries of the largest array of one example" % self.example_size())
        if self.module_consts:
            dev = ", _dev" if target.device else ""
            out += ["_CONSTANTS: dict = {}", "", "",
                    "def _constants(_dt%s):" % dev,
                    '    """The constant arrays, built once per dtype%s."""' % (" and device" if dev else ""),
                    "    got = _CONSTANTS.get(%s)" % ("(_dt, _dev)" if dev else "_dt"),
                    "    if got is None:"]
            out += ["        " + code for _, code in self.module_consts]
            targets = [v for v, _ in self.module_consts]
            out.append("        got = _CONSTANTS[%s] = (%s)" % ("(_dt, _dev)" if dev else "_dt",
                                                         ", ".join(targets) + ("," if len(targets) == 1 else "")))
            out.append("    return got")
        out.append("")
        out.append("")
        body = [("    " + line).rstrip() if "\n" not in line else _indent(line)
                for line in self.function_body(results, loss, "grads_and_loss" if loss is not None else "grads")]
        if loss is not None:
            if target.device:
                out.append("def grads_and_loss(values: dict, _grads: bool = True):")
                out.append('    """(every gradient G_W^t by printed weight name, the loss %s), from one sweep; with '
                           '``_grads``\n    false, (None, the loss) from the forward sweep alone."""'
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
        if extra:
            out += ["", "", extra.rstrip()]
        out.append("")
        return "\n".join(out)
