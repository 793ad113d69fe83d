"""The values of symbols: value files, random values, ``eval(E)`` and ``save``.

Vocabulary
----------
values      numeric values of symbols keyed by printed name (``X``, ``Q_0``): a program's
            ``Values``, a dict that also creates random values on demand (``random``).
value file  an ``.npz`` file of arrays keyed by printed name (``values "f.npz"``, ``--values``),
            read as untrusted input: no pickles, sizes checked before anything is allocated.
random      ``random SEED``: values drawn per symbol from a generator seeded by (seed, crc32 of
            the printed name), so ``Q_7`` gets the same value whichever symbols were drawn first.
save        ``save "f.npz" EXPR`` writes a value (or gradients by name) all or nothing; other
            extensions are written by the savers of the floors above (``SAVERS``: ``.csv`` for the
            logs of training runs, added by ``fdsl.learn.watch``).

The statements ``values``, ``random`` and ``save`` and the function ``eval`` are defined here and
added to the language's tables by the composition root.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from ..base.errors import FdslError
from ..base.files import Write, target_of
from ..base.inputs import check_allocation, regular_file
from ..core.functions import as_term, function
from ..core.printers import text
from ..core.terms import Symbol, Term, sym
from ..lang.statements import STATEMENTS, _args, _leftmost, _split_leading_string, _string_arg, statement
from .numpy_eval import Evaluator, conform, initial_value

# what ``save "FILE.EXT" ...`` writes for an extension other than .npz: ext -> saver(program,
# nodes, values) returning the Write effect (fdsl.learn.watch adds ".csv")
SAVERS: dict[str, Callable] = {}


class Values(dict):
    """The values of a program's symbols by printed name (``program.values``).

    Holds the arrays given by files and those drawn at random so far. With a seed, looking up a
    symbol that has no value yet (``values["Q_7"]``) draws it, so family members that a program
    reaches get values without being listed anywhere.
    """

    def __init__(self, program):
        super().__init__()
        self.program = program
        self.seed: Optional[int] = None
        self.sources: dict = {}  # name -> file it was read from, for messages
        self.generated: set = set()

    def __missing__(self, name):
        if self.seed is None:
            raise KeyError(name)
        term = symbol_term(self.program, name)
        if term is None or term.op != "sym" or term.data[0].value is not None:
            raise KeyError(name)
        symbol, shape = term.data
        dims, origin = self.dims()
        ev = Evaluator(self, dims, origin)
        return self.generate(symbol, ev.shape(shape, "drawing random values for %s" % name))

    def generate(self, symbol: Symbol, shape: tuple) -> np.ndarray:
        """Draw the random value of ``symbol``: normal entries, weights scaled by 1/sqrt(rows), or a
        weight's declared initial value (``Symbol.init``)."""
        name = symbol.printed()
        check_allocation(8 * int(np.prod(shape, dtype=object)), "random values for %s, %s floats,"
                         % (name, " x ".join(map(str, shape))))
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        if symbol.onehot:  # ids: one in [0, v) per row
            self[name] = array = rng.integers(0, shape[1], size=shape[0])
            self.generated.add(name)
            return array
        if symbol.init is not None:  # declared: weight g : 1 x d = ones, W : d x d = normal(0.02)
            array = initial_value(symbol, shape, rng)
        else:
            array = rng.standard_normal(shape)
            if symbol.kind == "weight":
                array /= np.sqrt(shape[0])
        self[name] = array
        self.generated.add(name)
        return array

    def dims(self) -> tuple:
        """The program's dim sizes, with those of dims without one read off the given arrays;
        checks every given array against its declaration. Returns (dims, origin)."""
        program = self.program
        dims = {k: v for k, v in program.dims.items() if v is not None}
        origin: dict = {}
        unknown = []
        for name in [n for n in self if n not in self.generated]:
            source = self.sources.get(name)  # errors lead with the file, unless a statement is at fault
            term = symbol_term(program, name)
            if term is None:
                unknown.append(name)
                continue
            if term.op != "sym" or term.data[0].kind == "dim":
                raise FdslError("%s (in %s) is a dim, not a symbol: its size comes from its declaration "
                                "or from the shapes of the arrays" % (name, source or "the values"), file=source)
            symbol, shape = term.data
            if symbol.value is not None:
                raise FdslError("%s (in %s) has a value in its declaration (%s); it cannot also be given"
                                % (name, source or "the values",
                                   symbol.value if isinstance(symbol.value, str) else text(symbol.value)),
                                file=source)
            try:
                self[name] = conform(name, self[name], symbol, shape, dims, origin, source or "")
            except FdslError as e:
                e.file = e.file or source
                raise
        if unknown:
            files = sorted({self.sources.get(n, "the values") for n in unknown})
            raise FdslError("%s in %s match%s no declared symbol (declared: %s)"
                            % (", ".join(unknown), ", ".join(files), "" if len(unknown) > 1 else "es",
                               _declared_names(program)), file=self.sources.get(unknown[0]))
        return dims, origin


