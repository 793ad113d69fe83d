"""The manual's verbs on forms: form, forms, len, coeff, weights, depends, and weight order.

Vocabulary
----------
form(E)     the pulled-back Euler form ``-trace(E^t d(E))``, a scalar 1-form on weight space.
normal form ``sum_W trace(G_W d(W))``: one term per weight, the differential last, G free of d
            (reached by the stdlib strategy ``normal``; ``forms`` stops before ``collect``). A
            scalar weight g (``weight g : scalar``) has the term ``G_g d(g)``, G_g a scalar.
coefficient G_W, the matrix paired with d(W): ``coeff(w, W)``. The gradient is its transpose.
weight key  how summands are ordered: by the weight under their differential (name, then index).

The rewriting itself is in stdlib/*.rules; this module only builds ``form(E)``, reads normal
forms, and provides the built-in strategy ``order`` (a stable sort of summands by weight key).
"""

from __future__ import annotations

from collections import deque
from fractions import Fraction

from ..base.errors import FdslError
from ..core import normal
from ..core import terms as T
from ..core.functions import as_int, as_term, function
from ..core.normal import differentials, is_weight  # noqa: F401  (read here by the verbs' callers)
from ..core.ops import OPS, shape_str
from ..core.ops import shown as op_name
from ..core.printers import short, text
from ..core.terms import Term


def form(e: Term) -> Term:
    """``-trace(E^t d(E))``."""
    return T.neg(T.make("trace", (T.mul(T.transpose(e), T.d(e)),)))


_WEIGHT_KEYS: dict = {}  # term -> weight_key (terms are immutable and interned for good)


def weight_key(t: Term):
    """Sort key of a summand: the weight under its first differential (name, index)."""
    key = _WEIGHT_KEYS.get(t)
    if key is None:
        key = _WEIGHT_KEYS[t] = _weight_key(t)
    return key


def _weight_key(t: Term):
    for n in T.postorder(t, descend=lambda n: n.op != "let"):  # the first one: stop there
        if OPS[n.op].differential:
            x = n.args[0]
            break
    else:
        return (0, "", ())
    if x.op == "sym":
        s = x.data[0]
        return (1, s.name, s.index)
    if x.op == "let":  # its printed name, without printing (and so walking) its body
        name, index = x.data
        return (2, name + "".join("_%d" % i for i in index), ())
    return (2, text(x), ())


def order(t: Term, run=None) -> Term:
    parts = T.summands(t)
    if len(parts) < 2:
        return t
    return T.add(*sorted(parts, key=weight_key))


class NotNormal(FdslError):
    """A summand that is not ``trace(G d(X))``; ``summand`` is it, for a diagnosis."""

    def __init__(self, message, summand):
        super().__init__(message)
        self.summand = summand


def normal_terms(w: Term):
    """The (X, G) pairs of the terms trace(G d(X)) of a normal form; an error if it is not one.
    X is a weight, or a named intermediate in the steps of ``backprop``."""
    pairs, bad = normal.split(w)
    if bad is None:
        return pairs
    summand, ends = bad
    if not ends:
        raise NotNormal("not in normal form: %s is not trace(G d(W)); apply normal(...) "
                        "first" % short(summand), summand)
    raise NotNormal("not in normal form: %s does not end in its only differential; apply normal(...) "
                    "first" % short(summand), summand)


def check_normal(w: Term, name: str = "normal") -> Term:
    """``w`` if it is a normal form whose every differential is d(W) of a weight, last in its
    trace; otherwise an error saying which rule is missing (the d rule or the flip rule of an
    operator), for a normal form with a stray differential gives wrong weights and coefficients."""
    for s in T.summands(w):
        reason = why_not_normal(s)
        if reason is not None:
            raise FdslError("%s(...) did not reach a normal form sum_W trace(G_W dW): %s" % (name, reason))
    return w


