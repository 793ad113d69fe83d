"""Elaborate: declarations and definitions into symbols and values, expressions into terms, with
shapes checked on the way.

Vocabulary
----------
Elaborator  the half of ``fdsl.lang.program.Program`` that holds what a program has declared and
            defined, and gives an expression its value. The program's statement loop hands it
            the ``dim``, declaration and definition statements; the statements of
            ``fdsl.lang.statements`` and the built-in functions ask it for values (``evaluate``,
            ``lookup``, ``call``). Operators and rulesets are the program's rule book's
            (``rulebook``, ``operator``, ``apply_rules``, all of ``Program``).
dim         a size, numeric (``dim n = 8``) or symbolic (``dim n``); shapes name dims.
family      an indexed declaration (``weight Q[i] : d x k``): ``Q[0]`` is the symbol ``Q_0``.
clause      one equation of a parameterised definition; clauses are tried in order, and an
            integer literal parameter (``encoder(0) = X``) only matches that integer.
value       what an expression elaborates to (``fdsl.core.functions``): a term, built by
            ``fdsl.core.terms``, whose constructors check shapes; numbers stay exact
            (``Fraction``) until they meet a matrix.

Every definition is evaluated when it is read; building its terms checks shapes, so a mismatch
stops the program at the definition, with a caret on the operand that does not fit.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from ..base.errors import FdslError, Redeclared
from ..base.limits import CALL_SHARE, DEFAULT_STEP_LIMIT
from ..base.numbers import number_problem, power_problem
from ..core import share
from ..core import terms as T
from ..core.functions import FUNCTIONS, as_int, as_term, describe, render
from ..core.ops import OPS, ShapeError, shape_str
from ..core.printers import short
from ..core.terms import Symbol, Term
from .hints import close_name, function_hint, keyword_hint
from .parse import Node, Stmt

DEPTH_LIMIT = 1000  # nested calls of user definitions before we call it runaway recursion


@dataclass
class Clause:
    name: str
    params: tuple
    body: Node
    named: bool
    source: tuple  # (filename, text) the body was parsed from, for error positions
    line: int


@dataclass
class Family:
    kind: str
    indices: tuple
    shape: tuple
    value: object
    scalar: bool = False  # weight tau[i] : scalar
    init: Optional[tuple] = None  # weight g[i] : 1 x d = ones: every member's initial value (Symbol.init)


def _pattern(params) -> tuple:
    """What a clause's parameters match: an integer literal matches itself, a name anything."""
    return tuple(p if isinstance(p, int) else None for p in params)


