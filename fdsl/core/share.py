"""Found intermediates: the shared structure of a term graph, named as if the user had named it.

Vocabulary
----------
uses          how many times a node stands as an argument of the distinct nodes above it (each
              occurrence in an argument tuple counts). A node used once is written once in any
              printing of the graph; a node used more than once is what makes a tree exponential.
hint          the name a program gives a value: ``E = Y - F`` hints ``E`` for the value of E,
              a call ``encoder(3)`` of a definition with whole-number arguments hints
              ``encoder_3``. Programs record hints as they elaborate; the first one wins.
found         a node the term graph shares that reads better by name: not a leaf, free of
              differentials, not already named (``let``), not a transpose (``Z^t`` is read off
              ``Z``), used more than once, and either hinted or larger than ``SMALL`` nodes
              written out. A found node is an intermediate exactly like ``N := ...``.
fresh name    a found node with no hint is named ``S_1``, ``S_2``, ... (innermost first), with
              a letter that no symbol, definition, hint or named intermediate of the term uses.

run           sums are flat, so a residual stream ``net(2) = f(net(1)) + net(1)`` holds the summands
              of the sum net(1), not net(1) itself: a hinted sum whose summands stand as a run
              inside a longer sum is used there too, and is put back there by name.

reused        a subterm that is, written out, the body of a let the term holds: ``E := Y - F`` was
              built before ``normal`` named ``encoder_1`` inside F, so E's body holds encoder(1)
              written out where the rest of the form says ``encoder_1``. The printers print such
              a subterm by the let's name (``reuse``), so that a ``where`` block uses the names it
              binds; ``string()``, whose text must read back to the very term, names it with a
              fresh transparent binding instead (``alias``), the let's body then being that name.
unfolded      a term with every let replaced by its body, unfolded: equal unfoldings are equal
              values, however the lets were placed (what ``reused`` compares).

names         a program's hints and reserved names (``Names``): each program has its own, made the
              current ones (``naming``) while it elaborates, runs or is asked, so that what one
              program calls a value, or declares, does not change how another program's terms
              print. Outside every program the last one made current serves (a script that
              parses a program and prints its terms gets that program's names).

``found(t)`` is the analysis (node -> (name, index), and the runs); ``Sharing(t)`` rebuilds
``t`` with every found node wrapped in a ``let``, keeping the user's own lets as they are, which
is what ``normal``/``backprop`` differentiate and the printers print, so the manual's natural
program (``encoder(L) = layer(L-1, encoder(L-1))``, no ``:=``) is linear in depth. Each is one
pass over the shared graph, without recursion.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from . import terms as T
from .terms import Term

SMALL = 6  # a shared node of at most this many nodes written out is cheaper to read inline
WRITE_OUT = 20_000  # printers write a term out in full up to this many nodes

_FRESH = ("S", "H", "Z", "T", "P", "R", "N", "M")


class Names:
    """The names one program gave: ``hints`` (Term -> (name, index), the first one wins),
    ``reserved`` (every name it declared or defined: fresh names avoid them), and ``cache``
    ((Term, hint count, ...) -> found(t), which depends on both)."""

    def __init__(self):
        self.hints: dict = {}
        self.reserved: set = set()
        self.cache: dict = {}


_CURRENT: ContextVar = ContextVar("fdsl_names", default=None)
_LAST = [Names()]  # the names made current last: what serves outside every program


def current_names() -> Names:
    """The current program's names (see the vocabulary)."""
    current = _CURRENT.get()
    return current if current is not None else _LAST[0]


@contextmanager
def naming(own: Names):
    """Make ``own`` the current names for the block (and, after it, outside every program)."""
    _LAST[0] = own
    token = _CURRENT.set(own)
    try:
        yield own
    finally:
        _CURRENT.reset(token)


def hint(t, name: str, index: tuple = ()) -> None:
    """Record that the current program calls the value ``t`` by ``name`` (``name_index`` with an index)."""
    hints = current_names().hints
    if isinstance(t, Term) and t not in hints and t.args and t.op != "let":
        hints[t] = (name, tuple(index))


def reserve(name: str) -> None:
    """A name the user declared or defined: a fresh name never takes it."""
    current_names().reserved.add(name)


