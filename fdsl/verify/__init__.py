"""fdsl.verify."""
