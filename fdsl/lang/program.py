"""Programs: the statement loop over elaboration, the rule book, the effects, and the Python API.

Vocabulary
----------
Program     what ``fdsl.parse``/``fdsl.load`` return: the declared dims and symbols, the
            definitions (their values are terms), the rule book, and the effects (printing,
            files) that ``run`` performs. The CLI and the repl are thin layers over it. What is
            declared and defined, and how an expression gets its value, is its ``Elaborator``
            half (``fdsl.lang.elaborate``); this module feeds it.
statement   one line of a program as parsed (``fdsl.lang.parse.Stmt``): ``dim``, a declaration
            and a definition are elaborated here; every other keyword (``show``, ``rules``...)
            is an entry of ``fdsl.lang.statements``, run with the program.
effect      output of a statement, held back until the whole program has elaborated, so an
            error anywhere means nothing is printed or written ("nothing half-written").

Every definition and statement is evaluated when it is read; building its terms checks shapes,
so a mismatch stops the program before anything else happens.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Optional

from ..base import assembly
from ..base.errors import FdslError
from ..core import normal, share
from ..core import terms as T
from ..core.functions import as_term
from ..core.ops import OPS
from ..core.terms import Term
from .elaborate import Elaborator, Family, _as_list  # noqa: F401  (Family: imported from here by its users)
from .parse import Node, Stmt, parse_program

# Strategies whose result is a normal form sum_W trace(G_W dW), checked before it is used: a stray
# differential (an operator with no d rule or no flip rule) would give wrong coefficients
NORMAL_FORMS = ("normal", "backprop")


class Program(Elaborator):
    """An elaborated fdsl program."""

    def __init__(self, filename: str = "<string>", base_dir: Optional[Path] = None):
        super().__init__(filename)  # the declared names and the definitions: fdsl.lang.elaborate
        self.filename = filename
        self.base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
        self.effects: list = []
        # unchecked: rule files are loaded without the numerical check of their rules (--unchecked)
        self.options = {"trace": False, "step_limit": None, "size_limit": None, "time_limit": None,
                        "unchecked": False}
        self.trace_out = sys.stderr
        self.values = None  # the numpy backend's symbol values, when given
        self.last_shown = None  # the value the last show printed (the repl's _)
        # the program's own definitions (E := ...) whose binding a show has printed: later shows
        # name them only, so a program's output says once what E is, not at every coefficient
        self.bound_shown: set = set()
        self.metric = None  # fdsl.learn.metrics.Metric: what `metric` statements chose (Euclidean if none)
        self.names = share.Names()  # the names this program gives values and declares: its printers'
        assembly.assemble()  # every function and statement of the language, once
        from .rules import RuleBook

        self.rulebook = RuleBook()  # the standard library; `rules "f.rules"` adds to it

    # ---- feeding statements -------------------------------------------------------------------

    @contextmanager
    def active(self):
        """For the block, this program's settings are the current ones: the names its printers use
        (``fdsl.core.share.naming``) and the widest flat term its --size-limit allows
        (``fdsl.core.terms.widest``). Feeding, running and the API's questions are each one block."""
        with share.naming(self.names), T.widest(self.options.get("size_limit")):
            yield

    def feed(self, text: str, filename: Optional[str] = None) -> list:
        """Elaborate more program text; return the effects it produced (not yet performed)."""
        with self.active():
            return self._feed(text, filename)

    def _feed(self, text: str, filename: Optional[str] = None) -> list:
        filename = filename or self.filename
        statements = parse_program(text, filename)
        start = len(self.effects)
        self._src = (filename, text)
        for st in statements:
            try:
                self.statement(st)
            except FdslError as e:
                raise e.located(filename, st.line, st.col, text)
            except MemoryError:
                # the limits (sizes checked before allocating, the size limit, the memory look of
                # fdsl.core.terms) should stop first; this is the last net, a message instead of a traceback
                raise FdslError("out of memory: this statement needs more than the memory there is (lower "
                                "--size-limit N, or the sizes)").located(filename, st.line, st.col, text) from None
            except RecursionError:
                raise FdslError("this statement nests too deeply for Python's recursion limit"
                                ).located(filename, st.line, st.col, text) from None
        return self.effects[start:]

    def statement(self, st: Stmt):
        if st.kind == "dim":
            for name, value, line, col in st.items:
                self._declare_name(name, "dim", line, col)
                self.dims[name] = value
        elif st.kind == "sym":
            self._declare_symbols(st)
        elif st.kind == "define":
            self._define(st)
        else:
            from .statements import STATEMENTS

            STATEMENTS[st.name].run(self, st)

    def describe(self) -> str:
        """The program's declarations and definitions, as text (``print(program)``)."""
        from .listing import describe

        with self.active():
            return describe(self)

    __str__ = describe

    def _repr_html_(self):
        from .listing import describe_html

        with self.active():
            return describe_html(self)

    def diagram(self, expr: str, **options):
        """The picture of an expression of this program (inline in a notebook; see ``fdsl.diagram``)."""
        return assembly.picture("diagram")(self.expr(expr), title=options.pop("title", expr), **options)

    def deps(self, form: str, weight: str, coeff: str):
        """The picture of "does the coefficient of d(coeff) in the form involve weight?" (``fdsl.deps``)."""
        draw = assembly.picture("deps")
        return draw(self.normal_form(as_term(self.expr(form), "the form")), self.expr(weight), self.expr(coeff))

    def normal_form(self, w: Term) -> Term:
        """``w`` as a normal form over weights, ``sum_W trace(G_W d(W))``: as it is when it already
        is one, else through the strategy ``backprop`` (the shared normal form: the numbers of
        ``normal``, linear in depth). The one policy of every command that needs gradients."""
        if normal.is_normal_form(w):
            return w
        with self.active():
            return self.apply_rules("backprop", w)

    # ---- rules -------------------------------------------------------------------------------

    def load_rules(self, path) -> None:
        """Load a rule file into this program's rule book (its rulesets become functions), checked
        numerically unless the option ``unchecked`` is set (``--unchecked``); what the check could
        not hold is said on ``trace_out``."""
        self.rulebook.load(Path(path), checked=not self.options.get("unchecked"))
        for note in self.rulebook.notes:
            self.trace_out.write(note + "\n")
        self._memo.clear()

    def apply_rules(self, name: str, value, check: Optional[bool] = None):
        """Apply a ruleset or strategy by name, with this program's trace and step limit. The
        result of ``normal``/``backprop`` is checked to be a normal form (``check``; by default
        when ``value`` is a 1-form: rewriting any other term with them is the caller's business)."""
        from ..calculus.forms import NotNormal, check_normal, why_not_normal

        options = dict(self.options, trace_out=self.trace_out)
        try:
            with self.active():
                result = self.rulebook.apply(name, value, options)
        except NotNormal as e:  # backprop met a term it cannot read as trace(G dX): say why
            reason = why_not_normal(e.summand)
            if reason is None:
                raise
            raise FdslError("%s(...) did not reach a normal form sum_W trace(G_W dW): %s" % (name, reason)) from None
        if check is None:
            check = all(isinstance(v, Term) and v.scalar and v.has_d for v in _as_list(value))
        if check and name in NORMAL_FORMS:
            for w in _as_list(result):
                check_normal(w, name)
        return result

    def operator(self, name: str):
        """The operator ``name`` stands for in this program (its rule book's), or None."""
        if self.rulebook is not None:
            return self.rulebook.operator(name)
        op = OPS.get(name)
        return op if op is not None and not op.user else None

    def named_terms(self) -> set:
        """The program's own named definitions (E := ...)."""
        return {v for v in self.definitions.values() if isinstance(v, Term) and v.op == "let"}

    # ---- the public API -----------------------------------------------------------------------

    def __getitem__(self, name: str):
        """A definition's value (a term for matrix definitions)."""
        if name in self.definitions:
            return self.definitions[name]
        if name in self.symbols:
            return self.symbols[name]
        raise KeyError(name)

    def expr(self, text: str):
        """Evaluate one expression in this program: ``program.expr("form(encoder(2))")``."""
        statements = parse_program(text, "<expr>")
        if len(statements) != 1 or statements[0].kind != "command" or statements[0].name != "show" \
                or len(statements[0].items) != 1:
            raise FdslError("expected one expression", "<expr>", 1, 1, text)
        self._src = ("<expr>", text)
        with self.active():
            return self.evaluate(statements[0].items[0], {})

    def call_definition(self, name: str, *args):
        """Call a parameterised definition from Python: ``program.call_definition("encoder", 2)``."""
        values = [Fraction(a) if isinstance(a, int) else a for a in args]
        with self.active():
            return self._call_definition(name, values, Node("call", value=name))

    def run(self, out=None) -> None:
        """Perform the effects: print what was shown, write the files that were asked for."""
        from ..base.files import perform_all

        out = out or sys.stdout
        try:
            with self.active():
                perform_all(self.effects, out, self)
        finally:
            self.effects.clear()

    def resolve_path(self, path: str) -> Path:
        """A file the program reads (rules, values): relative names are the program's folder's."""
        p = Path(path)
        return p if p.is_absolute() else self.base_dir / p

    def output_path(self, name: str, line=None, col=None) -> Path:
        """A file the program writes (``save``, ``plot``, ``diagram``): only inside the program's
        folder (``fdsl.base.files.confine``); a path leading out is an error at the statement."""
        from ..base.files import confine

        try:
            return confine(self.base_dir, name, "a program")
        except FdslError as e:
            raise FdslError(e.message, line=line, col=col) from None


