"""Targets of generated code: how the one lowering of ``fdsl.codegen.generated`` is written out for
numpy or for torch.

Vocabulary
----------
target    the library the generated module computes with (``numpy``, ``torch``): its import, its
          runtime helpers (copied into the module), and the few spellings in which the two differ
          (sums along an axis, constant arrays, copies, the operator templates).
dtype     generated code computes in the dtype of its inputs: numpy in float32 when every array
          input is float32, float64 otherwise; torch in the floating dtype its tensor inputs share
          (bfloat16 and float16 too), else their promotion (``torch_runtime``'s doc); a module
          generated with ``--dtype`` casts its inputs to that one. Constants (ones, identities,
          zeros) are built in that dtype (and, for torch, on the inputs' device), once per dtype
          and device.
autocast  torch under ``torch.autocast``: the products (``_matmul``, ``_bmm``, ``_addmm``, the
          grouped ones) take ``_lp``, the autocast dtype, and run in it; everything else stays in
          float32 (``torch_runtime``'s doc).
batch     a constant that varies per example (a ``const`` without a built-in value: ``X0``, ``Y``)
          may carry a leading batch axis, ``(batch, rows, cols)``. Weights and scalars may not.
          The generated code is the same: products are batched matmuls, transposes swap the last
          two axes (``.mT``), rows are the last axis; each gradient is summed over the batch (the
          gradient of the summed loss), a part of it that no example changes counted once per
          example.
pieces    numpy goes through a large batch a few examples at a time (``_piece``, ``_in_pieces``),
          summing the pieces' gradients: arrays of a whole batch are allocated from fresh pages
          (glibc's malloc maps anything above 128 KiB afresh) and fall out of the caches, which
          costs more than the Python of a sweep per piece. torch keeps its own allocator: whole.

Everything else, the order of computation, the bracketing of products, what is shared, is the
lowering's and the same for every target, so the differential fuzzer of the numpy target covers
the torch target's structure too.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from ..numbers import numpy_runtime
from . import numpy_helpers

DTYPES = ("float32", "float64")


class Target:
    """The numpy target; ``TorchTarget`` overrides what differs."""

    name = "numpy"
    imports = ("import numpy as np",)
    device = ""  # extra arguments of the constants (torch: the device)
    pieces = True  # a large batch is cut into pieces (see the module doc)
    folds_batches = False  # (b, n, d) @ (d, k) is one matrix product (torch), not b of them (numpy)
    fused_layernorm = False  # layernorm keeps its row statistics for a fused backward (torch)
    autocast = False  # products run in torch.autocast's dtype where it is on (torch_runtime's doc)
    origin = "fdsl.numbers.numpy_runtime"  # where the runtime helpers come from, for the reader

    def dtype_code(self, dtype) -> str:
        return "None" if dtype is None else "np.%s" % dtype

    def sum_axis(self, expr: str, axis: int) -> str:
        return "%s.sum(axis=%d, keepdims=True)" % (expr, axis)

    def constant(self, make: str, args: str) -> str:
        """``np.ones(shape)``, ``np.zeros(shape)``, ``np.eye(rows)`` in the working dtype; ``causal``:
        the causal mask of size ``args`` (0 on and below the diagonal, -inf above)."""
        if make == "causal":
            return "np.triu(np.full((%s, %s), -np.inf, dtype=_dt), 1)" % (args, args)
        return "np.%s(%s, dtype=_dt)" % (make, args)

    def template(self, op_spec, op: str):
        """The operator's template for this target (None: it has none)."""
        return op_spec.numpy

    def runtime(self, ids: bool = False) -> str:
        """The helpers' source, without their module docstring and imports; ``ids``: with the
        helpers of onehot constants given as ids (only the modules that read ids carry them)."""
        return _body(inspect.getsource(numpy_runtime)) + "\n\n\n" + _with_ids(_body(inspect.getsource(numpy_helpers)),
                                                                             ids)


