"""The rewrite engine: applies rules to the shared term graph, and the strategies that compose it.

Vocabulary
----------
Rule        a named left side, right side and guards, from a rule file (``fdsl.lang.rules``).
step        one rule application at one node: the node is replaced by the right side.
normal form a term no rule of the ruleset applies to, anywhere inside it (``let`` bodies are
            not looked into: a named intermediate keeps the body it was defined with).
bottom-up   (innermost) the default: children are normalised before their parent; each distinct
            subterm is rewritten once per ruleset and the result remembered (memo), so a subterm
            shared a thousand times costs one rewrite.
top-down    (outermost) the first node in pre-order that a rule applies to is rewritten, every
            occurrence at once, until nothing applies.
strategy    a composition of rulesets and strategies: in order (``a; b``), ``topdown(r)``,
            ``bottomup(r)``, ``once(r)`` (one step, top-down), ``fixpoint(s)``, and the built-in
            Python strategies (``order``), in the style of sympy.strategies: the traversal knows
            nothing about the rules, the rules nothing about the traversal.

The engine refuses to loop and to grow without end: a rewrite that comes back to a term still
being normalised, more steps than the step limit (``--step-limit``), or more new term nodes than
the size limit (``--size-limit``: a rule such as ``m(?A) => m(?A + ?A)`` doubles the term at every
step, so memory runs out long before the steps do) stops with a message naming the rules that
fired last.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..base.errors import FdslError, Loop, StepLimit, TooWide, printable
from ..base.limits import DEFAULT_SIZE_LIMIT, DEFAULT_STEP_LIMIT
from ..base.numbers import OUT_OF_RANGE
from ..core import alpha
from ..core import terms as T
from ..core.ops import OPS, ShapeError
from ..core.terms import Term
from .patterns import Bag, Op, Run, Seq, Var, Word, build, builder, heads, matcher, quick_test

_STEP_SHARE = 50
PROGRESS_EVERY = 512  # steps between updates of the progress line


# ---- guards ------------------------------------------------------------------------------------


def _value(v) -> Term:
    return v.term() if isinstance(v, Run) else v


PREDICATES = {
    "const": (lambda v: not _value(v).has_weight, "contains no weight, so its differential is 0"),
    "scalar": (lambda v: _value(v).scalar, "a scalar: commutes with everything"),
    "weight": (lambda v: _value(v).op == "sym" and _value(v).data[0].kind == "weight", "a weight symbol"),
    "symbol": (lambda v: _value(v).op == "sym", "a declared symbol"),
    "number": (lambda v: _value(v).op == "num", "a number"),
    "has_d": (lambda v: _value(v).has_d, "contains a differential d(...)"),
    "named": (lambda v: _value(v).op == "let", "a named intermediate (name := ...)"),
    "identity": (lambda v: _value(v).op == "eye", "an identity matrix"),
    "zero": (lambda v: T.is_zero(_value(v)), "zero"),
    "empty": (lambda v: isinstance(v, Run) and not v.items, "an empty run ?A..."),
}


@dataclass
class Rule:
    name: str
    lhs: object
    rhs: object
    guards: tuple  # (negated, predicate name, argument pattern)
    file: str
    line: int
    ruleset: str
    source: str = ""  # the rule as written in its file
    col: int = 0  # where it starts on its line (1-based; 0: unknown)

    def where(self) -> str:
        return "%s:%d" % (self.file, self.line)

    def _spread_product(self, t: Term):
        """``distribute`` applied as often as it would be in a row, at once: ``P (A_1 + ... + A_n) S``
        becomes ``P A_1 S + ... + P A_k S + P (A_k+1 + ... + A_n) S``, peeling while the rest still
        holds a differential (the guard), each step's remainder never built."""
        if not any(x.has_d for x in t.args):
            return None
        for b in self._match(t, {}):
            P, A, B, S = b["P"].items, b["A"], b["B"].items, b["S"].items
            summands = (A,) + B
            outer = any(x.has_d for x in P) or any(x.has_d for x in S)
            # holds[i]: the guard on the product whose sum starts at summand i
            holds = [False] * (len(summands) + 1)
            for i in range(len(summands) - 1, -1, -1):
                holds[i] = outer or holds[i + 1] or summands[i].has_d
            last = 0  # the last step taken starts at summand `last` (a sum of at least two left)
            while last + 1 < len(summands) - 1 and holds[last + 1]:
                last += 1
            parts = [T.mul(*P, a, *S) for a in summands[:last]]
            nb = dict(b, A=summands[last], B=Run("add", summands[last + 1:], b["B"].unit))
            try:
                parts.append(self._build(nb))
            except ShapeError as e:
                raise FdslError("rule %s built an ill-shaped term from %s: %s" % (self.name, t, e),
                                self.file, self.line) from None
            r = T.add(*parts)
            if r.shape != t.shape and T.is_zero(r):
                r = T.zero(t.shape)
            return None if r is t else r
        return None

    def _spread(self, t: Term, at: int) -> Term:
        """What this peeling rule makes of ``t`` applied until its sum is used up: ``f(A_1 + ... +
        A_n)`` becomes ``f(A_1) + ... + f(A_n)``, summands in their order, in one step."""
        args = list(t.args)
        parts = []
        for summand in t.args[at].args:
            args[at] = summand
            parts.append(T.rebuild(t, args))
        r = T.add(*parts)
        if r.shape != t.shape and T.is_zero(r):
            r = T.zero(t.shape)
        if r.shape != t.shape:
            raise FdslError("rule %s changed the shape of %s from (%s x %s) to (%s x %s): it is unsound"
                            % ((self.name, t) + tuple(t.shape) + tuple(r.shape)), self.file, self.line)
        return r

    def __str__(self):
        if self.source:
            return self.source
        g = ""
        if self.guards:
            g = " when " + ", ".join(("not " if n else "") + "%s(%s)" % (p, a)
                                     for n, p, a in self.guards)
        return "rule %s: %s => %s%s" % (self.name, self.lhs, self.rhs, g)

    def __post_init__(self):
        self._peel = None if self.guards else _peel_shape(self.lhs, self.rhs)
        self._distribute = _distribute_shape(self.lhs, self.rhs, self.guards)
        self._quick = quick_test(self.lhs)
        self._match = matcher(self.lhs)
        self._build = builder(self.rhs)
        # guards whose argument is the left side itself or one of its arguments (``has_d(?P... (?A +
        # ?B...) ?S...)``): decided on the matched term before matching, without building anything
        self._early, self._late = [], []
        for negated, pred, arg in self.guards:
            path = _path_to(self.lhs, arg) if pred in _ORDER_BLIND else None
            if path is None:
                self._late.append((negated, pred, None, arg))
            else:
                self._early.append((negated, PREDICATES[pred][0], path, arg))

    def apply(self, t: Term):
        """The first rewrite of ``t`` by this rule that changes it, or None."""
        if not self._quick(t):
            return None
        if self._distribute and t.op == "mul":
            return self._spread_product(t)
        if self._peel is not None and t.op == self._peel[0] and t.data is None:
            at = self._peel[1]
            if len(t.args) > at and t.args[at].op == "add" and len(t.args[at].args) > 2:
                return self._spread(t, at)
        for negated, holds, path, _ in self._early:
            at = t
            for i in path:
                at = at.args[i]
            if holds(at) == negated:
                return None
        for b in self._match(t, {}):
            if not all(_holds(pred, a, b) != negated for negated, pred, _, a in self._late):
                continue
            T.take_out_of_range()
            try:
                r = self._build(b)
            except TooWide as e:
                e.rule = self  # said by Engine.run as this rule's step
                raise
            except ShapeError as e:
                raise FdslError("rule %s built an ill-shaped term from %s: %s" % (self.name, t, e),
                                self.file, self.line) from None
            big = T.take_out_of_range()
            if big is not None:
                raise StepLimit("rule %s (%s) built a number %s: %s" % (self.name, self.where(), _magnitude(big),
                                                                        OUT_OF_RANGE))
            if r.shape != t.shape and T.is_zero(r):
                r = T.zero(t.shape)  # a right side "0" takes the shape of what it replaces
            if r is not t:
                if r.shape != t.shape:
                    raise FdslError("rule %s changed the shape of %s from (%s x %s) to (%s x %s): it is unsound"
                                    % ((self.name, t) + tuple(t.shape) + tuple(r.shape)), self.file, self.line)
                return r
        return None


