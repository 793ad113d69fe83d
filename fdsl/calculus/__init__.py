"""fdsl.calculus."""