class TorchTarget(Target):
    name = "torch"
    imports = ("import ctypes", "import os", "import platform", "import time", "", "import torch")
    device = ", device=_dev"
    pieces = False
    folds_batches = True
    fused_layernorm = True
    autocast = True
    origin = "fdsl.codegen.torch_runtime"

    def dtype_code(self, dtype) -> str:
        return "None" if dtype is None else "torch.%s" % dtype

    def sum_axis(self, expr: str, axis: int) -> str:
        return "%s.sum(dim=%d, keepdim=True)" % (expr, axis)

    def constant(self, make: str, args: str) -> str:
        if make == "eye":
            return "torch.eye(%s, dtype=_dt, device=_dev)" % args
        if make == "causal":
            return "torch.triu(torch.full((%s, %s), float('-inf'), dtype=_dt, device=_dev), 1)" % (args, args)
        return "torch.%s(%s, dtype=_dt, device=_dev)" % (make, args)

    def template(self, op_spec, op: str):
        own = _TORCH_TEMPLATES.get(op)
        if own is not None:
            return own
        return _translate(op_spec.numpy)

    def runtime(self, ids: bool = False) -> str:
        source = (Path(__file__).with_name("torch_runtime.py")).read_text()
        return _with_ids(_body(source), ids)


TARGETS = {"numpy": Target(), "torch": TorchTarget()}

# the built-in operators with a torch spelling of their own
_TORCH_TEMPLATES = {
    "m": "torch.relu({0})",
    # issue 12's operators (rows counted from the end, so a batch of matrices works row by row)
    "sigmoid": "torch.sigmoid({0})",
    "gelu": "torch.nn.functional.gelu({0})",
    "dtanh": "(1.0 - torch.tanh({0}) ** 2) * {1}",
    "dsigmoid": "(torch.sigmoid({0}) * (1.0 - torch.sigmoid({0})) * {1})",
    "dgelu": "_dgelu({0}, {1})",  # torch's fused GELU backward
    "ddgelu": "(torch.exp(-0.5 * {0} * {0}) * 0.3989422804014327 * (2.0 - {0} * {0}) * {1})",
    "rowsum": "{0}.sum(dim=-1, keepdim=True)",
    "rowmean": "{0}.mean(dim=-1, keepdim=True)",
    "rowvar": "{0}.var(dim=-1, keepdim=True, unbiased=False)",
    "layernorm": "torch.nn.functional.layer_norm({0}, {0}.shape[-1:], eps=1e-5)",
    "dlayernorm": "_dlayernorm({0}, {1})",
    "ddlayernorm": "_ddlayernorm({0}, {1}, {2})",
    "logsoftmax": "torch.log_softmax({0}, dim=-1)",
    "dlogsoftmax": "({1} - (torch.softmax({0}, dim=-1) * {1}).sum(dim=-1, keepdim=True))",
}


def _torch_numpy_names() -> set:
    """The numpy functions the torch runtime's ``_np`` namespace provides (read off its source)."""
    tree = ast.parse((Path(__file__).with_name("torch_runtime.py")).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_np")
    names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
    for node in cls.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                names |= {e.id for e in getattr(target, "elts", [target]) if isinstance(e, ast.Name)}
    return names


_TORCH_NUMPY: set = set()


def _translate(template):
    """A numpy template in torch: ``np.f`` becomes the runtime's ``_np.f`` when it has one (None
    when it has not: the operator cannot be lowered for torch)."""
    if template is None:
        return None
    if not _TORCH_NUMPY:
        _TORCH_NUMPY.update(_torch_numpy_names())
    names = re.findall(r"\bnp\.(\w+)", template)
    if any(n not in _TORCH_NUMPY for n in names):
        return None
    return re.sub(r"\bnp\.", "_np.", template)


IDS_MARK = "# ---- ids: copied only into the modules of programs with onehot constants"


def _with_ids(source: str, ids: bool) -> str:
    """A runtime's source with its last section, the helpers of ids (after ``IDS_MARK``), or without."""
    head, mark, tail = source.partition(IDS_MARK)
    return source if ids or not mark else head.rstrip()


def _body(source: str) -> str:
    """A module's source from its first definition on (no docstring, no imports)."""
    tree = ast.parse(source)
    first = next(n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                 and not isinstance(n, (ast.Import, ast.ImportFrom)))
    return "\n".join(source.splitlines()[first.lineno - 1:]).rstrip()
