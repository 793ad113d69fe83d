"""Rule files: the rule language (grammar/rules.lark), loading, and the checks made on load.

Vocabulary
----------
rule file   a ``.rules`` file: ``import``, ``operator``, ``ruleset``, ``rule`` and ``strategy``
            lines (see grammar/rules.lark and README.md).
ruleset     a named list of rules, callable by its name in programs (``expandAll(x)``): applies
            its rules bottom-up until none applies. ``ruleset R includes S`` adds S's rules to R.
            A ruleset header naming an existing ruleset adds the rules that follow to it, which
            is how a user file teaches ``expandAll`` the derivative of a new operator.
strategy    a named composition of rulesets (``strategy forms = expandAll; expandmm; ...``),
            callable like a ruleset.
RuleBook    every rule, ruleset and strategy a program can use: the standard library
            (stdlib/*.rules), then the files the program loads (``rules "my.rules"``,
            ``fdsl run --rules FILE``).

Checks on load, each an error with file:line:col: syntax, unknown operator, wrong arity, a
variable on the right that the left does not bind, duplicate rule names, a left side that is a
bare variable, a rule whose two sides are the same up to renaming (it cannot terminate), unknown
guard predicates, unknown rulesets in ``includes`` and strategies, and malformed operators.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from lark import v_args
from lark.exceptions import UnexpectedInput, VisitError

from ..base import assembly
from ..base.errors import FdslError
from ..base.inputs import admit, read_source
from ..base.resources import stdlib_dir
from ..calculus.backprop import backprop, normal
from ..calculus.forms import order
from ..core import ops as O
from ..core import terms as T
from ..core.ops import ShapeError
from ..rewrite.engine import PREDICATES, Builtin, Engine, Rule, Strategy
from ..rewrite.patterns import Bag, Exponent, Num, Op, Seq, Var, Word, build, heads, variables
from .hints import one_edit_apart
from .parse import Node, ToAst, _parser, syntax_error


@v_args(meta=True)
class _RuleAst(ToAst):
    """Rule-file parse trees to Nodes: the expression part is fdsl.lark's, imported under the
    ``fdsl__`` namespace, so those names map back onto ToAst's methods."""

    def __getattr__(self, name):
        if name.startswith("fdsl__"):
            return getattr(self, name[len("fdsl__"):])
        raise AttributeError(name)

    def __default__(self, data, children, meta):
        return super().__default__(data.replace("fdsl__", ""), children, meta)

    def var(self, meta, c):
        return self._node("var", meta, value=str(c[0])[1:])

    def seqvar(self, meta, c):
        return self._node("seqvar", meta, value=str(c[0])[1:-3])

    def _item(self, kind, meta, **kw):
        return dict(kind=kind, line=meta.line, col=meta.column, **kw)

    def import_file(self, meta, c):
        return self._item("import", meta, path=str(c[0])[1:-1])

    def ruleset(self, meta, c):
        excepts = c[-1] if c and isinstance(c[-1], list) else []
        names = c[1:-1] if excepts else c[1:]
        return self._item("ruleset", meta, name=str(c[0]), includes=[str(x) for x in names], excepts=excepts)

    def excepts(self, meta, c):
        return [str(x) for x in c]

    def rule(self, meta, c):
        name, lhs, rhs, *guards = c
        return self._item("rule", meta, name=str(name), lhs=lhs, rhs=rhs, guards=guards)

    def guard(self, meta, c):
        negated = len(c) == 2
        call = c[-1]
        return (negated, call.value, call.args, meta.line, meta.column)

    def strategy(self, meta, c):
        return self._item("strategy", meta, name=str(c[0]), steps=list(c[1:]))

    def step_name(self, meta, c):
        return ("name", str(c[0]))

    def step_call(self, meta, c):
        return (str(c[0])[:-1], c[1])

    def operator(self, meta, c):
        head, *rest = c
        params = [str(x) for x in rest if not isinstance(x, tuple)]
        options = [x for x in rest if isinstance(x, tuple)]
        return self._item("operator", meta, name=str(head)[:-1], params=params, options=options)

    def op_numpy(self, meta, c):
        return ("numpy", (str(c[0]), meta.line, meta.column))

    def op_numpy_template(self, meta, c):
        # the old syntax ran its text as Python; rule files are data, so it is refused here
        template = str(c[0])[1:-1]
        known = re.fullmatch(r"\s*(?:np|numpy)\.(\w+)\(\s*\{0\}\s*\)\s*", template)
        name = known.group(1) if known and known.group(1) in O.NUMPY_FUNCTIONS else None
        raise FdslError("numpy \"TEMPLATE\" is Python text, and fdsl runs none from rule files: %s"
                        % ("write numpy %s" % name if name else
                           "name a numpy function (numpy tanh; one of %s) or give the operator's value "
                           "as an fdsl expression over its arguments (operator f(A, B) = B - tanh(A) * B)"
                           % ", ".join(sorted(O.NUMPY_FUNCTIONS))), line=meta.line, col=meta.column)

    def op_body(self, meta, c):
        return ("body", c[0])

    def op_latex(self, meta, c):
        return ("latex", str(c[0])[1:-1])

    def op_doc(self, meta, c):
        return ("doc", str(c[0])[1:-1])

    def op_linear(self, meta, c):
        return ("linear", [str(x) for x in c])

    def op_domain(self, meta, c):
        return ("positive", [str(x) for x in c])

    def start(self, meta, c):
        return list(c)


