"""fdsl.learn."""
