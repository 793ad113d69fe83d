"""Printers: the manual's manifestations of a term, ``show``, ``string``, ``html``, plus LaTeX.

Vocabulary
----------
text     what ``show`` prints: compact and readable (``Q_0``, ``K_0^t``, ``dW_0``).
string   the re-parseable form: ``parse(string(t)) == t`` in the program that declared t's symbols
         (``Q[0]``, ``d(W[0])``, ``eye(n)``, ``zeros(n, d)``).
latex    for papers and Jupyter (``Term._repr_latex_``).
html     for the browser, in the manual's style (subscripts, superscripts).
prec     binding strength of a printed node: sums bind loosest, then Hadamard products, then
         products, then postfix operators (``^t``, powers), then atoms. A child that binds more
         loosely than its position needs is parenthesised.

Every printer is one ``Style`` (how each construct is spelled) run by one driver that visits each
distinct node of the shared term graph once, children first, without recursion.
"""

from __future__ import annotations

import html as _html
from fractions import Fraction

from .ops import OPS
from .ops import shown as op_name
from .share import Sharing
from .terms import Term, postorder

SUM, HAD, MUL, POSTFIX, ATOM = 1, 2, 3, 4, 5
_KEEP = 2000  # printed texts longer than this are not kept once the printing that made them is done


class Style:
    """How text spells each construct; the other styles override what differs."""

    plus, minus, neg, had_sep, mul_sep, div_sep = " + ", " - ", "-", " * ", " ", " / "
    lpar, rpar = "(", ")"

    def symbol(self, symbol, shape):
        return symbol.printed()

    def let(self, name, index):
        return name + "".join("_%d" % i for i in index)

    def number(self, value: Fraction):
        return str(value.numerator) if value.denominator == 1 else "%d/%d" % (value.numerator, value.denominator)

    def transpose(self, inner):
        return inner + "^t"

    def power(self, base, exponent: Fraction):
        if exponent.denominator == 1 and exponent > 0:
            return "%s^%d" % (base, exponent.numerator)
        return "%s^(%s)" % (base, self.number(exponent))

    def call(self, name, args):
        return "%s(%s)" % (op_name(name), ", ".join(args))

    def differential(self, node, inner):
        # dQ_0 for the differential of a symbol, as the manual writes it; d(...) otherwise
        if node.args[0].op in ("sym", "let"):
            return "d" + inner
        return "d(%s)" % inner

    def eye(self, dim):
        return "I_%s" % dim

    def zero(self, shape):
        return "0"

    def ones(self, shape):
        return "ones(%s, %s)" % shape

    def paren(self, s):
        return self.lpar + s + self.rpar

    def wrap(self, s):
        return s

    def dim_count(self, dim, node, inner):
        """``trace(ones(1, d) ones(d, 1))``, the number d (how ``cols`` names a symbolic width)."""
        return str(dim)


def _dim_count(n: Term):
    """The dim d if ``n`` is ``trace(ones(1, d) ones(d, 1))``, else None."""
    a = n.args[0]
    if a.op != "mul" or len(a.args) != 2 or any(f.op != "ones" for f in a.args):
        return None
    (one, d), (d2, one2) = a.args[0].shape, a.args[1].shape
    return d if one == one2 == 1 and d == d2 and not isinstance(d, int) else None


class StringStyle(Style):
    """Re-parseable: every construct in the language's own surface syntax."""

    def symbol(self, symbol, shape):
        # one bracket for all indices: P[0, 1] (P[0][1] would index the family P with one index)
        return symbol.name + ("[%s]" % ", ".join(map(str, symbol.index)) if symbol.index else "")

    def let(self, name, index):
        # bound by the where-block that string() puts around a term with named intermediates
        return name + ("[%s]" % ", ".join(map(str, index)) if index else "")

    def differential(self, node, inner):
        return "d(%s)" % inner

    def eye(self, dim):
        return "eye(%s)" % dim

    def zero(self, shape):
        return "zeros(%s, %s)" % shape

    def dim_count(self, dim, node, inner):
        return "trace(%s)" % inner  # re-parseable as the same term (a dim alone reads as its size)


def _latex_name(name, font=r"\mathit"):
    # "_" in a name (G_encoder, the adjoint of encoder_1; a user's my_x) is a letter of the name:
    # bare, TeX would read it as a subscript and print G_encoder as G with a subscript e
    return name if len(name) == 1 else r"%s{%s}" % (font, name.replace("_", r"\_"))