def _declared_names(program) -> str:
    names = [n for n, t in program.symbols.items() if t.data[0].value is None]
    names += ["%s[%s]" % (n, ", ".join(f.indices)) for n, f in program.families.items() if f.value is None]
    return ", ".join(names) or "nothing"


_MEMBER = re.compile(r"(.+?)((?:_\d+)+)")


def symbol_term(program, name: str) -> Optional[Term]:
    """The symbol leaf a printed name stands for (``Q_0`` for the family ``Q``), or None."""
    if name in program.symbols:
        return program.symbols[name]
    if name in program.dims:
        return program.dim_term(name)
    m = _MEMBER.fullmatch(name)
    if m and m.group(1) in program.families:
        family = program.families[m.group(1)]
        index = tuple(int(i) for i in m.group(2).split("_")[1:])
        if len(index) == len(family.indices):
            return sym(Symbol(m.group(1), index, family.kind, family.value, family.scalar, init=family.init),
                       family.shape)
    return None


def program_values(program) -> Values:
    """The program's ``Values``, made on first use."""
    if program.values is None:
        program.values = Values(program)
    return program.values


def _declares_anything(program) -> bool:
    return bool(program.symbols or program.families or program.dims)


def load_values(program, path) -> None:
    """Take symbol values from an .npz file (arrays keyed by printed name: ``X``, ``Q_0``)."""
    path = Path(path)
    arrays = read_npz(path)
    store = program_values(program)
    for name, array in arrays.items():
        store[name] = array
        store.sources[name] = str(path)
        store.generated.discard(name)
    # when the program is read after its values (fdsl run --values), nothing is declared yet:
    # the arrays are then checked when they are first used, and by check_values
    if _declares_anything(program):
        store.dims()


# The most arrays a values file may hold: a program names hundreds of symbols, not tens of thousands.
# Counted from the archive's last record before its directory is read (300,000 members, each
# named X.npy, would otherwise be parsed, all of them, before the first duplicate is seen).
MAX_MEMBERS = 10_000
_END = b"PK\x05\x06"  # the zip's end-of-central-directory record: its entry count at offset 10


def _member_count(path: Path, size: int) -> Optional[int]:
    """The number of members the zip archive at ``path`` says it holds (65535 or more: 65535), or None
    where its end record is not found (zipfile then says what is wrong)."""
    with open(path, "rb") as f:
        tail = min(size, 22 + 65535)  # the record, after which a comment of at most 64 KiB
        f.seek(size - tail)
        data = f.read(tail)
    at = data.rfind(_END)
    if at < 0 or at + 12 > len(data):
        return None
    return int.from_bytes(data[at + 10:at + 12], "little")


def _check_npz(path: Path) -> None:
    """Before anything is read: a regular file that fits in memory, and a zip archive whose arrays'
    headers (shape and type, read without their data) are real matrices that fit in memory too
    (a compressed archive can unpack to far more than its size)."""
    st = regular_file(path, "values file")
    check_allocation(st.st_size, "reading this values file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise FdslError("this values file holds one unnamed array (an .npy file); values need names: "
                        "write them with np.savez(path, X=..., Q_0=...)", file=str(path))
    if not zipfile.is_zipfile(path):
        raise FdslError("not an .npz archive of arrays (write one with np.savez(path, X=..., Q_0=...))",
                        file=str(path))
    count = _member_count(path, st.st_size)
    if count is not None and count > MAX_MEMBERS:
        raise FdslError("this values file holds %s%d arrays, more than the %d a values file may hold (the member "
                        "limit); write only the program's symbols" % ("at least " if count == 0xFFFF else "", count,
                                                                       MAX_MEMBERS), file=str(path))
    total = 0
    members: dict = {}  # name -> the member that gives it
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name in members:  # numpy would keep one of them without a word
                first = members[name]
                both = ("two members named %s" % first if first == info.filename
                        else "both %s and %s" % (first, info.filename))
                raise FdslError("this values file gives %s twice: %s; write each name once (np.savez(path, "
                                "X=..., Q_0=...))" % (name, both), file=str(path))
            members[name] = info.filename
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                else:
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            if dtype.kind not in "biuf":
                raise FdslError("%s in this values file must hold real numbers, not %s" % (name, dtype), file=str(path))
            if len(shape) > 3:  # 3: a batch of examples of a constant (checked against its declaration)
                raise FdslError("%s in this values file has shape %s; values are matrices (or batches of them, "
                                "(batch, rows, cols), for constants)" % (name, shape), file=str(path))
            total += int(np.prod(shape, dtype=object)) * max(dtype.itemsize, 8)  # read, then made float64
    try:
        check_allocation(total, "the arrays of this values file")
    except FdslError as e:
        raise FdslError(e.message, file=str(path)) from None