class Elaborator:
    """The declared names and definitions of a program, and the values of its expressions."""

    def __init__(self, filename: str):
        self.dims: dict[str, Optional[int]] = {}
        self.families: dict[str, Family] = {}
        self.symbols: dict[str, Term] = {}
        self.definitions: dict[str, object] = {}  # name = expr: its value
        self.clauses: dict[str, list[Clause]] = {}  # name(params) = expr
        self.declared_at: dict[str, str] = {}
        # definition name -> (text, filename, {clause pattern: place}, pattern, place): where it was defined
        self.defined_at: dict[str, tuple] = {}
        self.notes: list[str] = []  # what the repl says after an input: "E redefined (...)"
        self.sources: dict[str, list[str]] = {}  # definition name -> its clauses as written
        self._memo: dict = {}
        self._depth = 0
        self._calls = 0  # calls of definitions made by the outermost call now running (CALL_SHARE)
        self._runaway = None  # the innermost call when Python's recursion limit is hit
        self._src = (filename, "")
        self._src_lines = (None, [])  # (a text, its lines), for _record_source

    # ---- declarations and definitions ---------------------------------------------------------

    def _declare_name(self, name, what, line, col):
        if name in self.declared_at and (name in self.dims or name in self.families or name in self.symbols):
            raise Redeclared("%s is already declared (%s)" % (name, self.declared_at[name]),
                             self._src[0], line, col, self._src[1])
        share.reserve(name)
        self.declared_at[name] = "%s at %s:%d" % (what, self._src[0], line)

    def _declare_symbols(self, st: Stmt):
        kind = st.name
        shape = value = None
        # a shape applies to the names before it that have none: weight Q[i], K[i] : d x k; and
        # so does the value written after it: weight g1, g2 : 1 x d = ones starts both at ones
        for item in reversed(st.items):
            if item["shape"] is not None:
                shape, value = item["shape"], item["value"]
            item["_shape"] = shape
            if item["shape"] is None and item["value"] is None:
                item["value"] = value
        for item in st.items:
            self._declare_symbol(kind, item)

    def _declare_symbol(self, kind, item):
        name, line, col = item["name"], item["line"], item["col"]
        shape = item["_shape"]
        where = lambda msg: FdslError(msg, self._src[0], line, col, self._src[1])
        scalar_weight = False
        onehot = isinstance(shape, tuple) and len(shape) == 3
        if onehot:  # const X : n x v onehot (the parser keeps the word after the shape)
            shape = shape[:2]
            if kind != "const" or item["indices"] or item["value"] is not None:
                raise where("only a const without indices or a value can be declared onehot (its value is given "
                            "as ids): %s is %s" % (name, "a family" if item["indices"] else
                                                   "given a value" if item["value"] is not None else "a " + kind))
        if shape == "scalar":  # const c : scalar is a scalar; weight g : scalar a learnable one
            if kind == "weight":
                scalar_weight = True
            else:
                kind = "scalar"
            shape = (1, 1)
        if kind == "scalar":
            if shape is not None and shape != (1, 1):
                raise where("scalar %s cannot have the shape %s x %s" % ((name,) + shape))
            shape = (1, 1)
        elif shape is None:
            raise where("%s needs a shape: %s %s : rows x cols" % (name, kind, name))
        for dimname in shape:
            if isinstance(dimname, str) and dimname not in self.dims:
                raise where("unknown dim %r in the shape of %s; declare it with: dim %s" % (dimname, name, dimname))
        value = init = None
        if item["value"] is not None and kind == "weight":
            init = self._weight_init(name, shape, scalar_weight, item["value"])
        elif item["value"] is not None:
            value = self._symbol_value(kind, name, shape, item["value"])
        clash = self._printed_clash(name, bool(item["indices"]))
        if clash:
            raise where(clash)
        self._declare_name(name, kind, line, col)
        if item["indices"]:
            self.families[name] = Family(kind, item["indices"], shape, value, scalar_weight, init)
        else:
            self.symbols[name] = T.sym(Symbol(name, (), kind, value, scalar_weight, onehot, init), shape)

    def _printed_clash(self, name: str, family: bool):
        """Why ``name`` would print as a member of a family, or a family's members as a declared name
        (``weight Q[i]`` and ``weight Q_0`` both print ``Q_0``: one key in value and gradient files,
        one gradient for two weights); None if they stay apart."""
        parts = name.split("_")
        for k in range(1, len(parts)):
            base, rest = "_".join(parts[:k]), parts[k:]
            if base in self.families and all(p.isdigit() for p in rest):
                return ("%s would print as the member %s[%s] of the family %s (%s): one name for two things; "
                        "rename one" % (name, base, ", ".join(str(int(p)) for p in rest), base,
                                        self.declared_at.get(base, "declared")))
        if family:
            for other in list(self.symbols) + list(self.families):
                tail = other[len(name) + 1:].split("_") if other.startswith(name + "_") else None
                if tail and all(p.isdigit() for p in tail):
                    return ("the family %s would have a member printed %s, the name of %s (%s): one name for two "
                            "things; rename one" % (name, other, other, self.declared_at.get(other, "declared")))
        return None

    def _symbol_value(self, kind, name, shape, node: Node):
        if kind == "const" and node.kind == "name" and node.value in ("ones", "identity", "causal"):
            if node.value in ("identity", "causal") and shape[0] != shape[1]:
                raise self.error("%s = %s needs a square shape, not (%s x %s)" % ((name, node.value) + shape), node)
            return node.value
        if kind == "scalar":
            value = as_term(self.evaluate(node, {}), "the value of scalar %s" % name)
            if not value.scalar or value.has_weight:
                raise self.error("the value of scalar %s must be a constant scalar expression" % name, node)
            return value
        raise self.error("a %s can be given the value ones, identity or causal; other values come from "
                         "'values \"file.npz\"' or 'random SEED'" % kind, node)

    def _weight_init(self, name, shape, scalar_weight, node: Node) -> tuple:
        """The initial value of a weight (``Symbol.init``): ``ones``, ``zeros``, ``identity`` (square),
        ``normal(STD)`` or ``normal(MEAN, STD)``, each a constant number."""
        if node.kind == "name" and node.value in ("ones", "zeros", "identity"):
            if node.value == "identity" and (scalar_weight or shape[0] != shape[1]):
                raise self.error("%s = identity needs a square shape, not %s" % (
                    name, "a scalar" if scalar_weight else "(%s x %s)" % shape), node)
            return (node.value,)
        if node.kind == "call" and node.value == "normal" and len(node.args) in (1, 2):
            numbers = [self._init_number(arg) for arg in node.args]
            mean, std = (0.0, numbers[0]) if len(numbers) == 1 else numbers
            if not std >= 0:
                raise self.error("the standard deviation of normal(...) is a number >= 0, not %r" % std,
                                 node.args[-1])
            return ("normal", mean, std)
        raise self.error("a weight's initial value is ones, zeros, identity, normal(STD) or normal(MEAN, STD) "
                         "(normal entries of that mean and standard deviation: normal(0.02)); without one, "
                         "'random SEED' draws normal entries scaled by 1/sqrt(rows), and other values come "
                         "from 'values \"file.npz\"'", node)

    def _init_number(self, node: Node) -> float:
        """A constant number of an initial value (``0.02``, ``1/50``, ``d^(-1/2)``) as a float."""
        try:
            value = self.evaluate(node, {})
        except FdslError:
            value = None
        number = _constant_float(value)
        if number is None:
            raise self.error("the arguments of normal(...) in a declaration are numbers (0.02, 1/50, "
                             "d^(-1/2)), not %s" % (render(value) if value is not None else "this"), node)
        return number

    def _define(self, st: Stmt):
        if st.name in self.symbols or st.name in self.dims or st.name in self.families:
            raise FdslError("%s is already declared (%s); a definition needs a name of its own"
                            % (st.name, self.declared_at[st.name]), self._src[0], st.line, st.col, self._src[1])
        self._check_defined_once(st)
        share.reserve(st.name)
        self._record_source(st)
        if st.params is None:
            value = self.evaluate(st.body, {})
            if st.named:
                value = T.let(st.name, (), as_term(value, "the body of %s" % st.name))
            else:  # where the graph shares this value, it is an intermediate called by this name
                share.hint(value, st.name)
            self.definitions[st.name] = value
            self.clauses.pop(st.name, None)
        else:
            clauses = self.clauses.setdefault(st.name, [])
            clauses.append(Clause(st.name, st.params, st.body, st.named, self._src, st.line))
            self.definitions.pop(st.name, None)
        self._memo.clear()  # a redefinition changes what earlier calls would give

    def _check_defined_once(self, st: Stmt):
        """A definition given twice in one text (a file) is a mistake: the second would silently
        replace the first, and a function clause that repeats an earlier one's pattern would never
        be tried. Across texts (the repl's inputs, -e after a file) a redefinition is allowed and
        noted in ``self.notes``, for the repl to say."""
        pattern = None if st.params is None else _pattern(st.params)
        here = "%s:%d" % (self._src[0], st.line)
        seen = self.defined_at.get(st.name)
        if seen is not None and seen[0] is self._src[1] and seen[1] == self._src[0]:
            earlier = seen[2].get(pattern) if pattern is not None and seen[3] is not None else seen[4]
            if pattern is None or seen[3] is None:  # a value defined twice, or a value and a function
                raise FdslError("%s is defined twice: here and at %s, and the second would replace the first; "
                                "give one of them another name (or delete one)" % (st.name, seen[4]),
                                self._src[0], st.line, st.col, self._src[1])
            if earlier is not None:
                raise FdslError("this clause of %s has the same parameters as the one at %s, which is tried "
                                "first, so this one would never be; delete one of them" % (st.name, earlier),
                                self._src[0], st.line, st.col, self._src[1])
        elif seen is not None:
            if pattern is None or seen[3] is None:
                self.notes.append("%s redefined (it was defined at %s)" % (st.name, seen[4]))
            else:
                self._replace_family(st.name, pattern)
            seen = None
        if seen is None:
            seen = self.defined_at[st.name] = (self._src[1], self._src[0], {}, pattern, here)
        if pattern is not None:
            seen[2].setdefault(pattern, here)

    def _replace_family(self, name: str, pattern: tuple):
        """A clause from a later text (the repl's next input) adds to a function's clauses, so that
        a recursive family can be typed a line at a time; one whose parameters repeat a clause
        already there, or take another number of arguments, would never be tried (issue 31), so it
        starts the definition over: every earlier clause of the family goes, and the repl says so."""
        old = self.clauses.get(name, [])
        if not any(len(c.params) != len(pattern) or _pattern(c.params) == pattern for c in old):
            return
        del self.clauses[name]
        self.sources.pop(name, None)
        # the repl numbers each input's lines from 1, so a count says more than the places
        self.notes.append("%s redefined (%s replaced)" % (
            name, "its earlier clause is" if len(old) == 1 else "all %d of its earlier clauses are" % len(old)))

    def _record_source(self, st: Stmt):
        """Keep a definition's text as written, for the program's display (clauses accumulate;
        a new value definition replaces the old one and moves to the end)."""
        text = self._src[1]
        if self._src_lines[0] is not text:  # split once per text: a program of 100,000 definitions
            self._src_lines = (text, text.splitlines())  # would otherwise split it 100,000 times
        lines = self._src_lines[1][st.line - 1:st.end_line]
        if not lines or not st.end_col:
            return
        lines[-1] = lines[-1][:st.end_col - 1]
        lines[0] = lines[0][st.col - 1:]
        written = "\n".join(line.rstrip() for line in lines)
        clauses = self.sources.pop(st.name, []) if st.params is not None else []
        self.sources[st.name] = clauses + [written]

    # ---- evaluation ---------------------------------------------------------------------------

    def error(self, message: str, node: Node) -> FdslError:
        return FdslError(message, self._src[0], node.line or None, node.col or None, self._src[1])

    def evaluate(self, node: Node, env: dict):
        """The value of an expression node; ShapeErrors become errors at the node they arise in.

        Iterative over the operators (calls, sums, products, -, /, ^t, ^): a program may nest
        them 100,000 deep (m(m(...)), -(-(...))) without reaching Python's recursion limit. Each
        node's operands are evaluated first (a chain a + b - c as one list of operands), then the
        node itself by ``_combine``; the other kinds (names, numbers, strings, x[j], where) by
        ``_eval``."""
        results: dict = {}
        stack = [(node, False)]
        while stack:
            n, ready = stack.pop()
            if n.kind not in _OPERATORS:
                results[id(n)] = self._at(n, self._eval, n, env)
            elif ready:
                values = [results.pop(id(c)) for c in _operands(n)]
                results[id(n)] = self._at(n, self._combine, n, values)
            else:
                stack.append((n, True))
                stack.extend((c, False) for c in reversed(_operands(n)))
        return results[id(node)]

    def _at(self, node: Node, fn, *args):
        """``fn(*args)``, with its errors located at ``node`` unless they know where they are."""
        try:
            return fn(*args)
        except ShapeError as e:
            error = self.error(str(e), node)
            error.notes.extend(self._size_notes(e))
            raise error from None
        except FdslError as e:
            raise e.located(self._src[0], node.line or None, node.col or None, self._src[1])

    def _eval(self, node: Node, env: dict):
        k = node.kind
        if k == "number":
            return node.value
        if k == "string":
            return node.value
        if k == "name":
            return self.lookup(node.value, node, env)
        if k == "index":
            return self._index(node, env)
        if k == "where":
            return self._where(node, env)
        raise AssertionError("unknown node kind %s" % k)

    def _combine(self, node: Node, args: list):
        """The value of an operator node from the values of its operands (``_operands``)."""
        k = node.kind
        if k == "call":
            return self.call(node.value, args, node)
        if k in _CHAINS:
            return self._chain(node, args)
        if all(_is_number(a) for a in args):
            return _arith(k, args, node, self)
        if k == "neg":
            return T.neg(as_term(args[0], "the operand of -"))
        if k == "div":
            a, b = as_term(args[0], "a dividend"), as_term(args[1], "a divisor")
            if T.is_zero(b):
                raise self.error("division by zero", node)
            return T.divide(a, b)
        if k == "transpose":
            return T.transpose(as_term(args[0], "the operand of ^t"))
        if k == "power":
            base, exponent = args
            if not _is_number(exponent):
                raise self.error("an exponent must be a number, not %s" % describe(exponent), node)
            base = as_term(base, "the base of a power")
            if T.is_zero(base) and exponent < 0:
                raise self.error("division by zero: 0 to the power %s" % render(exponent), node)
            return T.power(base, exponent)
        raise AssertionError("unknown node kind %s" % k)

    def _chain(self, node: Node, values: list):
        """``a + b - c``, ``a b c``, ``a * b * c``: the parser nests these in pairs to the left;
        one n-ary term is built from all the operands (``_chain_parts``), without a Python call
        per operand (a printed sum can have thousands of summands) and without interning every
        prefix."""
        kind = _CHAINS[node.kind]
        parts = _chain_parts(node)
        if all(_is_number(v) for v in values):  # numbers stay exact numbers
            total = values[0]
            for (negated, n), v in zip(parts[1:], values[1:]):
                total = total * v if kind != "add" else total - v if negated else total + v
                _check_number(total, n, self)
            return total
        # the numbers among the operands are folded into one coefficient by the term (1e300 1e300 X):
        # checked as they fold, as a product of numbers alone is
        total = None
        for (negated, n), v in zip(parts, values):
            if _is_number(v):
                v = -v if negated else v
                total = v if total is None else total * v if kind != "add" else total + v
                _check_number(total, n, self)
        terms = [as_term(v, "an operand of %s" % _OPNAME["sub" if negated else kind])
                 for (negated, _), v in zip(parts, values)]
        matrix = next((t for t in terms if not t.scalar), None)
        if kind != "mul" and matrix is not None:  # the number 0 is the zero of every shape: A + 0 is A
            terms = [_zero_like(t, matrix) for t in terms]
        if kind == "add":
            terms = [T.neg(t) if negated else t for (negated, _), t in zip(parts, terms)]
        build = {"add": T.add, "mul": T.mul, "hadamard": T.hadamard}[kind]
        try:
            return build(*terms)
        except ShapeError:
            raise self._misfit(build, terms, [n for _, n in parts], kind) from None

    def _misfit(self, build, terms, nodes, kind) -> FdslError:
        """The shape error of a chain, with the caret on the first operand that does not fit
        the ones before it (found by bisection: once a prefix fails, every longer one does)."""
        lo, hi = 1, len(terms)  # the prefix of length lo builds; the one of length hi fails
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                build(*terms[:mid])
                lo = mid
            except ShapeError:
                hi = mid
        try:
            build(*terms[:hi])
            raise AssertionError("a chain that failed to build built")
        except ShapeError as e:
            error = self.error(str(e), nodes[hi - 1])
            error.notes.extend(self._size_notes(e))
        if kind == "hadamard" and _multipliable(terms[:hi]):
            error.notes.append("note: * is the componentwise (Hadamard) product; the matrix product "
                               "is written by juxtaposition: A B")
        return error

    def _size_notes(self, e: ShapeError) -> list:
        """Two sizes that differ as written but have one value (dim d = 3 against 3, or two dims of
        value 3): sizes are matched by what they are called, so say that, and how to write it."""
        if len(e.sizes) != 2:
            return []
        values = [self.dims.get(x) if isinstance(x, str) else x for x in e.sizes]
        if values[0] is None or values[0] != values[1]:
            return []
        a, b = e.sizes
        named = [x for x in e.sizes if isinstance(x, str)]
        if len(named) == 2:
            return ["note: %s and %s are two dims, each declared = %s: sizes match by name, not by value; "
                    "declare both matrices with one of them" % (a, b, values[0])]
        dim, number = named[0], values[0]
        return ["note: %s is the dim declared %s = %s, and %s a number: sizes match as they are written, so "
                "%s and %s differ even though %s = %s; write the dim %s in both declarations (e.g. %s x ..., "
                "not %s x ...)" % (dim, dim, number, number, dim, number, dim, number, dim, dim, number)]

    def lookup(self, name: str, node: Node, env: dict):
        """The value of a name: parameter, definition, symbol, dim, or Q_0 for the family Q."""
        if name in env:
            return env[name]
        if name in self.definitions:
            return self.definitions[name]
        if name in self.symbols:
            return self.symbols[name]
        if name in self.dims:
            return self.dim_term(name)
        m = re.fullmatch(r"(.+?)((?:_\d+)+)", name)
        if m and m.group(1) in self.families:
            idx = tuple(int(i) for i in m.group(2).split("_")[1:])
            return self.family_member(m.group(1), idx, node)
        if name in self.families:
            fam = self.families[name]
            raise self.error("%s is an indexed family: write %s[%s]" % (name, name, ", ".join(fam.indices)), node)
        if name in self.clauses or name in FUNCTIONS or self.operator(name) is not None:
            raise self.error("%s is a function: call it as %s(...)" % (name, name), node)
        raise self.error("unknown name %r%s" % (name, self._suggest(name, env)), node)

    def _suggest(self, name, env=()):
        known = list(env) + list(self.definitions) + list(self.symbols) + list(self.dims) + list(self.families)
        close = close_name(name, known)
        if close:
            return "; did you mean %r?" % close
        keyword = keyword_hint(name)  # sohw E: a misspelt statement keyword reads as a product
        return "; did you mean the keyword %r?" % keyword if keyword else ""

    def dim_term(self, name: str) -> Term:
        return T.sym(Symbol(name, (), "dim", self.dims[name]), (1, 1))

    def dim_arg(self, value):
        """A dim given as an argument (eye(n)): its name, or a whole number."""
        if isinstance(value, Term) and value.op == "sym" and value.data[0].kind == "dim":
            return value.data[0].name
        size = as_int(value, "a size")
        if size < 1:  # as dim n = 0 is refused: numpy has no identity of -1 rows
            raise FdslError("a size is a whole number of at least 1, not %d" % size)
        return size

    def family_member(self, name: str, index: tuple, node: Node) -> Term:
        fam = self.families[name]
        if len(index) != len(fam.indices):
            raise self.error("%s takes %d index%s, not %d" % (name, len(fam.indices),
                                                              "" if len(fam.indices) == 1 else "es", len(index)), node)
        if any(i < 0 for i in index):
            raise self.error("indices are whole numbers, not %s" % ", ".join(map(str, index)), node)
        return T.sym(Symbol(name, index, fam.kind, fam.value, fam.scalar, init=fam.init), fam.shape)

    def _where(self, node: Node, env: dict):
        """``(e where N[i] := b, M = c, ...)``: each binding visible to later ones; ``:=`` makes a named
        intermediate, ``=`` is transparent (its value, as a definition)."""
        body, *bindings = node.args
        env = dict(env)
        for b in bindings:
            name, index, named = b.value
            value = as_term(self.evaluate(b.args[0], env), "the body of %s" % name)
            if named:
                value = T.let(name, index, value)
            env[(name, index) if index else name] = value
        return self.evaluate(body, env)

    def _index(self, node: Node, env: dict):
        base_node, *index_nodes = node.args
        index = [self.evaluate(i, env) for i in index_nodes]
        if base_node.kind == "name" and index and all(_is_number(i) for i in index):
            key = (base_node.value, tuple(as_int(i, "an index") for i in index))
            if key in env:  # a named intermediate of an enclosing where
                return env[key]
        if base_node.kind == "name" and base_node.value in self.families and base_node.value not in env:
            return self.family_member(base_node.value, tuple(as_int(i, "an index") for i in index), node)
        if base_node.kind == "name" and base_node.value in self.symbols and base_node.value not in env:
            # W[1] of a declared symbol: x[j] would be summand j of a sum, and W[0] silently W
            sym = self.symbols[base_node.value]
            kind = sym.data[0].kind if sym.op == "sym" else "const"
            shape = "scalar" if sym.scalar and kind == "weight" else " x ".join(map(str, sym.shape or ("n", "n")))
            raise self.error("%s is not a family (%s): declare %s %s[i] : %s to have %s[0], %s[1], ..."
                             % (base_node.value, self.declared_at.get(base_node.value, "declared"), kind,
                                base_node.value, shape, base_node.value, base_node.value), node)
        base = self.evaluate(base_node, env)
        if len(index) != 1:
            raise self.error("one index selects a summand: x[j]", node)
        j = as_int(index[0], "an index")
        items = _items(base)
        if not -len(items) <= j < len(items):
            raise self.error("index %d is out of range: there %s %d"
                             % (j, "is" if len(items) == 1 else "are", len(items)), node)
        return items[j]

    def call(self, name: str, args: list, node: Node):
        """Apply a definition, a built-in function, an operator, a ruleset, or scale by a symbol."""
        if name in self.clauses:
            return self._call_definition(name, args, node)
        if name in FUNCTIONS:
            f = FUNCTIONS[name]
            if len(args) < f.min_args or (f.max_args is not None and len(args) > f.max_args):
                raise self.error("%s takes %s, not %d: %s"
                                 % (name, _count(f.min_args, f.max_args), len(args), f.signature), node)
            return f.impl(self, *args)
        if self.rulebook is not None and self.rulebook.has_ruleset(name):
            if len(args) != 1:
                raise self.error("ruleset %s takes 1 argument, not %d" % (name, len(args)), node)
            if name in ("normal", "backprop"):
                self._check_scalar_form(name, args[0], node)
            result = self.apply_rules(name, args[0], check=True)  # normal(A W) in a program: say so
            for before in _as_list(args[0]):
                self._check_applies(name, as_term(before, "the argument of %s" % name), node)
            return result
        op = self.operator(name)
        if op is not None and op.kind == "function":
            if len(args) != op.arity:
                raise self.error("%s takes %s, not %d" % (name, _count(op.arity, op.arity), len(args)), node)
            term = T.make(op.name, [as_term(a, "an argument of %s" % name) for a in args])
            self._check_not_one_column(op, term, node)
            return term
        scale = (self.definitions.get(name) or self.symbols.get(name)
                 or (self.dim_term(name) if name in self.dims else None))
        if scale is not None and len(args) == 1:  # s(A + B) is the product s (A + B)
            return T.mul(as_term(scale), as_term(args[0]))
        raise self.error("unknown function %r%s" % (name, self._suggest_function(name)), node)

    def _check_not_one_column(self, op, term: Term, node: Node) -> None:
        """A row-wise operator (softmax, log-softmax, layer norm, row variance) of one column is a
        constant (a(X u) of an n x 1 column is all ones, its gradient 0): never what a program means
        (attention pooling, softmax(scores, dim=0) in PyTorch, is the column-wise one). Refuse it,
        with the transposes that write the column-wise one."""
        if not op.one_column or term.shape is None:
            return
        arg = term.args[0]
        rows, cols = arg.shape
        cols = self.dims.get(cols) if isinstance(cols, str) else cols
        if cols != 1:
            return
        shown, x = op.shown, short(arg, 40)
        message = ("%s of a single column is %s: %s works along each row, and %s is %s, one entry a row"
                   % (shown, op.one_column, shown, x, shape_str(arg.shape)))
        rows = self.dims.get(rows) if isinstance(rows, str) else rows
        if rows != 1:
            message += ("; down the column (as torch's dim=0) it is %s(%s^t)^t"
                        % (shown, x if x.replace("_", "").isalnum() else "(%s)" % x))
        raise self.error(message, node)

    def _check_scalar_form(self, name: str, value, node: Node) -> None:
        """normal(w) of a matrix of forms (w = -d(E), E a matrix) can never be sum_W trace(G_W dW):
        say what w is at the argument, and where a named one was defined."""
        if not (isinstance(value, Term) and value.has_d and not value.scalar):
            return
        from ..calculus.forms import not_a_scalar

        arg = node.args[0] if node.args else node
        error = self.error("%s(...) takes a scalar 1-form: %s" % (name, not_a_scalar(value)), arg)
        seen = self.defined_at.get(arg.value) if arg.kind == "name" else None
        if seen is not None:
            error.notes.append("note: %s is defined at %s" % (arg.value, seen[4]))
        raise error

    def _check_applies(self, name: str, t: Term, node: Node) -> None:
        """A ruleset called on a term none of its rules can match anywhere returns it unchanged,
        which reads as an answer (``transpose(X)`` printing ``X``): say so instead."""
        heads = self.rulebook.heads(name)
        if heads is None or heads & {n.op for n in T.postorder(t, descend=lambda n: not OPS[n.op].opaque)}:
            return
        what = "ruleset" if name in self.rulebook.rulesets else "strategy"
        message = "%s %s cannot apply to %s: none of its rules matches any part of it, so %s(...) would " \
                  "give it back unchanged (fdsl rules lists the rules)" % (what, name, _described(t), name)
        alias = function_hint(name)
        if alias is not None:
            message += "; in fdsl, %s" % alias
        elif "d" in heads and not t.has_d:
            message += "; %s rewrites forms, e.g. %s(form(E))" % (name, name)
        raise self.error(message, node)

    def _suggest_function(self, name):
        alias = function_hint(name)  # softmax, relu, tr: what fdsl calls them
        if alias is not None:
            return "; in fdsl, %s" % alias
        known = list(self.clauses) + list(FUNCTIONS)
        if self.rulebook is not None:
            known += self.rulebook.operator_names() + self.rulebook.ruleset_names()
        close = close_name(name, known)
        return "; did you mean %r?" % close if close else ""

    def _call_limit(self) -> int:
        options = getattr(self, "options", None) or {}  # a Program's: its --step-limit
        return (options.get("step_limit") or DEFAULT_STEP_LIMIT) // CALL_SHARE

    def _call_definition(self, name: str, args: list, node: Node):
        key = (name, tuple(args))
        if key in self._memo:
            return self._memo[key]
        clauses = self.clauses[name]
        arity = len(clauses[0].params)
        if len(args) != arity:
            raise self.error("%s takes %s, not %d" % (name, _count(arity, arity), len(args)), node)
        for clause in clauses:
            env = _bind(clause.params, args)
            if env is not None:
                break
        else:
            raise self.error("no clause of %s matches %s(%s)" % (name, name, ", ".join(render(a) for a in args)), node)
        self._calls = 1 if self._depth == 0 else self._calls + 1
        if self._calls > self._call_limit():
            raise self.error("%s(%s): more than %d calls of definitions to evaluate one (the call limit, a "
                             "fiftieth of the step limit): does a definition call itself more than once, "
                             "expanding exponentially? (--step-limit N raises it)"
                             % (name, ", ".join(_short(a) for a in args), self._call_limit()), node)
        if self._depth >= DEPTH_LIMIT:
            raise self.error("%s(%s) did not reach a base case within %d nested calls (the depth limit): "
                             "does every recursive clause of %s move towards one?"
                             % (name, ", ".join(_short(a) for a in args), DEPTH_LIMIT, name), node)
        saved = self._src
        self._depth += 1
        self._src = clause.source
        try:
            value = self.evaluate(clause.body, env)
        except FdslError as e:
            if len(e.notes) < 4:  # where the failing body was called from, innermost first
                e.notes.append("  in %s(%s), called at %s:%d:%d"
                               % (name, ", ".join(_short(a) for a in args), saved[0], node.line, node.col))
            raise
        except RecursionError:
            # Python's stack ran out before DEPTH_LIMIT (the fdsl command raises the interpreter's
            # limit, a library caller may not have). Note the innermost call, which is the one
            # recursing, and report at the outermost, where there is stack to spare for a message.
            if self._runaway is None:
                self._runaway = (name, args)
            if self._depth > 1:
                raise
            (inner, inner_args), self._runaway = self._runaway, None
            raise self.error("%s(%s) did not reach a base case within Python's recursion limit (%d): does "
                             "every recursive clause of %s move towards one? (if it does, raise the limit "
                             "with sys.setrecursionlimit)" % (inner, ", ".join(_short(a) for a in inner_args),
                                                             sys.getrecursionlimit(), inner), node) from None
        finally:
            self._depth -= 1
            self._src = saved
        if clause.named:
            index = tuple(as_int(a, "an argument of the named definition %s" % name) for a in args)
            value = T.let(name, index, as_term(value, "the body of %s" % name))
        elif args and all(_is_number(a) and a.denominator == 1 and a >= 0 for a in args):
            share.hint(value, name, tuple(int(a) for a in args))  # encoder(3) is encoder_3 where shared
        self._memo[key] = value
        return value