def parse_rule_file(text: str, filename: str) -> list:
    """The items of a rule file, or an FdslError with file:line:col."""
    text = text.removeprefix("\ufeff")
    if not text.endswith("\n"):
        text += "\n"
    try:
        return _RuleAst().transform(_parser("rules.lark").parse(text))
    except UnexpectedInput as e:
        raise syntax_error(e, text, filename, "rules.lark") from None
    except VisitError as e:
        if isinstance(e.orig_exc, FdslError):
            raise e.orig_exc.located(filename, e.orig_exc.line, e.orig_exc.col, text) from None
        raise


# ---- AST to patterns -----------------------------------------------------------------------------


class _Compiler:
    """Turns the expression Nodes of a rule into patterns, checking operators and arities."""

    def __init__(self, err, operator, params=None):
        self.err = err  # err(message, node) -> FdslError
        self.operator = operator  # name -> the Op it stands for in this rule book, or None
        self.params = params  # an operator's body: its argument names, which stand as variables

    def __call__(self, n: Node):
        k = n.kind
        if k in ("var", "seqvar") and self.params is not None:
            raise self.err("in an operator's value, arguments are written by name (%s), not as ?%s"
                           % (n.value, n.value), n)
        if k == "var":
            return Var(n.value)
        if k == "seqvar":
            return Seq(n.value)
        if k == "number":
            return Num(n.value)
        if k == "name" and self.params is not None:
            if n.value not in self.params:
                raise self.err("%r in the value of an operator: it may use only its arguments (%s)"
                               % (n.value, ", ".join(self.params)), n)
            return Var(n.value)
        if k == "name":
            raise self.err("%r in a rule: pattern variables start with ? (write ?%s)" % (n.value, n.value), n)
        if k == "string":
            raise self.err("a string cannot stand in a rule", n)
        if k == "call":
            op = self.operator(n.value)
            if op is None or op.arity is None or n.value in ("sym", "num", "zero", "eye", "ones"):
                raise self.err("unknown operator %r (declare it in a rule file: operator %s(A) numpy NAME, "
                               "or operator %s(A) = EXPR)" % (n.value, n.value, n.value), n)
            if op.arity != len(n.args):
                raise self.err("%s takes %d argument%s, not %d" % (n.value, op.arity, "" if op.arity == 1 else "s",
                                                                   len(n.args)), n)
            return Op(op.name, tuple(self(a) for a in n.args))
        if k == "transpose":
            return Op("t", (self(n.args[0]),))
        if k == "power":
            base, e = n.args
            return Op("pow", (self(base),), self._number(e))
        if k == "div":
            if n.args[1].kind == "number":  # ?A / 2: a scalar multiple
                return Word(self._flat("mul", n.args[:1]) + (Op("pow", (self(n.args[1]),), Fraction(-1)),))
            return Op("div", (self(n.args[0]), self(n.args[1])))
        if k == "mul":
            return Word(self._flat("mul", n.args))
        if k == "neg":
            return Word((Num(Fraction(-1)),) + self._flat("mul", n.args))
        if k == "add":
            return Bag("add", self._flat("add", n.args))
        if k == "sub":
            neg = Node("neg", (n.args[1],), None, n.line, n.col)
            return Bag("add", self._flat("add", (n.args[0], neg)))
        if k == "hadamard":
            return Bag("had", self._flat("hadamard", n.args))
        if k == "index":
            raise self.err("indexing x[j] cannot stand in a rule", n)
        raise self.err("%s cannot stand in a rule" % k, n)

    def _number(self, e: Node):
        """An exponent: a number, or -, / of numbers (?A^(-1/2)); or an exponent variable, ?p, which
        binds the exponent of a power (?a^(?p)), shifted by a number on a right side (?a^(?p - 1))."""
        if e.kind == "var" and self.params is None:
            return Exponent(e.value)
        if e.kind in ("add", "sub") and e.args[0].kind == "var" and self.params is None:
            shift = self._number(e.args[1])
            if isinstance(shift, Exponent):
                raise self.err("an exponent is ?p plus or minus a number", e)
            return Exponent(e.args[0].value, shift if e.kind == "add" else -shift)
        if e.kind == "number":
            return Fraction(e.value)
        if e.kind == "neg":
            return -self._number(e.args[0])
        if e.kind == "div":
            a, b = self._number(e.args[0]), self._number(e.args[1])
            if b == 0:
                raise self.err("division by zero in an exponent", e)
            return a / b
        raise self.err("an exponent in a rule must be a number", e)

    def _flat(self, kind, nodes):
        out = []
        for a in nodes:
            if a.kind == kind or (kind == "add" and a.kind == "sub"):
                sub = self(a)
                out.extend(sub.items)
            else:
                out.append(self(a))
        return tuple(out)