def _magnitude(value) -> str:
    """About how large an exact number is, without printing its thousand digits."""
    exponent = (abs(value.numerator).bit_length() - value.denominator.bit_length()) * 0.30103
    return "of about %s10^%d" % ("-" if value < 0 else "", round(exponent))


def _peel_shape(lhs, rhs):
    """``(f, i)`` for a rule that takes one summand out of argument i of f, ``f(.., ?A + ?B.., ..) =>
    f(.., ?A, ..) + f(.., ?B..., ..)``, its other arguments distinct variables (``d-sum``,
    ``trace-sum``, ``dexp-sum``); else None. Applied one summand at a time to a sum of n summands
    it builds the sums of n-1, n-2, ... summands: quadratic (an 8,000-term sum took 24 s). Its
    repeated application is spread over the whole sum at once instead (``Rule._spread``)."""
    if not (isinstance(lhs, Op) and isinstance(rhs, Bag) and rhs.op == "add" and len(rhs.items) == 2):
        return None
    sums = [i for i, a in enumerate(lhs.args) if isinstance(a, Bag)]
    if len(sums) != 1:
        return None
    at = sums[0]
    bag = lhs.args[at]
    if bag.op != "add" or len(bag.items) != 2 or not isinstance(bag.items[0], Var) \
            or not isinstance(bag.items[1], Seq):
        return None
    one, rest = bag.items
    others = [a for i, a in enumerate(lhs.args) if i != at]
    names = [a.name for a in others if isinstance(a, Var)]
    if len(names) != len(others) or len(set(names + [one.name, rest.name])) != len(names) + 2:
        return None
    first = Op(lhs.op, lhs.args[:at] + (one,) + lhs.args[at + 1:], lhs.data)
    second = Op(lhs.op, lhs.args[:at] + (rest,) + lhs.args[at + 1:], lhs.data)
    return (lhs.op, at) if rhs.items == (first, second) and lhs.data is None else None


