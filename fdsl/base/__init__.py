"""The ground floor: what every other floor stands on and nothing of fdsl's own below it.

errors (``FdslError`` with file:line:col), numbers (exact rationals kept in float64's range),
inputs (untrusted files read with a size budget, the memory budget), files (all-or-nothing
writes), limits (the default limits and their flags), estimate
(long work refused on its measured time estimate), progress (a progress line on a terminal),
resources (where the grammar and the stdlib are), assembly (how the composition root is reached).
"""