def _canonical(p, names: dict) -> str:
    """The pattern with variables renamed in order of appearance: equal strings are the same
    pattern up to renaming."""
    if isinstance(p, (Var, Seq)):
        names.setdefault(p.name, "v%d" % len(names))
        return names[p.name] + ("..." if isinstance(p, Seq) else "")
    if isinstance(p, Num):
        return str(p.value)
    if isinstance(p, Op):
        return "%s[%s](%s)" % (p.op, p.data, ",".join(_canonical(a, names) for a in p.args))
    if isinstance(p, Word):
        return "mul(%s)" % ",".join(_canonical(a, names) for a in p.items)
    if isinstance(p, Bag):
        return "%s(%s)" % (p.op, ",".join(_canonical(a, names) for a in p.items))
    raise TypeError(p)


def _seqs_placed_well(p, top=True) -> bool:
    """Runs ?A... stand only as elements of a product or sum on a left side."""
    if isinstance(p, Seq):
        return False
    if isinstance(p, Op):
        return all(_seqs_placed_well(a) for a in p.args)
    if isinstance(p, (Word, Bag)):
        return all(isinstance(a, Seq) or _seqs_placed_well(a) for a in p.items)
    return True


def _bags_ok(p) -> bool:
    if isinstance(p, Bag) and sum(isinstance(a, Seq) for a in p.items) > 1:
        return False
    kids = p.args if isinstance(p, Op) else p.items if isinstance(p, (Word, Bag)) else ()
    return all(_bags_ok(k) for k in kids)


# ---- the rule book -------------------------------------------------------------------------------


@dataclass
class Ruleset:
    name: str
    rules: list = field(default_factory=list)
    includes: list = field(default_factory=list)
    excepts: list = field(default_factory=list)  # included rulesets whose rules are left out
    file: str = ""
    line: int = 0


_PARSED: dict = {}  # path -> (text, items): the stdlib is parsed once per process
# Imports nested deeper than this are refused: a chain of 20,000 files importing the next would
# otherwise recurse once per file (past Python's stack) and compare each with all the ones above it.
IMPORT_DEPTH = 100


# The strategies written in Python that rule files may name, as a table the rule book is handed.
BUILTIN_STRATEGIES = {
    "order": Builtin(order, "sort the summands by the weight of their differential (stable)"),
    "backprop": Builtin(backprop, "the shared (reverse-mode) normal form: named adjoints G_i, each layer "
                        "expanded once"),
    "normal": Builtin(normal, "the normal form sum_W trace(G_W dW): shared (backprop) when the term has "
                      "intermediates, named or found, else the expanded one"),
}