def _distribute_shape(lhs, rhs, guards) -> bool:
    """Whether a rule is ``distribute``: ``?P... (?A + ?B...) ?S... => ?P... ?A ?S... + ?P... (?B...)
    ?S... when has_d(?P... (?A + ?B...) ?S...)``, which also takes one summand at a time."""
    P, S, A, B = Seq("P"), Seq("S"), Var("A"), Seq("B")
    return (lhs == Word((P, Bag("add", (A, B)), S)) and rhs == Bag("add", (Word((P, A, S)), Word((P, B, S))))
            and guards == ((False, "has_d", lhs),))


# predicates that read a term the same in any order of its sums' summands: a guard on a part of the
# left side that is a whole argument can read the matched argument instead of the rebuilt one
_ORDER_BLIND = {"const", "scalar", "has_d"}


def _path_to(lhs, arg):
    """The argument positions leading from the root of ``lhs`` to the sub-pattern ``arg`` (a tuple),
    through operator arguments only; None when ``arg`` is no such sub-pattern (or is a variable)."""
    if isinstance(arg, (Var, Seq)):
        return None
    stack = [(lhs, ())]
    while stack:
        p, path = stack.pop()
        if p == arg:
            return path
        if isinstance(p, Op):
            stack.extend((a, path + (i,)) for i, a in enumerate(p.args))
    return None


def _holds(pred: str, a, b) -> bool:
    """Whether the guard ``pred(a)`` holds under bindings ``b``. An order-blind predicate of a run
    ?A... reads its items (a product or sum of them has a d, a weight, is a scalar, when one or all
    of them do) instead of building the run into a term."""
    name = getattr(a, "name", None)
    v = b[name] if name is not None else build(a, b)
    if v.__class__ is Run and v.items and pred in _RUN_PREDICATES:
        return _RUN_PREDICATES[pred](v)
    return PREDICATES[pred][0](v)


