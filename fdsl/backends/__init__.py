"""Backends: lowering terms to numpy (evaluation, gradients, generated code) and to Graphviz."""
