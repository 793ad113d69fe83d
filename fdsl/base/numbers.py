"""Numbers: exact rationals that must fit a float64.

Vocabulary
----------
number   a ``Fraction``: numbers in programs and terms are exact, and evaluate as float64.
range    a number whose magnitude is beyond float64's (about 1.8e308), or whose exact digits
         would be beyond it (a denominator of more than 1200 bits), or a number other than 0 that
         float64 rounds to 0 (below its least subnormal number, about 4.9e-324), is out of range.
         Numbers between that and the least normal one (about 2.2e-308: ``1e-308``) are float64
         numbers with fewer digits, and allowed. Checks happen
         before digits are expanded, so ``10^(10^10)`` is refused at once instead of computed for
         hours.
"""

from __future__ import annotations

import sys
from fractions import Fraction

_FLOAT_MAX = Fraction(int(sys.float_info.max))
# Half the least subnormal float64 (2^-1074): anything larger in magnitude rounds to a float64
# other than 0; this or less rounds to 0 and is no longer the number written.
_FLOAT_MIN = Fraction(1, 2 ** 1075)
# Numerator or denominator beyond this many bits: no float64 near it (2^-1074 takes 1074 bits, and
# a subnormal written with 17 digits, 4.9406564584124654e-324, a denominator of 10^340: 1130 bits).
_FLOAT_BITS = 1200
# A power whose base has b + 1 bits is at least 2^(b * exponent) in magnitude (or at most its
# inverse): beyond float64 once b * exponent passes 1100 (2^1100 > 1.8e308, 2^-1100 < 4.9e-324).
_POWER_BITS = 1100
RANGE = "magnitude at most about 1.8e308, and 0 or at least about 4.9e-324"
OUT_OF_RANGE = "out of range: numbers must fit a float64 (%s)" % RANGE


def number_problem(value: Fraction):
    """Why an exact number is refused (beyond float64's range), or None."""
    if abs(value) > _FLOAT_MAX or value.denominator.bit_length() > _FLOAT_BITS or 0 < abs(value) <= _FLOAT_MIN:
        return OUT_OF_RANGE
    return None


def power_problem(base: Fraction, exponent: int):
    """Why ``base ** exponent`` is refused, before computing it, or None."""
    if base in (0, 1, -1) or exponent == 0:
        return None
    bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length(), 2) - 1
    if bits * abs(exponent) > _POWER_BITS:
        return ("out of range: %s to the power %s is beyond float64 (%s)"
                % (_brief(base), exponent, RANGE))
    return None


def _brief(value: Fraction) -> str:
    """``value`` for a message: exact when short, else as a float (1e-200, not 201 digits)."""
    text = str(value)
    return text if len(text) <= 24 else "%.6g" % float(value)