def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _described(t: Term) -> str:
    if t.op == "num":
        return "the number %s" % render(t.data)
    return _short(t)


def _multipliable(terms) -> bool:
    try:
        T.mul(*terms)
        return True
    except ShapeError:
        return False


def _zero_like(t: Term, other: Term) -> Term:
    """``t``, or the zero matrix of ``other``'s shape if ``t`` is the number 0 beside a matrix."""
    return T.zero(other.shape) if t.op == "num" and t.data == 0 and not other.scalar else t


def _constant_float(value) -> Optional[float]:
    """The number a constant scalar value stands for (a Fraction, a number term, a dim's size, and
    powers and products of those), else None."""
    if isinstance(value, (int, Fraction)):
        return float(value)
    if not isinstance(value, Term) or not value.scalar:
        return None
    if value.op == "num":
        return float(value.data)
    if value.op == "sym" and value.data[0].kind == "dim" and isinstance(value.data[0].value, int):
        return float(value.data[0].value)
    if value.op == "pow":
        base = _constant_float(value.args[0])
        return None if base is None or base < 0 else base ** float(value.data)
    if value.op == "mul":
        out = 1.0
        for arg in value.args:
            x = _constant_float(arg)
            if x is None:
                return None
            out *= x
        return out
    return None


def _is_number(v) -> bool:
    return isinstance(v, Fraction)