class LatexStyle(Style):
    # a thin space between the factors of a product: TeX sets adjacent letters as one word, so
    # without it s s reads as a name ss, and s \mathrm{encoder}_{1} as sencoder1
    had_sep, mul_sep, div_sep = r" \circ ", r" \, ", r" \oslash "
    lpar, rpar = r"\left(", r"\right)"

    def symbol(self, symbol, shape):
        base = _latex_name(symbol.name)
        return base + ("_{%s}" % ",".join(map(str, symbol.index)) if symbol.index else "")

    def let(self, name, index):
        # an intermediate is named after a definition (encoder_3): upright, like an operator name
        base = _latex_name(name, r"\mathrm")
        return base + ("_{%s}" % ",".join(map(str, index)) if index else "")

    def number(self, value):
        if value.denominator == 1:
            return str(value.numerator)
        sign = "-" if value < 0 else ""
        return r"%s\tfrac{%d}{%d}" % (sign, abs(value.numerator), value.denominator)

    def transpose(self, inner):
        return "{%s}^{t}" % inner

    def power(self, base, exponent):
        e = ("%d" % exponent.numerator if exponent.denominator == 1
             else "%d/%d" % (exponent.numerator, exponent.denominator))
        return "{%s}^{%s}" % (base, e)

    def call(self, name, args):
        op = OPS.get(name)
        head = op.latex if op is not None and op.latex else r"\operatorname{%s}" % op_name(name)
        return r"%s\left(%s\right)" % (head, ", ".join(args))

    def differential(self, node, inner):
        if node.args[0].op in ("sym", "let"):
            return r"\mathrm{d}" + inner
        return r"\mathrm{d}\left(%s\right)" % inner

    def eye(self, dim):
        return "I_{%s}" % dim

    def ones(self, shape):
        return r"\mathbf{1}_{%s \times %s}" % shape


class HtmlStyle(Style):
    minus, neg, had_sep = " &minus; ", "&minus;", " &#8728; "

    def symbol(self, symbol, shape):
        sub = "<sub>%s</sub>" % ",".join(map(str, symbol.index)) if symbol.index else ""
        return "<i>%s</i>%s" % (_html.escape(symbol.name), sub)

    def let(self, name, index):
        sub = "<sub>%s</sub>" % ",".join(map(str, index)) if index else ""
        return "<i>%s</i>%s" % (_html.escape(name), sub)

    def transpose(self, inner):
        return inner + "<sup>t</sup>"

    def power(self, base, exponent):
        return "%s<sup>%s</sup>" % (base, self.number(exponent))

    def call(self, name, args):
        return '<span class="op">%s</span>(%s)' % (_html.escape(op_name(name)), ", ".join(args))

    def differential(self, node, inner):
        if node.args[0].op in ("sym", "let"):
            return "d" + inner
        return "d(%s)" % inner

    def eye(self, dim):
        return "<i>I</i><sub>%s</sub>" % _html.escape(str(dim))

    def wrap(self, s):
        return '<span class="fdsl">%s</span>' % s


