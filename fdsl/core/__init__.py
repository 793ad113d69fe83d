"""The core: terms and what reads them.

ops (the one operator table), terms (immutable, hash-consed terms), alpha (renaming bound
names), share (the shared nodes of a term graph and their names), normal (reading a normal form),
printers and layout (text, string, LaTeX, HTML), functions (the table of the language's functions).
"""
