"""fdsl.lang."""
