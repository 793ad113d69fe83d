"""fdsl.base."""