def why_not_normal(s: Term):
    """Why the summand ``s`` is not ``c trace(G d(W))`` with W a weight, or None if it is."""
    _, rest = T.coefficient(s)
    if not s.scalar and s.has_d:  # w = -d(E) of a matrix E: a matrix of forms, no rule makes it a scalar
        return not_a_scalar(s)
    stray = [x for x in differentials(s) if not (x.op == "sym" and x.data[0].kind == "weight")]
    if stray:
        x = stray[0]
        if x.op in OPS and OPS[x.op].kind == "function" and not OPS[x.op].differential:
            params = ", ".join("?" + p for p in "ABCDEFGH"[:len(x.args)])
            return ("d(%s) is left as it is: no rule differentiates the operator %s; add one to ruleset "
                    "differentiate, e.g. rule d-%s: d(%s(%s)) => ... (examples/softplus.rules shows how)"
                    % (short(x, 60), op_name(x.op), op_name(x.op), op_name(x.op), params))
        return "d(%s) is left as it is: no rule expands it" % short(x, 60)
    if not s.has_d:
        return "%s has no differential: normal takes a 1-form, e.g. normal(form(E))" % short(s, 60)
    last = T.factors(rest)[-1]
    if last.op == "d" and last.scalar and not any(f.has_d for f in T.factors(rest)[:-1]):
        return None  # G d(g), g a scalar weight
    if rest.op != "trace":
        return "%s is not a trace: normal takes a scalar 1-form, e.g. normal(form(E))" % short(s, 60)
    word = T.factors(rest.args[0])
    if word[-1].op == "d" and not any(f.has_d for f in word[:-1]):
        return None
    trapped = _trapping_operator(rest.args[0])
    if trapped is not None:
        return ("a differential is inside %s(...) in %s: no flip rule moves it out of %s; add one to "
                "ruleset shiftmm, as flip-mm does for mm (stdlib/trace.rules)" % (trapped, short(s, 80), trapped))
    return "%s does not end in its only differential" % short(s, 80)


def not_a_scalar(w: Term) -> str:
    """Why the matrix of forms ``w`` is no 1-form: what it is the differential of, and the scalar to
    write instead."""
    _, rest = T.coefficient(w)
    what = "%s is a %s matrix of forms, not a scalar" % (short(w, 60), shape_str(w.shape))
    if rest.op == "d" and not rest.args[0].scalar:
        x = short(rest.args[0], 40)
        what = "%s is the differential of %s, a %s matrix: %s is not a scalar" % (
            short(rest, 60), x, shape_str(rest.args[0].shape), x)
        example = "form(%s) = -trace(%s^t d(%s)), the 1-form of L = 1/2 ||%s||^2" % (x, x, x, x)
    else:
        example = "form(E) = -trace(E^t d(E)), or trace(G %s)" % short(w, 30)
    return "%s; a 1-form is a scalar, e.g. %s" % (what, example)


def _trapping_operator(word: Term):
    """The outermost operator (mm, aa, a rule file's) that holds a differential in ``word``."""
    frontier = [word]
    while frontier:  # breadth first: the outermost such operator is found first
        below = []
        for t in frontier:
            if t.op == "d" or t.op == "let":
                continue
            if OPS[t.op].kind == "function" and t.has_d:
                return t.op
            below.extend(c for c in t.args if c.has_d)
        frontier = below
    return None


def coeff(w: Term, weight: Term) -> Term:
    """The coefficient G of d(W) in a normal form (the sum of them, if W has several terms)."""
    gs = [g for x, g in normal_terms(w) if x is weight]
    if not gs:
        return T.zero((weight.shape[1], weight.shape[0]))
    return T.add(*gs)


def weights(w: Term) -> list:
    """The weights whose differentials appear in ``w``, in weight order."""
    seen = {x for x in differentials(w) if x.op == "sym"}
    return sorted(seen, key=lambda x: (x.data[0].name, x.data[0].index))


class Dependence:
    """The answer to "does G involve V?": true or false, and a path through which it does:
    ``path`` its printed stops, ``nodes`` the terms from G down to V (for pictures of it)."""

    def __init__(self, holds: bool, path: list, nodes: list = ()):
        self.holds, self.path, self.nodes = holds, path, list(nodes)

    def __bool__(self):
        return self.holds

    def __repr__(self):
        return self.show()

    def show(self) -> str:
        if not self.holds:
            return "false"
        return "true, via " + " > ".join(self.path)


