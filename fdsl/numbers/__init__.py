"""Numbers: the values of terms (evaluation in numpy, with forward-mode tangents), value files and
random values, and the numpy functions of the operators."""