_RUN_PREDICATES = {
    "has_d": lambda run: any(x.has_d for x in run.items),
    "const": lambda run: not any(x.has_weight for x in run.items),
    "scalar": lambda run: all(x.scalar for x in run.items),
}


def guard_value(a, b):
    """What a guard's argument pattern stands for under bindings ``b`` (a Term, or a Run)."""
    name = getattr(a, "name", None)
    return b[name] if name is not None else build(a, b)


# ---- rulesets as an index ------------------------------------------------------------------------


class Index:
    """The rules of a ruleset (with the rulesets it includes), indexed by the operator at the root."""

    def __init__(self, rules):
        self.rules = list(rules)
        self.by_head: dict[str, list] = {}
        self.anywhere: list = []
        for r in self.rules:
            hs = heads(r.lhs)
            if hs is None:
                self.anywhere.append(r)
            else:
                for h in hs:
                    self.by_head.setdefault(h, []).append(r)
        if self.anywhere:  # keep file order between indexed and unindexed rules
            order = {id(r): i for i, r in enumerate(self.rules)}
            for h in self.by_head:
                self.by_head[h] = sorted(self.by_head[h] + self.anywhere, key=lambda r: order[id(r)])

        # a rule that names ``let`` can read a named intermediate's body: then lets are not atoms
        # that a renaming may replace (fdsl.core.alpha)
        self.lets_are_atoms = not any(_names_op(p, "let") for r in self.rules for p in (r.lhs, r.rhs))

    def candidates(self, t: Term):
        return self.by_head.get(t.op, self.anywhere)


def _names_op(p, op: str) -> bool:
    """Whether the pattern ``p`` has an operator ``op`` anywhere."""
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, Op):
            if q.op == op:
                return True
            stack.extend(q.args)
        elif isinstance(q, (Word, Bag)):
            stack.extend(q.items)
    return False


class Stepper:
    """Counts steps, keeps the last rules that fired, and prints them under --trace."""

    def __init__(self, name, limit, trace_out=None, size_limit=DEFAULT_SIZE_LIMIT, progress=None):
        self.name, self.limit, self.trace_out = name, limit, trace_out
        self.size_limit = size_limit
        self.progress = progress  # fdsl.base.progress: a line on stderr while long work runs
        self.steps = 0
        self.last = deque(maxlen=24)
        self.start = T.built()

    def fire(self, rule: Rule, before: Term, after: Term, cells: int = 0):
        """Count a step of ``rule`` (whose right side built ``cells`` new term cells)."""
        self.steps += 1
        self.last.append(rule)
        if self.progress is not None and not self.steps % PROGRESS_EVERY:
            self.progress.update(PROGRESS_EVERY)
        if self.trace_out is not None:
            # a rule file's name (in where()) is the user's: escaped as every printed name is
            self.trace_out.write(printable("[%s %s] %s  =>  %s" % (rule.name, rule.where(), before, after)) + "\n")
        if self.steps > self.limit:
            raise StepLimit("%s did not reach a normal form within %d steps (the step limit, "
                            "--step-limit N)%s" % (self.name, self.limit, self.recent()))
        if T.built() - self.start > self.size_limit:
            raise StepLimit("%s built more than %d term cells in %d steps (the size limit, --size-limit N)%s"
                            % (self.name, self.size_limit, self.steps, self.recent()))
        if cells > self.size_limit // _STEP_SHARE:
            raise StepLimit("%s: one step of rule %s (%s) built %d term cells, more than 1/%d of the size "
                            "limit (--size-limit N): a rule that grows its term without end?%s"
                            % (self.name, rule.name, rule.where(), cells, _STEP_SHARE, self.recent()))

    def recent(self) -> str:
        if not self.last:
            return ""
        counts = Counter((r.name, r.where()) for r in self.last)
        fired = ", ".join("%s (%s) x%d" % (n, w, c) for (n, w), c in counts.most_common())
        return "; the rules that fired last: " + fired

    def loop(self, t: Term):
        raise Loop("%s loops: %s rewrote back to itself after %d steps%s"
                   % (self.name, _short(t), self.steps, self.recent()))


