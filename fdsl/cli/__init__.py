"""The ``fdsl`` command: one module per command, ``main`` in ``fdsl.cli.main``."""

from .main import main

__all__ = ["main"]