def _sum_runs(t: Term, adds: list, descend=None) -> dict:
    """Where a hinted sum stands inside a longer sum: sums are flat, so the residual stream
    ``net(2) = tanh(net(1) U_1) + net(1)`` holds net(1)'s summands, not net(1). Returns, for each
    sum P, the (start, H) of the runs of P's summands that are a hinted sum H, longest first,
    left to right, not overlapping."""
    by_first: dict = {}
    for h in adds:
        by_first.setdefault(h.args[0], []).append(h)
    for hs in by_first.values():
        hs.sort(key=lambda h: -len(h.args))
    runs: dict = {}
    for node in T.postorder(t, descend):
        if node.op != "add" or len(node.args) < 3:
            continue
        i, args = 0, node.args
        while i < len(args):
            for h in by_first.get(args[i], ()):
                k = len(h.args)
                if h is not node and k < len(args) and args[i:i + k] == h.args:
                    runs.setdefault(node, []).append((i, h))
                    i += k
                    break
            else:
                i += 1
    return runs


def fresh_letter(names_in_use) -> str:
    """The letter of fresh names (``S_1``, ...): the first of ``_FRESH`` that no symbol, definition,
    hint, let or name in ``names_in_use`` takes."""
    own = current_names()
    taken = set(names_in_use) | own.reserved | {name for name, _ in own.hints.values()}
    letter = next((c for c in _FRESH if c not in taken), None)
    if letter is None:
        letter = next("S" * k for k in range(2, 1000) if "S" * k not in taken)
    return letter


def found(t: Term, printing: bool = False, named=frozenset(), taken=frozenset(), opaque=frozenset()) -> tuple:
    """The found intermediates under ``t``: (names, runs). ``names`` maps each found node to its
    (name, index), children before parents; ``runs`` the sums that hold a found sum's summands.
    ``printing``: a node is also used as many times as its transpose is (``(Y - F)^t``, written
    twice, is ``Y - F`` written twice), which the engine, which never names a transpose, ignores.
    ``named``: nodes already named otherwise; ``taken``: names a fresh one must not take;
    ``opaque``: lets whose bodies are not looked into (printed before: not printed again)."""
    own = current_names()
    hints, cache = own.hints, own.cache
    key = (t, len(hints), printing, named, taken, opaque)
    descend = (lambda n: n not in opaque) if opaque else None
    hit = cache.get(key)
    if hit is not None:
        return hit
    count: dict = {t: 0}
    by_d: dict = {}  # uses as the argument of d: d(E) beside E^t does not make E worth a name
    named = set(named)  # the bodies of lets: already named
    for node in T.postorder(t, descend):
        for c in node.args:
            count[c] = count.get(c, 0) + 1
            if node.op == "d":
                by_d[c] = by_d.get(c, 0) + 1
        if node.op == "let":
            named.add(node.args[0])
    adds = [h for h in hints if h.op == "add" and h in count]
    if printing:  # unfolded, a let's sum stands as a run in the sums it was named in
        adds += [h for h in named if h.op == "add" and h in count and h not in hints]
    runs = _sum_runs(t, adds, descend)
    for p, rs in runs.items():
        for _, h in rs:
            count[h] += 1
            if printing:  # p is printed with h's name: the summands of h are not used by p
                for c in h.args:
                    count[c] -= 1
    if printing:
        for node in list(count):
            if node.op == "t" and count[node] > 1:
                count[node.args[0]] += count[node] - 1
    size: dict = {}
    names_in_use = set(own.reserved) | taken
    picked = []
    for node in T.postorder(t, descend):
        # tree sizes capped at SMALL + 1: only "small or not" matters, and exact sizes explode
        size[node] = 1 if node in opaque else min(SMALL + 1, 1 + sum(size[c] for c in node.args))
        if node.op == "sym":
            names_in_use.add(node.data[0].name)
        elif node.op == "let":
            names_in_use.add(node.data[0])
        if not node.args or node.has_d or node.op in ("let", "t") or node in named:
            continue
        if node in hints:
            if count[node] > 1:
                picked.append(node)
        elif count[node] - by_d.get(node, 0) > 1 and size[node] > SMALL:
            picked.append(node)
    letter = fresh_letter(names_in_use)
    names, fresh = {}, 0
    for node in picked:
        if node in hints:
            names[node] = hints[node]
        else:
            fresh += 1
            names[node] = (letter, (fresh,))
    runs = {p: [(i, h) for i, h in rs if h in names] for p, rs in runs.items()}
    out = (names, {p: rs for p, rs in runs.items() if rs})
    if len(cache) > 256:
        cache.clear()
    cache[key] = out
    return out