def read_npz(path: Path) -> dict:
    """The arrays of an .npz file; an FdslError naming the file if it cannot be read as one."""
    try:
        _check_npz(path)
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FdslError("cannot read this values file: no such file", file=str(path)) from None
    except OSError as e:
        raise FdslError("cannot read this values file: %s" % (e.strerror or e), file=str(path)) from None
    except FdslError:
        raise
    except Exception as e:  # numpy raises several kinds for a file that is not an array file
        raise FdslError("not an .npz archive of arrays (%s)" % _reason(e), file=str(path)) from None
    if isinstance(data, np.ndarray):
        raise FdslError("this values file holds one unnamed array (an .npy file); values need names: "
                        "write them with np.savez(path, X=..., Q_0=...)", file=str(path))
    try:
        with data:
            arrays = {name: data[name] for name in data.files}
    except Exception as e:
        raise FdslError("this values file is damaged (%s)" % _reason(e), file=str(path)) from None
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise FdslError("%s in this values file must hold real numbers, not %s" % (name, array.dtype),
                            file=str(path))
    return arrays


def _reason(e: Exception) -> str:
    return str(e) or type(e).__name__


def random_values(program, seed: int) -> None:
    """Give every symbol without a value random ones on demand: normal entries, weights / sqrt(rows)."""
    if not isinstance(seed, int) or seed < 0:
        raise FdslError("a seed must be a whole number >= 0, not %s" % seed, file="--random")
    store = program_values(program)
    for name in store.generated:  # values drawn with an earlier seed
        del store[name]
    store.generated.clear()
    store.seed = seed
    if _declares_anything(program):
        dims, origin = store.dims()
        missing = [name for name, size in program.dims.items() if size is None and name not in dims]
        if missing:
            raise FdslError("random values need the size of every dim, and %s ha%s none: declare %s "
                            "(dim %s = 8) or give values whose shapes have %s"
                            % (", ".join(missing), "ve" if len(missing) > 1 else "s",
                               "sizes" if len(missing) > 1 else "one", missing[0],
                               "them" if len(missing) > 1 else "it"))


def check_values(program) -> None:
    """Check the program's given values against its declarations (unknown names, shapes)."""
    if program.values is not None:
        program.values.dims()


def evaluate_in(program, term: Term, evaluator: Optional[Evaluator] = None) -> np.ndarray:
    """The value of ``term`` with the program's values and dims."""
    if evaluator is None:
        evaluator = program_evaluator(program)
    return evaluator.value(term)


def program_evaluator(program) -> Evaluator:
    """An evaluator over the program's current values (share one to evaluate many terms)."""
    if program.values is None:
        return Evaluator({}, program.dims)
    dims, origin = program.values.dims()
    return Evaluator(program.values, dims, origin)


# ---- the language: eval(E) and save ----------------------------------------------------------------


class Numeric:
    """A numeric result: ``show`` prints it as a number (scalars) or an array."""

    def __init__(self, array: np.ndarray, term: Optional[Term] = None):
        self.array = array
        self.term = term

    @property
    def scalar(self) -> bool:
        return self.array.shape == (1, 1) and (self.term is None or self.term.scalar)

    def show(self) -> str:
        if self.scalar:
            return "%.10g" % self.array[0, 0]
        return np.array2string(self.array, precision=6, max_line_width=120)

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)

    def __repr__(self):
        return "Numeric(%s)" % self.show()


@function("eval(E)", "the numeric value of E, from 'values \"FILE.npz\"' or 'random SEED'")
def _eval(program, e):
    term = as_term(e, "the argument of eval")
    return Numeric(evaluate_in(program, term), term)