class Printer:
    """Runs a Style over the shared term graph, one visit per distinct node (memoised)."""

    def __init__(self, style: Style):
        self.style = style
        self.memo: dict = {}  # Term -> (text, prec, unsigned text or None)

    def __call__(self, t: Term) -> str:
        self._fill(t)
        return self.style.wrap(self.memo[t][0])

    def _fill(self, t):
        memo = self.memo
        if t in memo:
            return
        todo = [n for n in postorder(t, descend=lambda n: n not in memo and n.op != "let") if n not in memo]
        # A long text is let go once every node of this printing that uses it has been printed:
        # a chain m(m(...)) n deep would otherwise keep n texts of up to n characters each
        # (quadratic memory); kept, short texts make the next printing of a shared node free.
        waiting: dict = {}
        for node in todo:
            if node.op != "let":
                for c in node.args:
                    waiting[c] = waiting.get(c, 0) + 1
        for node in todo:
            memo[node] = self._node(node)
            if node.op == "let":
                continue
            for c in node.args:
                waiting[c] -= 1
                if not waiting[c] and c is not t and len(memo[c][0]) > _KEEP:
                    del memo[c]

    def _at(self, child, prec):
        text, p, _ = self.memo[child]
        return self.style.paren(text) if p < prec else text

    def _node(self, n: Term):
        s, op = self.style, n.op
        if op == "sym":
            return s.symbol(*n.data), ATOM, None
        if op == "let":
            return s.let(*n.data), ATOM, None
        if op == "num":
            v = n.data
            if v < 0:
                return s.neg + s.number(-v), SUM, s.number(-v)
            return s.number(v), (ATOM if v.denominator == 1 else MUL), None
        if op == "eye":
            return s.eye(n.data), ATOM, None
        if op == "zero":
            return s.zero(n.data), ATOM, None
        if op == "ones":
            return s.ones(n.data), ATOM, None
        if op == "add":
            parts = []
            matrices = any(not a.scalar and _broadcast_scalar(a) is None for a in n.args)
            for i, a in enumerate(n.args):
                text, p, unsigned = self.memo[a]
                scalar = _broadcast_scalar(a) if matrices else None
                if scalar is not None:  # s ones(n, d) beside matrices prints as s: 1 + exp(A)
                    text, p, unsigned = self._product(scalar) if scalar else ("1", ATOM, None)
                if unsigned is not None:
                    parts.append((s.minus if i else s.neg) + unsigned)
                else:
                    parts.append((s.plus if i else "") + text)
            return "".join(parts), SUM, None
        if op == "mul":
            return self._product(n.args)
        if op == "had":
            return s.had_sep.join(self._at(a, HAD + 1) for a in n.args), HAD, None
        if op == "div":  # binds like *, to the left: A / B / C is (A / B) / C
            scalar = _broadcast_scalar(n.args[0])  # 1 / A is stored as ones(n, d) / A
            if scalar is not None:
                text, p, _ = self._product(scalar) if scalar else ("1", ATOM, None)
                top = self.style.paren(text) if p < HAD else text
            else:
                top = self._at(n.args[0], HAD)
            below = self._at(n.args[1], HAD + 1)
            if n.args[1].op == "mul" and below[:1].isdigit():  # A / 2 B would not read back (fdsl.lang.parse)
                below = s.paren(below)
            return top + s.div_sep + below, HAD, None
        if op == "t":
            return s.transpose(self._at(n.args[0], POSTFIX)), POSTFIX, None
        if op == "pow":
            return s.power(self._at(n.args[0], ATOM), n.data), POSTFIX, None
        if op == "d":
            return s.differential(n, self._at(n.args[0], ATOM) if n.args[0].op in ("sym", "let")
                                  else self.memo[n.args[0]][0]), ATOM, None
        if op == "trace":
            dim = _dim_count(n)
            if dim is not None:  # cols(A) of a symbolic width d: trace(ones(1, d) ones(d, 1)) is d
                return s.dim_count(dim, n, self.memo[n.args[0]][0]), ATOM, None
        # every other operator prints as a function call, by its name (f for the key f#2)
        return s.call(op, [self.memo[a][0] for a in n.args]), ATOM, None

    def _product(self, args):
        """A product of the printed ``args``: (text, prec, text without its minus sign or None)."""
        s = self.style
        sign, lead = "", []
        if args[0].op == "num":
            c = args[0].data
            if c < 0:
                sign, c = s.neg, -c
            if c != 1 or len(args) == 1:
                num_text = s.number(c)
                lead = [num_text if c.denominator == 1 else s.paren(num_text)]
            args = args[1:]
        body = s.mul_sep.join(lead + [self._at(a, POSTFIX if a.op == "num" else MUL + 1) for a in args])
        if sign:
            return sign + body, SUM, body
        return body, MUL if len(lead) + len(args) > 1 else ATOM, None


def _broadcast_scalar(t: Term):
    """The scalar factors of ``t`` if it is a scalar times a matrix of ones (``s ones(n, d)``, how
    ``s + A`` is stored), else None."""
    if t.op == "ones":
        return ()
    if t.op == "mul" and t.args[-1].op == "ones" and all(a.scalar for a in t.args[:-1]):
        return t.args[:-1]
    return None


_STYLES = {"text": Style(), "string": StringStyle(), "latex": LatexStyle(), "html": HtmlStyle()}
# Printers keep their memo between calls: terms are immutable, so a printed node stays printed.
_PRINTERS = {name: Printer(style) for name, style in _STYLES.items()}


def shown(t: Term, alias: bool = False, bindings: bool = True, known=()) -> Sharing:
    """``t`` as the printers write it: the shared subterms of ``t`` (``fdsl.core.share``) become
    intermediates, so that printing is linear in the graph, never in the tree. The found ones are
    transparent (written ``N = ...``, they read back as ``t`` itself). A subterm that is, written
    out, the body of a let of ``t`` is written by its name: a ``where`` block uses the names it
    binds (with ``alias``, the one ``string()`` needs, by a transparent name of its own). Without
    ``bindings`` (one line, nothing bound shown) what is found is named only in a very large term."""
    return Sharing(t, reuse=True, alias=alias, bindings=bindings, known=known)


