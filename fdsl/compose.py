"""The composition root: the one place that imports every module adding a function or a statement
to the language. Nothing else loads modules by name; the floors below never import upwards
(``fdsl.base.assembly`` says how ``Program`` reaches this module without importing it).

Each import below fills a table of a lower floor as it runs (``@function``, ``@statement``); the
pictures' functions are handed to ``fdsl.base.assembly.set_pictures`` for the notebook's
conveniences below them (``Term.diagram``, ``Program.diagram``, ``Program.deps``).
"""

from __future__ import annotations

from .base import assembly


def assemble() -> None:
    """The whole language: the verbs, the numbers, the pictures, the metrics and training."""
    from .calculus import forms  # noqa: F401
    from .codegen import grads  # noqa: F401
    from .lang import statements  # noqa: F401
    from .learn import flow, metrics, train, watch  # noqa: F401
    from .numbers import numpy_eval, values  # noqa: F401
    from .pictures import graphviz
    from .verify import check

    # the pictures that Term.diagram, Program.diagram and Program.deps show, below the pictures' floor
    assembly.set_pictures(diagram=graphviz.notebook_diagram, deps=graphviz.notebook_deps)
    # a user's rule file is checked numerically as it is loaded (fdsl.lang.rules, a floor below)
    assembly.set_rule_checker(check.check_loaded)