_OPNAME = {"add": "+", "sub": "-", "mul": "a product", "hadamard": "*"}
_CHAINS = {"add": "add", "sub": "add", "mul": "mul", "hadamard": "hadamard"}  # node kind -> chain kind
_OPERATORS = {"call", "neg", "div", "transpose", "power", *_CHAINS}  # evaluated from their operands


def _chain_parts(node: Node) -> list:
    """(subtracted?, operand node) of a chain a + b - c (nested to the left), left to right."""
    kind = _CHAINS[node.kind]
    kinds = ("add", "sub") if kind == "add" else (kind,)
    parts = []
    while node.kind in kinds:
        parts.append((node.kind == "sub", node.args[1]))
        node = node.args[0]
    parts.append((False, node))
    parts.reverse()
    return parts


def _operands(node: Node) -> list:
    """The nodes whose values ``Elaborator._combine`` takes for an operator node."""
    if node.kind in _CHAINS:
        return [n for _, n in _chain_parts(node)]
    return list(node.args)


def _check_number(value, node, program):
    problem = number_problem(value) if _is_number(value) else None
    if problem:
        raise program.error("this number is %s" % problem, node)
    return value


def _arith(kind, args, node, program):
    return _check_number(_exact(kind, args, node, program), node, program)


def _exact(kind, args, node, program):
    if kind == "add":
        return args[0] + args[1]
    if kind == "sub":
        return args[0] - args[1]
    if kind == "neg":
        return -args[0]
    if kind in ("mul", "hadamard"):
        return args[0] * args[1]
    if kind == "div":
        if args[1] == 0:
            raise program.error("division by zero", node)
        return args[0] / args[1]
    if kind == "power":
        base, exponent = args
        if base == 0 and exponent < 0:
            raise program.error("division by zero: 0 to the power %s" % render(exponent), node)
        if exponent.denominator == 1:
            problem = power_problem(base, int(exponent))
            if problem:
                raise program.error(problem, node)
            return base ** int(exponent)
        return T.power(T.num(base), exponent)
    if kind == "transpose":
        return args[0]
    raise AssertionError(kind)


def _bind(params, args):
    env = {}
    for p, a in zip(params, args):
        if isinstance(p, int):
            if not (_is_number(a) and a == p):
                return None
        else:
            env[p] = a
    return env


def _items(value):
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, Term):
        return list(T.summands(value)) or [value]
    raise FdslError("%s cannot be indexed" % describe(value))


def _count(lo, hi):
    if lo == hi:
        return "%d argument%s" % (lo, "" if lo == 1 else "s")
    if hi is None:
        return "at least %d arguments" % lo
    return "%d to %d arguments" % (lo, hi)


def _short(v):
    s = render(v)
    return s if len(s) < 30 else s[:27] + "..."
