"""fdsl.core."""