def bindings(t: Term) -> list:
    """The intermediates ``t`` refers to, named with := or made by the engine, and found in the
    shared graph, looking through their bodies, each before the ones that use it; ``t`` itself
    is not included."""
    return _lets(shown(t))


def _lets(s: Sharing, known=()) -> list:
    # the body of a binding not printed is not read: what only it refers to is not printed either
    return [n for n in s.postorder(known) if n.op == "let" and n is not s.term and n not in known]


def _op(s: Sharing, n: Term) -> str:
    # a found intermediate is transparent, like a definition (=); a named one is a let (:=)
    return "=" if n in s.made else ":="


def short(t: Term, width: int = 100) -> str:
    """``t`` for a message: printed, cut to ``width`` characters; a term of more than 200 distinct
    nodes by its head only (its text could be long to make, and is unreadable anyway)."""
    if _bigger_than(t, 200):
        return "%s(...)" % op_name(t.op)
    s = text(t)
    return s if len(s) <= width else s[: width - 3] + "..."


def _bigger_than(t: Term, limit: int) -> bool:
    seen, stack = {t}, [t]
    while stack:
        for c in stack.pop().args:
            if c not in seen:
                if len(seen) >= limit:
                    return True
                seen.add(c)
                stack.append(c)
    return False


def text(t: Term) -> str:
    """What ``show`` prints on one line, without the bindings (see ``text_with_bindings``)."""
    if t.op == "let" or not t.args:  # a name or a leaf: nothing to share (labels print many)
        return _PRINTERS["text"](t)
    return _PRINTERS["text"](shown(t, bindings=False).term)


def string(t: Term) -> str:
    """The re-parseable form: ``parse(string(t)) == t``. Intermediates are written inline, each
    once: ``(E^t d(E) where X[1] := ..., E := Y - X[1])``; found ones transparently, with ``=``."""
    p, s = _PRINTERS["string"], shown(t, alias=True)
    lets = _lets(s) + ([s.term] if s.term.op == "let" else [])
    out = p(s.term)
    if not lets:
        return out
    return "(%s where %s)" % (out, ", ".join("%s %s %s" % (p(n), _op(s, n), p(s.body(n))) for n in lets))


def latex(t: Term) -> str:
    """LaTeX math (without the surrounding dollars); a long form as an ``aligned`` environment
    (see ``fdsl.core.layout``), the bindings after ``\\text{where}``."""
    from .layout import latex_rows

    p, s = _PRINTERS["latex"], shown(t)
    out = latex_rows(s.term, p, _PRINTERS["text"]) or p(s.term)
    lets = _lets(s)
    if not lets:
        return out
    rows = [r"%s &%s %s" % (p(n), _op(s, n), p(s.body(n))) for n in lets]
    return r"%s \quad\text{where}\quad \begin{aligned}%s\end{aligned}" % (out, r" \\ ".join(rows))


def html(t: Term) -> str:
    """An HTML fragment in the manual's style, the bindings after ``where``."""
    p, s = _PRINTERS["html"], shown(t)
    out = p(s.term)
    lets = _lets(s)
    if not lets:
        return out
    return "%s<br>where<br>%s" % (out, "<br>".join("&nbsp;&nbsp;%s %s %s" % (p(n), _op(s, n), p(s.body(n)))
                                                   for n in lets))


def text_with_bindings(t: Term, known=()) -> str:
    """``text(t)`` laid out (``fdsl.core.layout``), then ``where`` and one ``name := body`` line per
    binding t refers to (those in ``known`` excepted, and what only their bodies refer to;
    ``name = body`` for a found one): a shared form reads as a few layers, not as its expansion."""
    from .layout import text_lines

    known = set(known)
    p, s = _PRINTERS["text"], shown(t, known=known)
    lets = _lets(s, known)
    head = "\n".join(text_lines(s.term, p))
    if s.term.op == "let" and s.term not in known:
        head = _binding(p, s, s.term, "")
    if not lets:
        return head
    return "\n".join([head, "where"] + [_binding(p, s, n, "  ") for n in lets])


def _binding(p: Printer, s: Sharing, n: Term, indent: str) -> str:
    """``N := body`` (``N = body`` for a found one), a long body broken at its sums."""
    from .layout import broken

    lead = "%s%s %s " % (indent, p(n), _op(s, n))
    body = broken(s.body(n), p)
    return "\n".join([lead + body[0]] + [" " * len(lead) + line for line in body[1:]])