def _limits(step_limit, size_limit, time_limit) -> dict:
    """The API's limits, checked as the command line checks its flags (None: the default)."""
    import math

    for name, value in (("step_limit", step_limit), ("size_limit", size_limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise FdslError("%s must be a whole number of at least 1 (as --%s N), not %r"
                            % (name, name.replace("_", "-"), value))
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not (time_limit > 0 and math.isfinite(time_limit))):
        raise FdslError("time_limit must be a positive number of seconds (as --time-limit SECONDS), not %r"
                        % (time_limit,))
    return {"step_limit": step_limit, "size_limit": size_limit, "time_limit": time_limit}


def parse(text: str, filename: str = "<string>", base_dir=None, step_limit=None, size_limit=None,
          time_limit=None, unchecked: bool = False) -> Program:
    """Elaborate program text; its statements' effects wait for ``Program.run``. ``step_limit``,
    ``size_limit``, ``time_limit``: the program's, as ``--step-limit``, ``--size-limit`` and
    ``--time-limit`` give them (None: the defaults of ``fdsl.base.limits``); ``unchecked``: its rule
    files are loaded without the numerical check of their rules, as ``--unchecked``."""
    program = Program(filename, base_dir)
    program.options.update(_limits(step_limit, size_limit, time_limit), unchecked=bool(unchecked))
    program.feed(text, filename)
    return program


def load(path, rules=(), setup=None, step_limit=None, size_limit=None, time_limit=None,
         unchecked: bool = False) -> Program:
    """Read and elaborate a ``.fd`` file, or standard input for ``"-"`` (``rules``: extra rule
    files to load first; ``setup``: called with the program before it runs, e.g. to give it
    values for its ``eval`` statements; ``step_limit``, ``size_limit``, ``unchecked``: as ``parse``'s)."""
    from ..base.inputs import MAX_SOURCE_BYTES, read_source

    if str(path) == "-":  # the usual spelling of standard input; its relative paths are the cwd's
        data = sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1)
        if len(data) > MAX_SOURCE_BYTES:
            raise FdslError("standard input holds more than a program may (%d bytes)" % MAX_SOURCE_BYTES,
                            file="<stdin>")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise FdslError("standard input is not UTF-8 text (byte %d)" % e.start, file="<stdin>") from None
        filename, base_dir = "<stdin>", Path.cwd()
    else:
        path = Path(path)
        text = read_source(path, "file")  # the path leads the message: "x.fd: cannot read this file: ..."
        filename, base_dir = str(path), path.parent
    program = Program(filename, base_dir)
    program.options.update(_limits(step_limit, size_limit, time_limit), unchecked=bool(unchecked))
    for r in rules:
        program.load_rules(r)
    if setup is not None:
        setup(program)
    program.feed(text, filename)
    return program