class Sharing:
    """``t`` with every found intermediate a named one (a ``let``): ``Sharing(t).term``.

    The user's own lets (``E := ...``) are kept as they are, the same objects, so that ``E`` in a
    normal form is the program's ``E``; what was found inside a let's body is there in
    ``body(let)``, which the engine unfolds and the printers write in its binding. One memo
    serves the term and every body, so a subterm found once is one let everywhere.
    ``made`` holds the lets made for found intermediates.

    ``reuse`` (the printers): a subterm that unfolds to what a let of ``t`` unfolds to is that let
    (``reused``), except as that let's own body; what is found is found in ``t`` unfolded (but
    for the lets in ``known``, bound by an earlier printing: what they hold is not printed).
    ``alias`` (``string()``): such a subterm is instead a fresh transparent let over it as it
    stands, so that the text reads back as ``t`` itself, and a let whose body is one of those is
    bound to that name (``encoder[1] := H[1]``).
    """

    def __init__(self, t: Term, found_names=None, reuse: bool = False, alias: bool = False,
                 bindings: bool = True, known=()):
        self.new: dict = {}  # node -> what stands for it in the shared term
        self.built: dict = {}  # node -> itself over the rewritten arguments (what new is, unless reused)
        self.made: set = set()
        self.reused: dict = {}  # unfolded body -> the let of t that has it
        self.unfolded: dict = {}
        self.key = None  # (reuse, t has lets) node -> what names and runs know it by: its unfolding
        self.aliases: dict = {}  # (alias) a rewritten subterm -> the transparent let that names it
        self._bodies: dict = {}
        self._named: dict = {}  # (name, index) -> the let made for it
        self._twice = 0  # names given to a found value written a second way
        self._alias_of: dict = {}  # (alias) node -> its alias (the first pass's numbers are not kept)
        if not reuse:
            self.names, self.runs = found_names if found_names is not None else found(t)
        else:
            lets = [n for n in T.postorder(t) if n.op == "let"]
            if not lets:
                self.names, self.runs = printed_names(t, bindings)
            else:
                # what is found is found in t unfolded, where E's body and the form's encoder_1
                # are one encoder(1): a repeat is a repeat however the lets were placed
                # a let bound before (``known``) stays a name: what its body repeats is not printed
                opaque = frozenset(let for let in lets if let in known)
                self._unfold(t, opaque)
                for let in lets:
                    self.reused.setdefault(self.unfolded[let.args[0]], let)
                taken = frozenset(let.data[0] for let in lets)
                if alias:
                    # string() writes E's body as it stands (encoder(1) by an alias, not by the
                    # let): found there, in t itself, each found node is one node, one binding
                    self.names, self.runs = printed_names(t, bindings)
                else:
                    self.names, self.runs = printed_names(self.unfolded[t], bindings, frozenset(self.reused), taken,
                                                          opaque)
                    self.key = self.unfolded
                used = {n.data[0].name for n in T.postorder(t) if n.op == "sym"}
                used.update(taken)
                used.update(name for name, _ in self.names.values())
                self.letter = fresh_letter(used)  # for aliases, and names found twice over
        self.alias = alias and bool(self.reused)
        self._wanted = None  # (alias) the subterms that get one: all, until a first pass has met them
        self.term = self._rewrite(t) if self.names or self.reused else t
        if self.alias:
            # Is a let's body written out elsewhere too? Only a pass over the whole term knows: a
            # first pass gives every reused subterm an alias and sees which are met (a let's own
            # body is written out, not its alias), the second makes only those, numbered 1, 2, ...
            met = set(self.postorder())
            wanted = {node for node, a in self._alias_of.items() if a in met}
            self._wanted, self.aliases, self._alias_of = wanted, {}, {}
            self.new, self.built, self._bodies, self._named, self._twice = {}, {}, {}, {}, 0
            self.made = set()
            self.term = self._rewrite(t)

    def body(self, let: Term) -> Term:
        """The body of a let, with the intermediates found in it."""
        if let in self.made or not (self.names or self.reused):  # a found one was built from found parts
            return let.args[0]
        r = self._bodies.get(let)
        if r is None:
            root = let.args[0]
            self._rewrite(root)
            r = self.new[root]
            if r is let or self.alias:
                r = self.built[root]  # its own body, not its own name
            if self.alias and self._wanted is not None:
                r = self.aliases.get(r, r)  # written out elsewhere too, as this alias: the let is that
            self._bodies[let] = r
        return r

    def children(self, node: Term) -> tuple:
        """The arguments of a node of the shared term, a let's being its shared body."""
        return (self.body(node),) if node.op == "let" else node.args

    def _unfold(self, t: Term, opaque) -> None:
        unfolded = self.unfolded
        for node in T.postorder(t):
            if node.op == "let":
                unfolded[node] = node if node in opaque else unfolded[node.args[0]]
            else:
                unfolded[node] = T.rebuild(node, [unfolded[c] for c in node.args])

    def _rewrite(self, root: Term) -> Term:
        new, built, names, runs, reused = self.new, self.built, self.names, self.runs, self.reused
        for node in T.postorder(root, descend=lambda n: n not in new and n.op != "let"):
            if node in new:
                continue
            if node.op == "let" or not node.args:
                new[node] = built[node] = node
                continue
            k = node if self.key is None else self.key[node]
            if k in runs and len(k.args) == len(node.args):  # a sum holding a found sum's summands: that sum, by name
                args, i, starts = [], 0, dict(runs[k])
                while i < len(node.args):
                    h = starts.get(i)
                    hl = None if h is None else new.get(h) if self.key is None else self._named.get(names[h])
                    if hl is not None:
                        args.append(hl)
                        i += len(h.args)
                    else:
                        args.append(new[node.args[i]])
                        i += 1
                r = T.add(*args)
            else:
                r = T.rebuild(node, [new[c] for c in node.args])
            built[node] = r
            let = reused.get(self.unfolded[node]) if reused else None
            if let is not None:  # written out, the body of a let of the term: by its name
                if self.alias:
                    alias = self.aliases.get(r)
                    if alias is None and (self._wanted is None or node in self._wanted):
                        alias = T.let(self.letter, (len(self.aliases) + 1,), r)
                        self.aliases[r] = alias
                        self.made.add(alias)
                    if alias is not None:
                        self._alias_of[node] = alias
                    r = alias or r
                else:
                    r = let
            else:
                name = names.get(k)
                made = self._named.get(name) if name is not None and self.key is not None else None
                if made is not None and made.args[0] is not r:
                    # one value found, written two ways (a flat sum the let split): a name of its
                    # own, so that each is written once however often it is used
                    self._twice += 1
                    name = (self.letter, (self._twice,))
                if name is not None:
                    r = T.let(name[0], name[1], r)
                    self.made.add(r)
                    self._named[name] = r
            new[node] = r
        return new[root]

    def postorder(self, opaque=()):
        """Every node of the shared term once, let bodies included (but those of the lets in
        ``opaque``), children before parents."""
        return T.postorder(self.term, descend=lambda node: node not in opaque, children=self.children)


