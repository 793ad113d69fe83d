"""Generated code: the lowering of normal forms to a statement IR, the passes over it, the writers
that spell it as a numpy or torch module, the runtimes copied into those modules, and the gradients
of a program computed through them."""
