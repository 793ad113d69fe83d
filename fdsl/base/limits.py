"""The default limits of the house, in one place: where a rewrite, a picture or a run stops with a
reason instead of running on. Each has a command-line flag to change it; the command line reads
them from here without importing the machinery they limit.

step limit   rewrite steps of one ruleset before it is declared non-terminating
size limit   term cells one rewrite may build before it is declared growing without end
max nodes    boxes of a diagram, refused before any layout
max edges    edges of a diagram, likewise
time limit   seconds a training run or a conjugate-gradient solve is estimated to take (its count
             times the measured cost of one step or iteration) before it is refused unstarted, and
             the seconds a training run or a flow may take as it goes (its clock, checked at every
             step and iteration)
"""

DEFAULT_STEP_LIMIT = 2_000_000
# The size limit counts term cells: each new node with its operands (a flat sum of a million
# summands is a million cells; interned terms live as long as the process, so cells are memory, about
# 10 bytes each). One rewrite may build this many; one step alone a fiftieth of it, so a rule that
# doubles its term (m(?A) => m(?A + ?A)) stops within a second or two instead of filling memory.
# The fully expanded normal form of a four-layer encoder builds about 24 million.
DEFAULT_SIZE_LIMIT = 50_000_000
# One flat sum or product may hold at most a fiftieth of the size limit as operands. Definitions
# build terms without the engine (f(k) = f(k-1) + f(k-1) doubles a flat sum at every k, 2^40
# summands at f(40)); this stops them within a second, at a million, instead of filling memory.
WIDTH_SHARE = 50
# One call of a definition from a statement may make at most a fiftieth of the step limit of calls
# (40,000 by default; the memo's answers do not count): f(k, Z) = f(k-1, m(Z)) + f(k-1, a(Z)) makes
# 2^41 distinct calls for f(40, X) and stops within seconds instead of building for hours. A
# program's calls are its layers and blocks: hundreds, not tens of thousands.
CALL_SHARE = 50

# dot lays out 300 nodes and 600 edges of a term graph in a few seconds; the depth-8 normal form
# that took it 276 s had 405 nodes and many times more edges. A picture past these is unreadable.
DEFAULT_MAX_NODES = 300
DEFAULT_MAX_EDGES = 600

# A training run of N steps, or conjugate gradients with an iteration limit of N (given or 2N + 50),
# is refused when N times the measured cost of one step (iteration) exceeds this many seconds, and
# stopped when it has run this long: an hour.
DEFAULT_TIME_LIMIT = 3_600.0