def _key(term: Term) -> str:
    """The name an evaluated term is saved under: its symbol's or binding's name, else ``value``."""
    if term.op == "sym":
        return term.data[0].printed()
    if term.op == "let":
        name, index = term.data
        return name + "".join("_%d" % i for i in index)
    return "value"


def _to_array(program, value, evaluator) -> tuple:
    """(name, array) for one value to save."""
    if isinstance(value, Numeric):
        return (_key(value.term) if value.term is not None else "value"), value.array
    if isinstance(value, np.ndarray):
        return "value", np.asarray(value, dtype=np.float64)
    if isinstance(value, (Term, int, Fraction)) and not isinstance(value, bool):
        term = as_term(value, "the value to save")
        return _key(term), evaluate_in(program, term, evaluator)
    raise FdslError("save writes matrices, not %s" % type(value).__name__)


def save_effect(program, path, value) -> Write:
    """The effect of ``save "FILE.npz" EXPR``: the value is computed now (so errors point at the
    statement) and written, atomically, only when the whole program has run."""
    evaluator = None
    if isinstance(value, dict):
        arrays = {}
        for name, item in value.items():
            if isinstance(item, (Term, int, Fraction)) and evaluator is None:
                evaluator = program_evaluator(program)
            arrays[str(name)] = _to_array(program, item, evaluator)[1]
        if getattr(value, "sign", None):  # gradients say which sign they hold (fdsl.codegen.grads)
            arrays["_sign"] = np.array(value.sign)
    else:
        if isinstance(value, (Term, int, Fraction)):
            evaluator = program_evaluator(program)
        name, array = _to_array(program, value, evaluator)
        arrays = {name: array}

    return Write(Path(path), npz_writer(arrays))


def npz_writer(arrays: dict):
    """``write(tmp)`` for a ``Write`` effect: the arrays by name, as one .npz file."""

    def write(tmp: Path):
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a bare name
            np.savez(f, **arrays)

    return write


# ---- the statements ----------------------------------------------------------------------------


@statement("values", 'values "FILE.npz"', "take the numeric values of symbols from an .npz file (keys: X, Q_0, ...)")
def _values(program, st):
    (path,) = _args(program, st, 1, 1, 'values "FILE.npz"')
    load_values(program, program.resolve_path(_string_arg(path, "a values file")))


@statement("random", "random SEED", "give every symbol without a value random entries (weights scaled by 1/sqrt(rows))")
def _random(program, st):
    (seed,) = _args(program, st, 1, 1, "random SEED")
    from ..core.functions import as_int

    random_values(program, as_int(seed, "a seed"))


_LOOSER_THAN_A_PRODUCT = ("add", "sub", "neg", "hadamard", "div")  # the operators juxtaposition binds tighter than


@statement("save", 'save "FILE.npz" EXPR  or  save "FILE.csv" RUN[, RUN...]', "write the value of EXPR (an array, "
           "or gradients by name) to an .npz file; the logs of training runs (e = train(...)) to a CSV file")
def _save(program, st):
    items = list(st.items)
    if items and items[0].kind in _LOOSER_THAN_A_PRODUCT:
        # save "x.npz" X + Y reads as ("x.npz" X) + Y: the file name binds to the first factor only
        spine = items[0]
        while spine.kind in _LOOSER_THAN_A_PRODUCT or spine.kind == "mul":
            spine = spine.args[0]
        if spine.kind == "string":
            raise FdslError('the expression after the file name needs parentheses: save "%s" (...) with the '
                            'whole expression inside them; without, the name reads as a factor of its first '
                            'term, "%s" X + Y as ("%s" X) + Y' % ((spine.value,) * 3), line=spine.line, col=spine.col)
    if items and items[0].kind == "mul" and _leftmost(items[0]).kind == "string":
        # save "g.npz" grad(w) parses as a product of the string and the value: split it
        items = _split_leading_string(items[0]) + items[1:]
    csv = len(items) > 1 and items[0].kind == "string" and items[0].value.endswith(".csv")
    st = type(st)(st.kind, st.line, st.col, st.name, items=items)
    path, *values = _args(program, st, 2, len(items) if csv else 2, STATEMENTS["save"].usage)
    path = program.output_path(_string_arg(path, "a file name"), st.line, st.col)
    try:
        target_of(path)  # checked now, so the message points at the statement
    except FdslError as e:
        raise FdslError(e.message, line=st.line, col=st.col) from None
    if csv:
        if program.options.get("train") is not False:  # under fdsl train the runs were skipped
            program.effects.append(SAVERS[".csv"](program, path, items[1:], values))
        return
    program.effects.append(save_effect(program, path, values[0]))