def share(t: Term) -> Term:
    """``t`` with every found intermediate a named one; ``t`` itself if none is found."""
    return Sharing(t).term


def printed_names(t: Term, bindings: bool = True, named=frozenset(), taken=frozenset(),
                  opaque=frozenset()) -> tuple:
    """The found intermediates a printer names. A printing with its bindings (``show``, ``string``,
    LaTeX, HTML) names all of them, whatever the size of ``t``: a repeat reads the same at depth 2
    as at depth 64 (``S_1 = s encoder_1 Q_1 K_1^t encoder_1^t``), and is read once. A printing on
    one line without them (``text``: messages, labels) names none while ``t`` written out stays
    within ``WRITE_OUT`` nodes, so that it reads on its own, and all of them beyond, so that
    printing stays linear in the graph (the natural ``encoder(64)`` is 3^64 nodes written out)."""
    names, runs = found(t, True, named, taken, opaque)
    if not names or bindings:
        return names, runs
    size: dict = {}
    for node in T.postorder(t):
        size[node] = min(WRITE_OUT + 1, 1 + sum(size[c] for c in node.args))
    return (names, runs) if size[t] > WRITE_OUT else ({}, {})


def has_intermediates(t: Term) -> bool:
    """Whether ``t`` refers to a named intermediate (a ``let``)."""
    return any(n.op == "let" for n in T.postorder(t))