def depends(g: Term, v: Term) -> Dependence:
    """Whether ``v`` occurs in ``g``, looking through named intermediates, with the shortest path
    of named intermediates and operators that leads to it."""
    parent = {g: None}
    queue = deque([g])
    while queue:  # breadth first: the first path found is a shortest one
        t = queue.popleft()
        if t is v:
            chain = _chain(parent, t)
            return Dependence(True, path_labels(chain), chain)
        for c in t.args:
            if c not in parent:
                parent[c] = t
                queue.append(c)
    return Dependence(False, [])


def _chain(parent, t) -> list:
    chain = []
    while t is not None:
        chain.append(t)
        t = parent[t]
    chain.reverse()
    return chain


def path_labels(chain) -> list:
    """The printed stops of a chain of terms: named intermediates, symbols, and operators."""
    labels = []
    for node in chain[1:]:
        if node.op in ("let", "sym"):
            labels.append(text(node))
        elif OPS[node.op].kind == "function":
            labels.append("%s(...)" % op_name(node.op))
    return labels



# ---- the language functions ----------------------------------------------------------------------


def error_term(program, e, verb: str) -> Term:
    """The E of ``form(E)``/``forms(E)``. The manual writes ``forms(2)`` for the form of
    ``encoder(2)`` (its ``forms(i)`` is ``...form(encoder(i))``): a whole number means that when
    the program defines ``encoder``; otherwise it is a mistake, and the message says what to write."""
    if isinstance(e, Fraction) and e.denominator == 1 and e >= 0:
        clauses = program.clauses.get("encoder")
        if clauses and len(clauses[0].params) == 1:
            return as_term(program.call_definition("encoder", int(e)), "encoder(%s)" % e)
        raise FdslError("%s(%s): %s takes the error E, a matrix expression, not a number; write %s(E) with, "
                        "e.g., E = Y - encoder(%s), or define encoder(L) as the manual does, and %s(%s) "
                        "means %s(encoder(%s))" % (verb, e, verb, verb, e, verb, e, verb, e))
    return as_term(e, "E")


@function("form(E)", "the pulled-back Euler form -trace(E^t d(E)); form(i) is form(encoder(i))")
def _form(program, e):
    return form(error_term(program, e, "form"))


# ---- how many summands an expansion makes, before making them ---------------------------------------

_BOUND_CAP = 10 ** 30  # counts are capped here: beyond any limit, and Python's integers stay small


def expansion_bound(t: Term) -> int:
    """About how many summands ``t`` has once every product, differential and linear operator is
    multiplied out over the sums in it (at most ``_BOUND_CAP``): sums add their operands' counts,
    products and the linear places of an operator multiply them, and d(A B) counts one summand per
    factor differentiated (Leibniz). An upper bound for the stdlib's expansions, which may merge
    summands but never split one further; computed on the shared graph, in a pass over its nodes."""
    plain: dict = {}  # node -> summands of the node expanded
    diff: dict = {}  # node -> summands of d(node) expanded

    def places(node):  # the positions a sum in would split the node over
        op = OPS.get(node.op)
        if node.op in ("mul", "had") or op is None:
            return range(len(node.args))
        return op.linear

    for node in T.postorder(t):
        if node.op == "add":
            plain[node] = min(_BOUND_CAP, sum(plain[a] for a in node.args))
            diff[node] = min(_BOUND_CAP, sum(diff[a] for a in node.args))
        elif node.op == "sym":
            plain[node], diff[node] = 1, 1 if node.data[0].kind == "weight" else 0
        elif node.op == "d":
            plain[node], diff[node] = diff[node.args[0]], 0
        elif not node.args:
            plain[node], diff[node] = 1, 0
        else:
            linear = set(places(node))
            counts = [plain[a] if i in linear else 1 for i, a in enumerate(node.args)]
            whole = 1
            for c in counts:
                whole = min(_BOUND_CAP, whole * c)
            total = 0
            for i, a in enumerate(node.args):  # d(node): one term per argument differentiated
                others = 1
                for k, c in enumerate(counts):
                    if k != i:
                        others = min(_BOUND_CAP, others * c)
                total = min(_BOUND_CAP, total + diff[a] * others)
            plain[node], diff[node] = whole, total
    return plain[t]