class RuleBook:
    """Every ruleset and strategy available to a program, and the engine that runs them."""

    def __init__(self, stdlib: bool = True):
        self.rulesets: dict[str, Ruleset] = {}
        self.strategies: dict[str, Strategy] = {}
        self.rule_names: dict[tuple, Rule] = {}  # (ruleset, rule name) -> rule
        self.files: list[str] = []
        # the user operators this book's files declare: name -> key in fdsl.core.ops.OPS (the
        # process's table holds every book's; a name means what this book declared it to)
        self.operators: dict[str, str] = {}
        self.builtins = BUILTIN_STRATEGIES  # the strategies written in Python, by name
        self.engine = Engine(self)
        # the digest of every user file this book has loaded, in order (the stdlib's excluded): what a
        # soundness check of the next file is keyed by, since a file may use an earlier one's operators
        self.digest = hashlib.sha256()
        self._texts: dict = {}  # shown path -> text of the user files the current load reads
        if stdlib:  # (the stdlib is sound: tests/test_rules_check.py holds every rule of it)
            self.load(*sorted(stdlib_dir().glob("*.rules")), checked=False)

    # ---- loading

    def load(self, *paths, checked: bool = True) -> None:
        """Load rule files (and what they import); all of them or, on an error, none of them.
        ``checked``: hold each new rule of a user's file numerically, as ``fdsl rules --check`` does
        (``fdsl.verify.check.check_loaded``), and refuse the files at the first unsound rule;
        False (``--unchecked``) skips that knowingly."""
        # what to go back to if a file fails (rulesets are copied: loading appends to them)
        snapshot = ({k: Ruleset(v.name, list(v.rules), list(v.includes), list(v.excepts), v.file, v.line)
                     for k, v in self.rulesets.items()},
                    dict(self.strategies), dict(self.rule_names), list(self.files), dict(self.operators),
                    self.digest.copy())
        before = set(self.rule_names)
        self._texts = {}
        self.notes = []  # what the last load has to say (rules it did not check): Program prints them
        try:
            for path in paths:
                self._load(Path(path), importer=None)
            self._check_references()
            new = [r for k, r in self.rule_names.items() if k not in before]
            if checked and new and self._texts:
                self._check_soundness(new)
        except FdslError:
            # (operators the failed files registered stay in the process's table, unused by this
            # book: a term may already hold them, and the same declaration again reuses them)
            (self.rulesets, self.strategies, self.rule_names, self.files, self.operators,
             self.digest) = snapshot
            raise
        finally:
            self._texts = {}
            self.engine.reset()

    def _check_soundness(self, rules) -> None:
        """Hold the newly loaded rules numerically (a note for those beyond the checker's bound);
        an unsound one is an error at its line, with the source of its file."""
        check = assembly.rule_checker()
        if check is None:  # a rule book used without the composition root: nothing to check with
            return
        try:
            note = check(rules, self.digest.hexdigest())
        except FdslError as e:
            text = self._texts.get(e.file)
            if text is not None and e.line is not None:
                e.source = text
            raise
        if note:
            self.notes.append(note)

    def _load(self, path: Path, importer, chain=()):
        admit(path, "rule file")  # before resolve() looks at it: the confinement's answer comes first
        resolved = str(path.resolve())
        if resolved in [r for r, _ in chain]:  # chain: (file, shown as) whose imports are loading
            return resolved
        if resolved in self.files:
            return None
        text = read_source(path, "rule file")
        if not _in_stdlib(path):
            self.digest.update(hashlib.sha256(text.encode()).digest())
            self._texts[_display_path(path)] = text
        self.files.append(resolved)
        # keyed by the text, not the time of change: a file replaced by another with the same time
        # (tar x, cp -p, rsync -t) is parsed afresh; the same text under its name is not
        cached = _PARSED.get(resolved)
        if cached is None or cached[0] != text:
            cached = _PARSED[resolved] = (text, parse_rule_file(text, str(path)))
        items = cached[1]
        current = None
        display = _display_path(path)
        lines = text.splitlines()  # once per file: a rule's source line is looked up, not split for

        def err(message, node_or_item):
            line = getattr(node_or_item, "line", None) or (node_or_item.get("line") if isinstance(node_or_item, dict)
                                                           else None)
            col = getattr(node_or_item, "col", None) or (node_or_item.get("col") if isinstance(node_or_item, dict)
                                                         else None)
            return FdslError(message, display, line, col, text)

        err.display = display
        for item in items:
            kind = item["kind"]
            if kind == "import":
                if len(chain) + 1 >= IMPORT_DEPTH:  # checked before the file is looked for, let alone read
                    raise err("cannot import %r: rule files import each other more than %d deep (the import "
                              "depth limit), starting at %s" % (item["path"], IMPORT_DEPTH,
                                                                (chain[0][1] if chain else display)), item)
                try:
                    target = self._resolve_import(item["path"], path)
                except FdslError as e:  # a name the confinement refuses (fdsl serve): said at the import
                    raise err("cannot import %r: %s" % (item["path"], e.message), item) from None
                if target is None:
                    raise err("cannot import %r: no such rule file (relative to %s, or in the stdlib)"
                              % (item["path"], path.parent), item)
                here = chain + ((resolved, display),)
                try:
                    cycle = self._load(target, importer=path, chain=here)
                except FdslError as e:
                    if e.line is not None:
                        raise
                    # a file that cannot be read is an error of the import that names it
                    raise err("%s: %s" % (item["path"], e.message), item) from None
                if cycle is not None:
                    start = [r for r, _ in here].index(cycle)
                    names = [shown for _, shown in here[start:]] + [item["path"]]
                    raise err("import cycle: %s: rule files may not import each other in a circle"
                              % " imports ".join(names), item)
            elif kind == "operator":
                self._declare_operator(item, err)
            elif kind == "ruleset":
                name = item["name"]
                self._check_free_name(name, "ruleset", err, item)
                if name not in self.rulesets:
                    self._check_not_a_misspelling(name, "ruleset", err, item)
                if name in self.strategies:
                    raise err("%s is already a strategy (%s:%d)" % (name, self.strategies[name].file,
                                                                    self.strategies[name].line), item)
                current = self.rulesets.setdefault(name, Ruleset(name, file=display, line=item["line"]))
                # (a set of what is there: a header may name 20,000 rulesets)
                for names, there in ((item["includes"], current.includes), (item["excepts"], current.excepts)):
                    seen = set(there)
                    for x in names:
                        if x not in seen:
                            seen.add(x)
                            there.append(x)
            elif kind == "rule":
                if current is None:
                    raise err("rule %s stands outside a ruleset: start one with 'ruleset NAME'" % item["name"], item)
                current.rules.append(self._compile_rule(item, current.name, display, err, lines))
            elif kind == "strategy":
                name = item["name"]
                self._check_free_name(name, "strategy", err, item)
                if name not in self.rulesets and name not in self.strategies:
                    self._check_not_a_misspelling(name, "strategy", err, item)
                if name in self.rulesets or name in self.strategies:
                    raise err("%s is already defined" % name, item)
                self.strategies[name] = Strategy(name, [self._step(s) for s in item["steps"]], display, item["line"])
                self.strategies[name].item = item
                self.strategies[name].err = err

    def _resolve_import(self, name: str, importer: Path):
        candidates = [importer.parent / name, importer.parent / (name + ".rules"),
                      stdlib_dir() / name, stdlib_dir() / (name + ".rules")]
        for c in candidates:
            admit(c, "rule file")  # is_file() would tell a refused path's existence
            if c.is_file():
                return c
        return None

    def _check_free_name(self, name, what, err, item):
        from ..core.functions import FUNCTIONS

        op = self.operator(name)
        if op is not None or name in FUNCTIONS:
            raise err("%s %s would hide the %s %s"
                      % (what, name, "operator" if op is not None else "function", name), item)

    def _check_not_a_misspelling(self, name, what, err, item):
        """A new ruleset or strategy whose name is one letter or only case away from an existing
        one is almost surely meant to be that one (``ruleset expandall`` to extend ``expandAll``):
        as a new, empty ruleset it would silently change nothing. Refuse it, naming the other."""
        spelling = getattr(self, "_spelling", None)
        if spelling is None or spelling.rulesets is not self.rulesets or spelling.strategies is not self.strategies:
            # (re)built when the tables were replaced (a failed load restores them), else grown by one
            # name per check: a file of 20,000 rulesets is checked in linear time, not pairwise
            spelling = self._spelling = _Spelling(self.rulesets, self.strategies)
        rank = lambda other: (0 if other in self.rulesets else 1 if other in self.strategies else 2)
        candidates = sorted((other for other in spelling.near(name)
                             if other in self.rulesets or other in self.strategies or other in BUILTIN_STRATEGIES),
                            key=lambda other: (rank(other), spelling.order[other]))
        spelling.add(name)  # the caller declares it next (or fails, and the tables are restored)
        for other in candidates:
            if other.lower() == name.lower() or one_edit_apart(other, name):
                kind = "ruleset" if other in self.rulesets else "strategy"
                if what == kind == "ruleset":
                    raise err("ruleset %s would be a new, empty ruleset, but there is a ruleset %s: to add "
                              "rules to it write ruleset %s (names are case-sensitive); for a new ruleset, "
                              "choose a name further from %s" % (name, other, other, other), item)
                raise err("%s %s is one letter or only case away from the %s %s: did you mean %s? For a "
                          "new %s, choose a name further from %s" % (what, name, kind, other, other, what, other),
                          item)

    def _step(self, s):
        # Combinators nest without bound in a rule file (fixpoint(...) 12,000 deep): unwrapped by a
        # loop, not recursion, and the ones that change nothing nested are dropped: bottomup(x) runs
        # x, and fixpoint(fixpoint(x)) is fixpoint(x) (the outer one's second run of the inner finds
        # nothing to do). Nested fixpoints cost the square of their depth to confirm, else.
        kinds = []
        while s[0] != "name":
            kinds.append(s[0])
            s = s[1]
        x = s[1]
        step = ("builtin", x) if x in BUILTIN_STRATEGIES else ("named", x)  # named: see _check_references
        for i in range(len(kinds) - 1, -1, -1):
            kind, outer = kinds[i], kinds[i - 1] if i else None
            if (kind == "bottomup" and outer not in ("topdown", "once")) or kind == step[0] == "fixpoint":
                continue  # (topdown(bottomup(r)) is kept, to be refused: topdown takes a ruleset)
            step = (kind, step)
        return step

    def _declare_operator(self, item, err):
        name, params = item["name"], item["params"]
        existing = self.operator(name)
        if existing is not None and not existing.user:
            raise err("operator %s is built in" % name, item)
        if len(set(params)) != len(params):
            raise err("operator %s names an argument twice" % name, item)
        opts = {"numpy": None, "linear": [], "latex": None, "doc": "", "body": None, "positive": []}
        for key, value in item["options"]:
            opts[key] = value
        for lin in opts["linear"]:
            if lin not in params:
                raise err("operator %s has no argument %s to be linear in" % (name, lin), item)
        for arg in opts["positive"]:
            if arg not in params:
                raise err("operator %s has no argument %s to have a domain" % (name, arg), item)
        positive = {params.index(a) for a in opts["positive"]}
        template = None
        if opts["numpy"] is not None and opts["body"] is not None:
            raise err("operator %s has both a numpy function and a value: give one" % name, item)
        if opts["numpy"] is not None:
            fn, line, col = opts["numpy"]
            where = {"line": line, "col": col}
            if fn not in O.NUMPY_FUNCTIONS:
                raise err("no numpy function %r in fdsl's table; the table has %s (or give the value "
                          "as an fdsl expression: operator %s(...) = EXPR)"
                          % (fn, ", ".join(sorted(O.NUMPY_FUNCTIONS)), name), where)
            arity, template = O.NUMPY_FUNCTIONS[fn]
            positive |= set(O.NUMPY_POSITIVE.get(fn, ()))  # numpy log: positive entries, as built-in log
            if arity != len(params):
                raise err("numpy %s takes %d argument%s, but %s has %d" % (
                    fn, arity, "" if arity == 1 else "s", name, len(params)), where)
        elementwise = True  # a numpy function of the table is; a body is if all it uses is
        if opts["body"] is not None:
            template, elementwise = _body_template(name, params, opts["body"], err, self.operator)
        op = O.Op(name, len(params), O.same_shape_args(name), linear=tuple(params.index(l) for l in opts["linear"]),
                  numpy=template, latex=_latex_head(opts["latex"]), doc=opts["doc"] or "user operator %s" % name,
                  user=True, elementwise=elementwise, params=tuple(params), positive=tuple(sorted(positive)),
                  where="%s:%d" % (err.display, item["line"]))
        # A name means one operator in a rule book: a second declaration with another meaning would
        # change the values of the terms this program already built with the first, so it is refused.
        # The same declaration again (two rule files importing a third) is the same operator. Another
        # program's rule book may give the name another meaning: its operator has its own key.
        if existing is not None and existing.meaning() != op.meaning():
            raise err("operator %s is already defined, differently, at %s; an operator keeps its first "
                      "meaning in a program: give this one another name" % (name, existing.where), item)
        if existing is None:
            self.operators[name] = O.user_operator(op).name

    def operator(self, name: str):
        """The operator ``name`` stands for in this rule book (an ``fdsl.core.ops.Op``), or None:
        a built-in one, or a user operator this book's files declared."""
        key = self.operators.get(name)
        if key is not None:
            return O.OPS[key]
        op = O.OPS.get(name)
        return op if op is not None and not op.user else None

    def operator_names(self) -> list:
        """The names of the function-style operators of this book, built in and declared."""
        return [n for n, op in O.OPS.items() if op.kind == "function" and not op.user] + list(self.operators)

    def _compile_rule(self, item, ruleset, display, err, lines) -> Rule:
        name = item["name"]
        if (ruleset, name) in self.rule_names:
            first = self.rule_names[(ruleset, name)]
            raise err("duplicate rule name %s in ruleset %s (first at %s)" % (name, ruleset, first.where()), item)
        for side in (item["lhs"], item["rhs"]):
            _check_depth(side, "rule %s" % name, err)
        compile_ = _Compiler(err, self.operator)
        lhs, rhs = compile_(item["lhs"]), compile_(item["rhs"])
        if isinstance(lhs, (Var, Seq)):
            raise err("the left side of %s is a bare variable: it would match every term" % name, item)
        if not _seqs_placed_well(lhs):
            raise err("in %s, a run ?A... on the left must stand in a product or a sum" % name, item)
        if not _bags_ok(lhs):
            raise err("in %s, a sum on the left has two runs ?A...: sums are commutative, so one run "
                      "collects the rest" % name, item)
        if any(isinstance(q.data, Exponent) and q.data.offset for q in _ops(lhs)):
            raise err("in %s, an exponent on the left is a number or ?p, which binds it; ?p - 1 is for the "
                      "right side" % name, item)
        bound = variables(lhs)
        bound_names = {n: k for n, k in bound}
        for n, k in variables(rhs):
            if n not in bound_names:
                raise err("in %s, %s on the right is not bound by the left side"
                          % (name, "?" + n + ("..." if k is Seq else "")), item)
            if bound_names[n] is not k:
                raise err("in %s, ?%s is %s on the left but %s on the right" % (
                    name, n, "a run ?%s..." % n if bound_names[n] is Seq else "one term ?%s" % n,
                    "a run" if k is Seq else "one term"), item)
        if _canonical(lhs, {}) == _canonical(rhs, {}):
            raise err("the two sides of %s are the same up to renaming: it would rewrite forever" % name, item)
        guards = []
        for negated, pred, args, line, col in item["guards"]:
            if pred not in PREDICATES:
                raise FdslError("unknown predicate %r in a guard of %s; the predicates are: %s"
                                % (pred, name, ", ".join(sorted(PREDICATES))), display, line, col)
            gargs = tuple(compile_(a) for a in args)
            for n, k in set().union(*(variables(a) for a in gargs)) if gargs else ():
                if n not in bound_names:
                    raise FdslError("in a guard of %s, ?%s is not bound by the left side" % (name, n),
                                    display, line, col)
            if len(gargs) != 1:
                raise FdslError("predicate %s takes one argument" % pred, display, line, col)
            guards.append((negated, pred, gargs[0]))
        source = " ".join(lines[item["line"] - 1].split())
        rule = Rule(name, lhs, rhs, tuple(guards), display, item["line"], ruleset, source, item.get("col") or 0)
        self.rule_names[(ruleset, name)] = rule
        return rule

    def _check_references(self):
        for rs in self.rulesets.values():
            for inc in rs.includes + rs.excepts:
                if inc not in self.rulesets:
                    raise FdslError("ruleset %s %s %s, which is not a ruleset"
                                    % (rs.name, "includes" if inc in rs.includes else "leaves out", inc),
                                    rs.file, rs.line)
        for st in self.strategies.values():
            st.steps = [self._resolve_step(s, st) for s in st.steps]

    def _resolve_step(self, s, st):
        kind, x = s
        if kind == "named":
            if x in self.rulesets:
                return ("ruleset", x)
            if x in self.strategies:
                if x == st.name:
                    raise st.err("strategy %s uses itself" % x, st.item)
                return ("strategy", x)
            raise st.err("strategy %s uses %s, which is not a ruleset, strategy or built-in strategy (%s)"
                         % (st.name, x, ", ".join(sorted(BUILTIN_STRATEGIES))), st.item)
        if kind in ("ruleset", "strategy", "builtin"):
            return s
        return (kind, self._resolve_step(x, st))

    # ---- queries

    def rules_of(self, name: str) -> list:
        """The rules of a ruleset with those of the rulesets it includes, in order, each once,
        leaving out the rulesets it excepts (and what only they include)."""
        out, seen, stack = [], set(self.rulesets[name].excepts), [name]
        order = []
        while stack:  # depth-first over includes, own rules first
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            order.append(n)
            stack.extend(reversed(self.rulesets[n].includes))
        for n in order:
            out.extend(self.rulesets[n].rules)
        return out

    def step_of(self, name: str):
        if name in self.rulesets:
            return ("ruleset", name)
        if name in self.strategies:
            return ("strategy", name)
        return ("builtin", name)

    def heads(self, name: str):
        """The operators at the root of a left side of some rule that the ruleset or strategy
        ``name`` can apply, or None when one of its rules or built-in steps can apply anywhere.
        A term with none of these operators anywhere is left as it is."""
        out, seen, stack = set(), set(), [self.step_of(name)]
        while stack:
            kind, x = stack.pop()
            if kind == "builtin":
                return None
            if kind in ("topdown", "bottomup", "once", "fixpoint"):
                stack.append(x)
            elif (kind, x) not in seen:
                seen.add((kind, x))
                if kind == "strategy":
                    stack.extend(self.strategies[x].steps)
                else:
                    for rule in self.rules_of(x):
                        hs = heads(rule.lhs)
                        if hs is None:
                            return None
                        out |= hs
        return out

    def has_ruleset(self, name: str) -> bool:
        return name in self.rulesets or name in self.strategies or name in BUILTIN_STRATEGIES

    def ruleset_names(self) -> list:
        return sorted(self.rulesets) + sorted(set(self.strategies) | set(BUILTIN_STRATEGIES))

    def describe(self, name: str) -> str:
        """A ruleset's or strategy's rules as text, for ``:rules NAME`` in the repl."""
        if name in self.strategies:
            return str(self.strategies[name])
        if name in BUILTIN_STRATEGIES:
            return "strategy %s (built in): %s" % (name, BUILTIN_STRATEGIES[name].doc)
        rs = self.rulesets[name]
        lines = ["ruleset %s%s%s  (%s:%d)" % (name, " includes " + ", ".join(rs.includes) if rs.includes else "",
                                             " except " + ", ".join(rs.excepts) if rs.excepts else "",
                                             rs.file, rs.line)]
        lines += ["  %s  (%s)" % (r, r.where()) for r in rs.rules]
        return "\n".join(lines)

    def apply(self, name: str, value, options: dict):
        """Apply a ruleset or strategy to a term (or to each term of a list)."""
        from ..core.functions import as_term

        if isinstance(value, list):
            return [self.apply(name, v, options) for v in value]
        return self.engine.run(name, as_term(value, "the argument of %s" % name), options)


