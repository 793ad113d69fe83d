"""The calculus of forms, beside the rewriting it uses through a rule book: the manual's verbs
(forms), reverse mode (backprop), and the symbolic gradients of a normal form (gradients)."""
