"""fdsl.rewrite."""