class _Spelling:
    """An index of ruleset and strategy names by their one-edit neighbours: the names one letter
    (or only case) away from a name are found by a few dictionary look-ups, not by comparing it
    with every name. Keys: the name lowercased; the name itself; the name less one letter; and the
    name less its i-th letter with i (a changed letter)."""

    def __init__(self, rulesets, strategies):
        self.rulesets, self.strategies = rulesets, strategies
        self.keys: dict = {}
        self.order: dict = {}
        for name in list(rulesets) + list(strategies) + list(BUILTIN_STRATEGIES):
            self.add(name)

    def add(self, name: str) -> None:
        if name in self.order:
            return
        self.order[name] = len(self.order)
        for key in [("lower", name.lower()), ("self", name)] + [k for i in range(len(name)) for k in (
                ("less", name[:i] + name[i + 1:]), ("changed", i, name[:i] + name[i + 1:]))]:
            self.keys.setdefault(key, []).append(name)

    def near(self, name: str) -> set:
        keys = [("lower", name.lower()), ("less", name)] + [k for i in range(len(name)) for k in (
            ("self", name[:i] + name[i + 1:]), ("changed", i, name[:i] + name[i + 1:]))]
        return {other for key in keys for other in self.keys.get(key, ()) if other != name}


# Patterns are compiled and matched by recursion over their (small) trees: a rule or an operator's
# value nested deeper than this is refused when it is read, rather than failing when it is used.
MAX_PATTERN_DEPTH = 1_000