def _short(t, n=120):
    s = str(t)
    return s if len(s) <= n else s[: n - 3] + "..."


def step_at_root(index: Index, t: Term):
    """(rule, result, term cells its right side built) of the first rule that rewrites ``t``."""
    for rule in index.candidates(t):
        before = T.built()
        r = rule.apply(t)
        if r is not None:
            return rule, r, T.built() - before
    return None


def normalize(index: Index, root: Term, memo: dict, stepper: Stepper) -> Term:
    """Innermost normalisation of ``root`` (see the module doc), without recursion.

    ``memo`` maps every term seen to its normal form and is kept between calls: terms are
    immutable, so a normal form stays one. ``root`` is rewritten in its canonical form
    (``fdsl.core.alpha``), so that a term that differs from one seen before only by the names of its
    leaves (the next layer of an encoder) costs a renaming, not a rewrite. Under --trace every
    rewrite is done, and shown, with the real names.
    """
    hit = memo.get(root)
    if hit is not None:
        return hit
    if stepper.trace_out is None:
        canon, back = alpha.canonical(root, index.lets_are_atoms)
        if back:
            steps, last, start, built = stepper.steps, list(stepper.last), stepper.start, T.built()
            try:
                r = alpha.rename(_normalize(index, canon, memo, stepper), back)
            except FdslError as e:
                if isinstance(e, StepLimit) and not isinstance(e, Loop):
                    raise  # the limits' messages name rules, not terms (and take long to reach again)
                # say it with the real names: the same rewrites again, from the same count
                stepper.steps, stepper.start = steps, start + T.built() - built
                stepper.last.clear()
                stepper.last.extend(last)
            else:
                memo[root] = r
                return r
    return _normalize(index, root, memo, stepper)


def _normalize(index: Index, root: Term, memo: dict, stepper: Stepper) -> Term:
    redirect: dict = {}  # a node -> what it became (rewritten at its root, or rebuilt)
    active: set = set()  # nodes waiting for the normal form of what they became
    opaque_ops = {name for name, spec in OPS.items() if spec.opaque}  # a named intermediate keeps its body
    candidates = index.candidates
    memo_get = memo.get
    built = T._BUILT  # term cells made so far (see Stepper.fire), read without a call
    stack = [root]
    while stack:
        t = stack[-1]
        if t in memo:
            stack.pop()
            continue
        r = redirect.get(t)
        if r is None:
            opaque = t.op in opaque_ops
            if not opaque:
                pending = False
                for c in t.args:
                    if c not in memo:
                        if c in active:  # a rewrite led back into a term still being rewritten
                            stepper.loop(c)
                        stack.append(c)
                        pending = True
                if pending:
                    continue
                # rebuild only when a child changed (most are their own normal form)
                args = t.args
                for c in args:
                    if memo_get(c) is not c:
                        r = T.rebuild(t, [memo[c] for c in args])
                        if r is t:
                            r = None
                        break
            if r is None:
                for rule in candidates(t):
                    before = built[0]
                    r = rule.apply(t)
                    if r is not None:
                        stepper.fire(rule, t, r, built[0] - before)  # what its right side built
                        break
                else:
                    memo[t] = t
                    stack.pop()
                    continue
            redirect[t] = r
        m = memo_get(r)
        if m is not None:
            memo[t] = m
            active.discard(t)
            stack.pop()
            continue
        if r in active or t in active:
            stepper.loop(r)
        active.add(t)
        stack.append(r)
    return memo[root]


def topdown(index: Index, root: Term, stepper: Stepper, once=False) -> Term:
    """Outermost rewriting: rewrite the first redex in pre-order (all its occurrences) and repeat."""
    seen_roots = set()
    while True:
        found = None
        for node in _preorder(root):
            fired = step_at_root(index, node)
            if fired is not None:
                found = node, fired
                break
        if found is None:
            return root
        node, (rule, r, cells) = found
        stepper.fire(rule, node, r, cells)
        root = substitute(root, {node: r})
        if once:
            return root
        if root in seen_roots:
            stepper.loop(root)
        seen_roots.add(root)