def check_expansion(program, w: Term, what: str) -> None:
    """An FdslError before expanding ``w`` if its expansion would hold more summands than one flat
    sum may (a fiftieth of the size limit): the encoder's form at depth 20 has about 10^17, and
    would otherwise be expanded until memory or patience ran out."""
    limit = T.max_width()
    bound = expansion_bound(w)
    if bound > limit:
        about = "more than 10^30" if bound >= _BOUND_CAP else "up to about %.2g" % bound
        raise FdslError("%s: its expansion would have %s summands, more than the %d one sum may hold (a "
                        "fiftieth of the size limit; --size-limit N raises it)" % (what, about, limit))


@function("forms(E, j?)", "cycle(shiftmm(flatten(expandmm(expandAll(form(E)))))), or its summand j; "
          "forms(i) is forms(encoder(i))")
def _forms(program, e, j=None):
    w = form(error_term(program, e, "forms"))
    named = isinstance(e, Term) and e.op == "let"  # E := ...: its name, not its (long) body
    check_expansion(program, w, "forms(%s)" % (e if isinstance(e, Fraction) else
                                              "".join([e.data[0]] + ["_%d" % i for i in e.data[1]]) if named
                                              else short(e, 30)))
    w = program.apply_rules("expandforms", w)
    if j is None:
        return w
    parts = T.summands(w)
    k = as_int(j, "j")
    if not parts:
        raise FdslError("forms(..., %d): the form is 0, so it has no summands (is there a weight in E?)" % k)
    if not -len(parts) <= k < len(parts):
        raise FdslError("forms(..., %d): the form has %d summand%s, numbered 0 to %d"
                        % (k, len(parts), "" if len(parts) == 1 else "s", len(parts) - 1))
    return parts[k]


@function("len(x)", "the number of summands of x (the manual's z.length)")
def _len(program, x):
    if isinstance(x, list):
        return Fraction(len(x))
    return Fraction(len(T.summands(as_term(x))))


def _normalised(program, w):
    """``w`` if it is a normal form, else ``normal(w)`` (which fails, naming the missing rule, where
    it cannot get there): read off a 1-form not yet normal, form(E), the weights and coefficients
    would be wrong (d(E) is no weight's differential), not merely unexpanded."""
    w = as_term(w, "w")
    try:
        normal = all(x.op == "sym" and x.data[0].kind == "weight" for x, _ in normal_terms(w))
    except FdslError:
        normal = False
    if w.has_d and not normal:
        w = program.apply_rules("normal", w)
    return w


@function("coeff(w, W)", "the coefficient G of d(W) in the normal form w = ... + trace(G d(W)) + ... "
          "(a 1-form not yet normal, form(E), is first brought there by normal)")
def _coeff(program, w, weight):
    w, x = _normalised(program, w), _weight_arg(weight)
    g = coeff(w, x)
    symbol = x.data[0]
    if T.is_zero(g) and symbol.index and not any(leaf is x for leaf in T.postorder(w)):
        # K[7] of a family whose form has K_0 and K_1: a misremembered index, not a zero coefficient
        members = [t.data[0].printed() for t in weights(w) if t.data[0].name == symbol.name]
        raise FdslError("%s does not occur in the form (%s), so its coefficient is 0; did you mean one of them?"
                        % (symbol.printed(), "the members of %s there: %s" % (symbol.name, ", ".join(members))
                           if members else "no member of %s occurs there" % symbol.name))
    return g


@function("weights(w)", "the weights whose differentials appear in w (a 1-form not yet normal is first "
          "brought there by normal)")
def _weights(program, w):
    return weights(_normalised(program, w))


@function("depends(G, V)", "whether V occurs in G (true, with the path through which it does, or false)")
def _depends(program, g, v):
    return depends(as_term(g, "G"), as_term(v, "V"))


def _weight_arg(w):
    t = as_term(w, "W")
    if t.op != "sym" or t.data[0].kind != "weight":
        raise FdslError("%s is not a weight" % text(t))
    return t