def _check_depth(node: Node, what: str, err) -> None:
    """Refuse a rule side or operator value nested deeper than MAX_PATTERN_DEPTH (measured without
    recursion, so the check itself cannot fail at depth)."""
    stack = [(node, 1)]
    while stack:
        n, depth = stack.pop()
        if depth > MAX_PATTERN_DEPTH:
            raise err("%s nests more than %d levels deep: rule files are read and matched by recursion, "
                      "so their patterns stay shallower (programs may nest as deep as they like)"
                      % (what, MAX_PATTERN_DEPTH), node)
        stack.extend((a, depth + 1) for a in n.args if isinstance(a, Node))


# ---- operators defined by an expression ------------------------------------------------------------

# A composed template longer than this is refused: each use of an operator in a value copies its
# template, so a chain of operators that each use the previous one twice doubles at every link.
_MAX_TEMPLATE = 20_000


def _body_template(name, params, body: Node, err, operator) -> tuple:
    """(the numpy template of ``operator name(params) = body``, whether it acts entry by entry):
    the template composed from those of the operators the body uses (built in, from the numpy
    table, or declared before), fdsl's own text and numbers, never the rule file's. The body is
    checked to keep its arguments' shape. It acts entry by entry when every operator it uses does
    and it multiplies no matrices (``layernorm(A)`` or ``A A^t A`` do not: transposing the
    arguments does not transpose the result)."""
    _check_depth(body, "the value of operator %s" % name, err)
    pattern = _Compiler(err, operator, params)(body)
    rows, cols = "r", "c"  # symbolic sizes: the check holds for every shape
    bindings = {p: T.sym(T.Symbol(p), (rows, cols)) for p in params}
    try:
        shape = build(pattern, bindings).shape
    except ShapeError as e:
        raise err("the value of operator %s must keep its arguments' shape: %s" % (name, e), body) from None
    if shape not in ((rows, cols), None):
        raise err("the value of operator %s has shape %s, not its arguments' shape (r x c)"
                  % (name, O.shape_str(shape)), body)

    entrywise = [True]

    def compose(p):
        if isinstance(p, Var):
            return "({%d})" % params.index(p.name)
        if isinstance(p, Num):
            return "(%r)" % float(p.value)
        if isinstance(p, Word):
            entrywise[0] = entrywise[0] and sum(not isinstance(q, Num) for q in p.items) <= 1  # c A is
            # entry by entry, a product of matrices is not
            return "_mul(%s)" % ", ".join(compose(q) for q in p.items)
        if isinstance(p, Bag):
            return "(%s)" % (" + " if p.op == "add" else " * ").join(compose(q) for q in p.items)
        spec = O.OPS[p.op]
        if spec.shown == name:
            raise err("the value of operator %s uses %s itself" % (name, name), body)
        if spec.numpy is None:
            raise err("the value of operator %s uses %s, which has no numbers (d is a differential)"
                      % (name, spec.shown), body)
        entrywise[0] = entrywise[0] and spec.elementwise
        args = [compose(q) for q in p.args]
        data = "(%r)" % float(p.data) if p.data is not None else None
        return spec.numpy.format(*args, args=", ".join(args), args_sum=" + ".join(args),
                                 args_had=" * ".join(args), value=data, exponent=data)

    template = compose(pattern)
    if len(template) > _MAX_TEMPLATE:
        raise err("the value of operator %s expands to %d characters of numpy code (at most %d): "
                  "operators that use other operators many times multiply" % (name, len(template), _MAX_TEMPLATE), body)
    return template, entrywise[0]


