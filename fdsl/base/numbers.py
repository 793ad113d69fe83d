"""Numbers: exact rationals that must fit a float64.

Vocabulary
----------
number   a ``Fraction``: numbers in programs and terms are exact, and evaluate as float64.
range    a number whose magnitude is beyond float64's (about 1.8e308), or whose exact digits
         would be beyond it (a denominator of more than 1100 bits), or a number other than 0 smaller
         than float64's least normal number (about 2.2e-308: below it float64 loses digits, and
         below 4.9e-324 it is 0), is out of range. Checks happen
         before digits are expanded, so ``10^(10^10)`` is refused at once instead of computed for
         hours.
"""

from __future__ import annotations

import sys
from fractions import Fraction

_FLOAT_MAX = Fraction(int(sys.float_info.max))
_FLOAT_MIN = Fraction(sys.float_info.min)  # the least normal float64, about 2.2e-308
_FLOAT_BITS = 1100  # numerator or denominator beyond this many bits: no float64 near it
OUT_OF_RANGE = "out of range: numbers must fit a float64 (magnitude at most about 1.8e308, not below 1e-308)"


def number_problem(value: Fraction):
    """Why an exact number is refused (beyond float64's range), or None."""
    if abs(value) > _FLOAT_MAX or value.denominator.bit_length() > _FLOAT_BITS or 0 < abs(value) < _FLOAT_MIN:
        return OUT_OF_RANGE
    return None


def power_problem(base: Fraction, exponent: int):
    """Why ``base ** exponent`` is refused, before computing it, or None."""
    if base in (0, 1, -1) or exponent == 0:
        return None
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length(), 2) - 1
    if bits * abs(exponent) > _FLOAT_BITS:
        return ("out of range: %s to the power %s is beyond float64 (magnitude about 1e-308 to 1.8e308)"
                % (_brief(base), exponent))
    return None


def _brief(value: Fraction) -> str:
    """``value`` for a message: exact when short, else as a float (1e-200, not 201 digits)."""
    text = str(value)
    return text if len(text) <= 24 else "%.6g" % float(value)