def _preorder(root: Term):
    seen = set()
    stack = [root]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        yield t
        if not OPS[t.op].opaque:
            stack.extend(reversed(t.args))


def substitute(root: Term, mapping: dict) -> Term:
    """``root`` with every occurrence of each key replaced by its value (on the shared graph)."""
    out = dict(mapping)
    for node in T.postorder(root, descend=lambda n: n not in mapping and not OPS[n.op].opaque):
        if node not in out:
            out[node] = node if OPS[node.op].opaque else T.rebuild(node, [out.get(c, c) for c in node.args])
    return out[root]


# ---- strategies ----------------------------------------------------------------------------------


@dataclass
class Strategy:
    """A named composition: a list of steps, each ("ruleset"|"strategy"|"builtin", name) or a
    combinator (kind, inner step)."""

    name: str
    steps: list
    file: str = ""
    line: int = 0

    def __str__(self):
        return "strategy %s = %s" % (self.name, "; ".join(_step_str(s) for s in self.steps))


def _step_str(s):
    kind, x = s
    if kind in ("topdown", "bottomup", "once", "fixpoint"):
        return "%s(%s)" % (kind, _step_str(x))
    return x


class Builtin(NamedTuple):
    """A strategy written in Python, usable in rule files by name: ``run(term, apply)``, where
    ``apply(name, term)`` applies a ruleset or strategy of the same rule book (so a built-in can
    sequence rulesets). The rule book is handed its table of them (``RuleBook.builtins``)."""

    run: Callable
    doc: str


@dataclass
class Engine:
    """Runs rulesets and strategies of a rule book over terms, remembering normal forms."""

    book: object
    memos: dict = field(default_factory=dict)
    indexes: dict = field(default_factory=dict)

    def reset(self):
        self.memos.clear()
        self.indexes.clear()

    def index(self, ruleset: str) -> Index:
        if ruleset not in self.indexes:
            self.indexes[ruleset] = Index(self.book.rules_of(ruleset))
        return self.indexes[ruleset]

    def run(self, name: str, t: Term, options: dict) -> Term:
        """Apply the ruleset or strategy ``name`` to ``t``."""
        limit = options.get("step_limit") or DEFAULT_STEP_LIMIT
        trace = options.get("trace_out") if options.get("trace") else None
        progress = None
        if options.get("progress") and trace is None:
            from ..base import progress as P

            progress = P.start(name)
        stepper = Stepper(name, limit, trace, options.get("size_limit") or DEFAULT_SIZE_LIMIT, progress)
        try:
            return self._run_step(self.book.step_of(name), t, stepper)
        except TooWide as e:
            rule = getattr(e, "rule", None)
            if rule is not None:  # a rule's one step would build a sum too wide: the size limit's message
                stepper.fire(rule, t, t, e.width)
            raise
        finally:
            if progress is not None:
                progress.close()

    def _run_step(self, step, t, stepper):
        kind, x = step
        if kind == "ruleset":
            return normalize(self.index(x), t, self.memos.setdefault(x, {}), stepper)
        if kind == "strategy":
            for s in self.book.strategies[x].steps:
                t = self._run_step(s, t, stepper)
            return t
        if kind == "builtin":
            return self.book.builtins[x].run(t, lambda name, term: self._run_step(self.book.step_of(name), term,
                                                                                   stepper))
        if kind == "bottomup":
            return self._run_step(x, t, stepper)
        if kind in ("topdown", "once"):
            if x[0] != "ruleset":
                raise FdslError("%s(...) takes a ruleset, not %s" % (kind, _step_str(x)))
            return topdown(self.index(x[1]), t, stepper, once=(kind == "once"))
        if kind == "fixpoint":
            while True:
                nt = self._run_step(x, t, stepper)
                if nt is t:
                    return t
                t = nt
        raise AssertionError(kind)