_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_LATEX_SPECIAL = {c: "\\" + c for c in "#$%&_{}"}
_LATEX_SPECIAL.update({"\\": r"\textbackslash{}", "^": r"\textasciicircum{}", "~": r"\textasciitilde{}"})


# The control words an operator's LaTeX name may be: math operators and letters. Any other (\input,
# \def, \catcode, \immediate, ...) would act when the paper is typeset, so it is written out as text.
_LATEX_WORDS = frozenset(
    "arccos arcsin arctan arg cos cosh cot coth csc deg det dim exp gcd hom inf ker lg lim liminf limsup ln log "
    "max min Pr sec sin sinh sup tan tanh nabla partial ell mathrm operatorname "
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi pi varpi rho "
    "varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi "
    "Psi Omega".split())


def _latex_head(text):
    """An operator's LaTeX name: a math control word (``\\tanh``, ``\\sigma``) as given; any other
    text escaped, as an operator name, so a rule file cannot inject LaTeX into a paper."""
    if text is None or (_LATEX_COMMAND.fullmatch(text) and text[1:] in _LATEX_WORDS):
        return text
    return r"\operatorname{%s}" % "".join(_LATEX_SPECIAL.get(c, c) for c in text)


def _in_stdlib(path: Path) -> bool:
    try:
        return path.resolve().parent == stdlib_dir().resolve()
    except FileNotFoundError:
        return False


def _display_path(path: Path) -> str:
    return "stdlib/" + path.name if _in_stdlib(path) else str(path)


def _ops(p):
    """Every operator pattern in ``p``."""
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, Op):
            yield q
            stack.extend(q.args)
        elif isinstance(q, (Word, Bag)):
            stack.extend(q.items)
