"""The display of a program: its declarations and definitions, as a person would write them.

Vocabulary
----------
declaration  a ``dim``, ``const``, ``scalar`` or ``weight`` line, rebuilt from what the program
             declared, in declaration order; neighbours of one kind and shape share a line
             (``const X, Y : n x d``).
definition   a definition as it was written (``encoder(L) = layer(L-1, encoder(L-1))``), each
             clause once, in the order they are now in force.
"""

from __future__ import annotations

import html

from ..core.printers import text
from ..core.terms import init_text


def _shape(shape) -> str:
    return "%s x %s" % shape


def declarations(program) -> list:
    """The program's declarations as lines of the language."""
    lines, dims = [], []
    last = None  # (kind, shape) of the line being grown, and its names
    for name in program.declared_at:
        if name in program.dims:
            value = program.dims[name]
            dims.append(name if value is None else "%s = %d" % (name, value))
            continue
        if name in program.families:
            fam = program.families[name]
            kind, shape, value = fam.kind, fam.shape, fam.value if fam.init is None else init_text(fam.init)
            shown = "%s[%s]" % (name, ", ".join(fam.indices))
        elif name in program.symbols:
            symbol = program.symbols[name].data[0]
            kind, shape, value = symbol.kind, program.symbols[name].data[1], symbol.value
            value = value if symbol.init is None else init_text(symbol.init)
            shown = name
        else:
            continue
        if value is not None:  # a value is written per name: const C : n x 1 = ones, weight g : 1 x d = ones
            written = text(value) if not isinstance(value, str) else value
            lines.append("%s %s%s = %s" % (kind, shown, "" if kind == "scalar" else " : " + _shape(shape), written))
            last = None
        elif last is not None and last[0] == (kind, shape):
            last[1].append(shown)
            lines[-1] = "%s %s : %s" % (kind, ", ".join(last[1]), _shape(shape))
        else:
            last = ((kind, shape), [shown])
            lines.append("%s %s : %s" % (kind, shown, _shape(shape)))
    if dims:
        lines.insert(0, "dim " + ", ".join(dims))
    return lines


def definitions(program) -> list:
    """The definitions in force, as written."""
    return [clause for name, clauses in program.sources.items()
            if name in program.definitions or name in program.clauses for clause in clauses]


def describe(program) -> str:
    decl, defs = declarations(program), definitions(program)
    head = "# %s: %d declarations, %d definitions" % (program.filename, len(decl), len(defs))
    return "\n".join([head] + decl + ([""] if decl and defs else []) + defs)


def describe_html(program) -> str:
    decl, defs = declarations(program), definitions(program)
    parts = ['<div class="fdsl-program"><b>%s</b>' % html.escape(program.filename)]
    for title, lines in (("declarations", decl), ("definitions", defs)):
        if lines:
            parts.append("<div><i>%s</i><pre>%s</pre></div>" % (title, html.escape("\n".join(lines))))
    parts.append("</div>")
    return "".join(parts)
