"""The torch runtime: the helpers that code generated with ``fdsl codegen --target torch`` calls.

fdsl never imports this module: its source is copied into every generated torch module (the way
``numpy_runtime`` is copied into numpy ones), so a generated module needs torch and nothing else.
The definitions are those of ``fdsl.numbers.numpy_runtime`` (DESIGN.md), written for tensors of
any device and dtype, with an optional leading batch axis (``...`` below):

- ``_softmax(A)``: the softmax of each row (the last axis).
- ``_mm(A, B) = [A > 0] o B`` and ``_aa_given(S, B) = S o (B - rowsum(S o B) 1^t)`` with
  ``S = a(A)``: the derivatives of relu and softmax at A applied to B.
- ``_trace(A)``: the trace of a matrix as a number, or of each matrix of a batch as a
  ``(batch, 1, 1)`` tensor (so that it scales its own example); ``_trace_product(A, B)`` that of
  ``A @ B``, without the product.
- Numbers (``_number``, ``_scalar``): a scalar the sweep makes (a trace, a scalar operator's value)
  or reads (a learned scalar weight) is a Python number run eagerly, and a 0-d tensor in a graph
  ``torch.compile`` traces, which is then not specialised on its value.

Precision (``_dtype``, ``_low_precision``): the generated function computes on the device of
its inputs, in the *working dtype*: the module's ``--dtype`` when it was generated with one, else
the floating dtype its tensor inputs share (float32, float64, bfloat16, float16: a bfloat16 model
computes in bfloat16, as torch computes one), else torch's promotion of theirs (float32 and
bfloat16 give float32; anything with float64 gives float64), and float64 where a tensor input is
not floating. Under ``torch.autocast`` for the inputs' device the working dtype is float32 in
place of bfloat16 or float16 (float64 stays float64: autocast leaves it alone, as torch's does),
and the *products* (``_matmul``, ``_bmm``, ``_addmm``, ``_matmul_total``, the grouped and
concatenated products) run in the autocast dtype: their operands cast to it, their result cast back
to float32, as the matrix products of autograd under autocast run. Everything else (softmax,
log-softmax, layer norm and the loss with their statistics, GELU, the sums of gradients over rows
and the batch, residual and bias additions) stays in float32, and so do the gradients returned. The
product helpers take that dtype as ``lp`` (None: the working dtype throughout, the code unchanged).

The kernel of the products (``_GEMM``, ``_on_onednn``): a float32 matrix product on a CPU whose
size pays for a call (a matrix, or a batch of rows, times a matrix) runs on oneDNN's matmul where
the module measured it, when it was imported, at least 10% faster than torch's own (which goes
through torch's BLAS: on an AMD CPU MKL's sgemm takes its generic code path, and oneDNN's is some
2x faster); a residual or a bias row is added in the same call. ``FDSL_MATMUL=blas`` keeps
torch's own, ``onednn`` asks for oneDNN's, ``auto`` (the default) measures. float64, the autocast
dtypes, GPUs, batched stacks of heads, and tensors whose graph autograd records (the op has no
derivative) are torch's products whatever the choice; in a graph ``torch.compile`` traces the
product is the custom op ``fdsl::onednn_linear``, one opaque kernel.

Memory (``_keep_heap``): training on a CPU under glibc, the module asks malloc once a process to
keep the memory a step frees for the next step (``FDSL_MALLOC=system`` leaves malloc as it is).
"""

import ctypes
import os
import platform
import time

import torch


def _softmax(A):
    """Row-wise softmax (the last axis), stable."""
    return torch.softmax(A, dim=-1)


def _mm(A, B):
    """mm(A, B) = [A > 0] o B, the derivative of relu at A applied to B."""
    return (A > 0) * B


def _aa(A, B):
    """aa(A, B) = S o (B - rowsum(S o B) 1^t) with S = softmax(A)."""
    return _aa_given(_softmax(A), B)


def _aa_given(S, B):
    """aa(A, B) from S = softmax(A), for B of any batch shape that broadcasts with S: torch's fused
    softmax backward (the softmax Jacobian is symmetric, so its vector-Jacobian product is aa)."""
    if S.shape == B.shape:
        return torch._softmax_backward_data(B, S, -1, S.dtype)
    out = S * B
    out -= S * out.sum(dim=-1, keepdim=True)
    return out


def _trace(A):
    """The trace: a number for one matrix, a (batch, 1, 1) tensor for a batch of them."""
    t = torch.diagonal(A, dim1=-2, dim2=-1).sum(-1)
    return _number(t) if A.dim() == 2 else t[..., None, None]


def _trace_product(A, B):
    """trace(A @ B) without the product, as the sum of A^t o B (as _trace: a number, or a
    (batch, 1, 1) tensor)."""
    t = (A.mT * B).sum(dim=(-2, -1))
    return _number(t) if t.dim() == 0 else t[..., None, None]


def _inner(A, B):
    """trace(A^t @ B), the sum of A o B (as _trace: a number, or a (batch, 1, 1) tensor)."""
    t = (A * B).sum(dim=(-2, -1))
    return _number(t) if t.dim() == 0 else t[..., None, None]


def _trace_product_heads(A, B):
    """The sum over the heads of two stacks (..., h, n, m) of trace(A_h @ B_h) (as _trace_product:
    a number, or a (batch, 1, 1) tensor)."""
    t = (A.mT * B).sum(dim=(-3, -2, -1))
    return _number(t) if t.dim() == 0 else t[..., None, None]


def _inner_heads(A, B):
    """The sum over the heads of two stacks of trace(A_h^t @ B_h), the sum of A o B."""
    t = (A * B).sum(dim=(-3, -2, -1))
    return _number(t) if t.dim() == 0 else t[..., None, None]


def _as_float(x):
    return _number(torch.as_tensor(x).reshape(()))


def _number(t):
    """A 0-d tensor made in the sweep (a trace, a scalar operator's value) as a Python number, which
    torch's operations take in the working dtype; in a traced graph the tensor itself: a number
    read out of it would break the graph there, and dynamo would specialise the rest on its value
    (a recompile at every step that changes it)."""
    return t if torch.compiler.is_compiling() else float(t.detach())


def _scalar_matrix(x, dtype, device):
    """A scalar as a 1 x 1 matrix (a per-example scalar, (batch, 1, 1), as it is)."""
    if torch.is_tensor(x):
        return x.to(dtype) if x.dim() == 3 else x.to(dtype).reshape(1, 1)
    return torch.full((1, 1), x, dtype=dtype, device=device)


_LOW = (torch.bfloat16, torch.float16)  # the dtypes of less than float32's precision


def _dtype(values, names, forced):
    """(dtype, device) to compute in, the working dtype of the module doc: the forced dtype, else
    the floating dtype the tensor inputs share, else their promotion (float64 where one is not
    floating); under torch.autocast float32 in place of bfloat16 or float16. The device of the
    first tensor input (the CPU when there is none)."""
    kinds, device = set(), None
    for name in names:
        x = values[name]
        if isinstance(x, torch.Tensor):
            kinds.add(x.dtype)
            if device is None:
                device = x.device
    device = device if device is not None else torch.device("cpu")
    if forced is not None:
        return forced, device
    if not kinds or not all(k.is_floating_point for k in kinds):
        return torch.float64, device
    dtype = kinds.pop()
    for kind in kinds:
        dtype = torch.promote_types(dtype, kind)
    if dtype in _LOW and torch.is_autocast_enabled(device.type):
        dtype = torch.float32  # autocast: float32 master values, the products in its dtype
    return dtype, device


def _low_precision(dtype, device):
    """The dtype the products run in when it is not the working dtype: torch.autocast's for the
    device's type where it is enabled and the working dtype is float32; None otherwise."""
    if dtype != torch.float32 or not torch.is_autocast_enabled(device.type):
        return None
    low = torch.get_autocast_dtype(device.type)
    return low if low != torch.float32 else None


_HEAP = []  # whether _keep_heap has run in this process


def _keep_heap():
    """Once a process: glibc's malloc asked to keep freed memory for reuse, not to give it back to
    the system (the trim threshold 1 GiB; the mmap threshold 32 MiB, the ceiling its own dynamic
    one reaches). Why: the sweep makes a step's gradients during its forward, among the
    activations, and frees them all at the next zero_grad; glibc then gives the top of its heap
    back and the next step faults every page of it in again (shakespeare_char at batch 4: 26,000
    page faults a step, 5% of its time, where the kept heap has none). A caching allocator
    (jemalloc, tcmalloc) does the same for a whole process. ``FDSL_MALLOC=system``: malloc left
    as it is; not glibc (macOS, musl): nothing done."""
    if _HEAP:
        return
    _HEAP.append(True)
    if os.environ.get("FDSL_MALLOC") == "system" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # no such library or symbol: malloc as it is
        pass


_GEMM_LIBRARIES = ("auto", "blas", "onednn")
_GEMM_LEAST = 1 << 18  # m k n under which a product stays torch's: a call's cost, not its flops


def _onednn_linear(A, W, bias, other):
    """A @ W^t (+ bias, a row; + other, a matrix of the result's shape) by oneDNN's matmul."""
    if other is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(A, other, W, bias, "add")
    return torch.ops.mkldnn._linear_pointwise(A, W, bias, "none", [], "")


def _probe_gemm():
    """The faster library of this machine: "onednn" where oneDNN's float32 matmul is available,
    right, and at least 10% faster than torch's own (its BLAS) on a product of a transformer's
    size; else "blas". A few milliseconds, once."""
    try:
        g = torch.Generator().manual_seed(0)
        A, B = torch.randn(256, 512, generator=g), torch.randn(512, 512, generator=g)
        if not torch.allclose(_onednn_linear(A, B.mT, None, None), A @ B, rtol=1e-4, atol=1e-3):
            return "blas"
        times = {"blas": [], "onednn": []}
        for _ in range(4):  # (interleaved, the least of each: the machine's noise counts to neither)
            for name, f in (("blas", lambda: A @ B), ("onednn", lambda: _onednn_linear(A, B.mT, None, None))):
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
    except RuntimeError:  # (the op there but failing on this machine: torch's products)
        return "blas"
    return "onednn" if min(times["onednn"]) < 0.9 * min(times["blas"]) else "blas"


def _gemm_library():
    """The kernel of the float32 matrix products on a CPU: ``FDSL_MATMUL`` = ``blas`` (torch's
    own, through its BLAS), ``onednn`` (oneDNN's matmul; torch's where it cannot run) or
    ``auto`` (the default: the faster of the two, measured once, ``_probe_gemm``)."""
    choice = os.environ.get("FDSL_MATMUL", "auto").strip().lower() or "auto"
    if choice not in _GEMM_LIBRARIES:
        raise ValueError("FDSL_MATMUL=%r: expected one of %s" % (choice, ", ".join(_GEMM_LIBRARIES)))
    if choice == "blas":
        return "blas"
    if choice == "onednn":
        return "onednn" if _GEMM_OP else "blas"
    return _probe_gemm() if _GEMM_OP else "blas"


def _define_gemm_op():
    """oneDNN's product as the custom op ``fdsl::onednn_linear``, which a graph ``torch.compile``
    traces calls as one opaque kernel (inductor lowers the oneDNN op itself only for constant
    weights, as in inference). Defined once a process, by the first module imported where oneDNN
    is (whichever library it chose: a test, a benchmark may switch ``_GEMM``). False where it
    cannot be (no oneDNN, or a torch without ``torch.library.custom_op``)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if hasattr(torch.ops.fdsl, "onednn_linear"):
        return True
    try:
        _custom_gemm_op()
    except (AttributeError, TypeError, RuntimeError, ValueError):  # (an older torch's library)
        return False
    return True


def _custom_gemm_op():
    """Defines ``fdsl::onednn_linear`` (``_define_gemm_op``)."""
    # (a list of one: the graph reads it with a getitem, which inductor's reordering for locality
    # leaves where it is; a product whose only reader is the graph's output, a weight's gradient,
    # is otherwise moved to the end of the graph, and what it reads is kept alive until then)
    @torch.library.custom_op("fdsl::onednn_linear", mutates_args=())
    def onednn_linear(A: torch.Tensor, W: torch.Tensor, bias: torch.Tensor | None,
                      other: torch.Tensor | None) -> list[torch.Tensor]:
        return [_onednn_linear(A, W, bias, other)]

    @onednn_linear.register_fake
    def _(A, W, bias, other):
        return [A.new_empty(A.shape[:-1] + W.shape[:1])]


_GEMM_OP = _define_gemm_op()  # whether oneDNN's product can run here, eagerly and traced
_GEMM = [_gemm_library()]  # the library of this process (a list, so that a test may set it)


def _on_onednn(A, B):
    """Whether A @ B runs on oneDNN: the library is, both float32 on a CPU, B a matrix, A a
    matrix or a batch of them, the product large enough, and no tensor whose graph autograd
    records (the op has no derivative; the sweep makes its own)."""
    return _GEMM[0] == "onednn" and A.dtype == torch.float32 and B.dtype == torch.float32 \
        and B.dim() == 2 and A.dim() in (2, 3) and A.device.type == "cpu" and B.device.type == "cpu" \
        and A.shape[-2] * A.shape[-1] * B.shape[-1] >= _GEMM_LEAST \
        and not (torch.is_grad_enabled() and (A.requires_grad or B.requires_grad))


def _gemm(A, B, C=None, alpha=None):
    """alpha A @ B + C on oneDNN (``_on_onednn(A, B)`` holds): C None, a row, or a matrix of the
    result's shape; alpha None (1), a number or a 0-d tensor."""
    bias = other = None
    if C is not None and alpha is None and C.dtype == A.dtype and C.is_contiguous() \
            and not (C.requires_grad and torch.is_grad_enabled()):
        if C.dim() == 2 and C.shape[0] == 1:
            bias = C[0]
        elif C.shape == A.shape[:-1] + B.shape[-1:]:
            other = C
    if torch.compiler.is_compiling():
        out = torch.ops.fdsl.onednn_linear(A, B.mT, bias, other)[0]
    else:
        out = _onednn_linear(A, B.mT, bias, other)
    if alpha is not None:
        out = out.mul_(alpha)
    if C is not None and bias is None and other is None:
        out = _add_into(out, C)
    return out


def _matmul(A, B, lp=None):
    """A @ B; with ``lp``, in that dtype (the operands cast to it) and the result back in float32."""
    if lp is None:
        return _gemm(A, B) if _on_onednn(A, B) else A @ B
    return (A.to(lp) @ B.to(lp)).float()


def _input(values, name, shape, batched, dtype, device):
    """values[name] as a (dtype, device) tensor of the declared shape, with a leading batch axis
    allowed when ``batched`` (a constant that varies per example)."""
    x = values[name]
    if not (torch.is_tensor(x) and x.dtype == dtype and (device is None or x.device == device)):
        x = torch.as_tensor(x, dtype=dtype, device=device)
    if shape is None:
        ok = x.dim() == 2 or (batched and x.dim() == 3)
    else:
        ok = tuple(x.shape[-2:]) == shape and (x.dim() == 2 or (batched and x.dim() == 3))
    if not ok:
        what = "(batch, %d, %d) or (%d, %d)" % (shape + shape) if batched and shape else str(shape)
        raise ValueError("%s has shape %s, not %s" % (name, tuple(x.shape), what if shape else "a matrix"))
    return x


def _scalar(values, name):
    """A declared scalar or a scalar weight as a Python number with the value given (a number is not
    rounded through torch's default dtype), which torch's operations take in the working dtype."""
    x = values[name]
    if torch.is_tensor(x) and torch.compiler.is_compiling():  # a learned scalar: as _number
        return x.reshape(())
    if isinstance(x, (int, float)) or torch.is_tensor(x):
        return float(x)
    return float(torch.as_tensor(x, dtype=torch.float64).reshape(()))


def _batch(*xs):
    """The batch size of the inputs that have one (they must agree), or 0 when none has."""
    sizes = {x.shape[0] for x in xs if x.dim() == 3}
    if len(sizes) > 1:
        raise ValueError("the inputs have different batch sizes: %s" % sorted(sizes))
    return sizes.pop() if sizes else 0


def _total(x, nb):
    """A gradient summed over the batch: the sum of its examples' (a term that no example changes
    counts once per example)."""
    if not nb:
        return x
    return x.sum(dim=0) if x.dim() == 3 else x * nb


def _sum_total(x, dim, nb):
    """x.sum(dim, keepdim=True) summed over the batch too (a gradient), as one reduction."""
    if x.dim() == 3:
        return x.sum(dim=(0, dim), keepdim=True)[0]
    s = x.sum(dim=dim, keepdim=True)
    return s * nb if nb else s


def _head_axis(x):
    """A number of each example, (batch, 1, 1), with a head axis, (batch, 1, 1, 1), to scale a stack
    of heads; a number (one example) as it is."""
    return x.unsqueeze(-3) if torch.is_tensor(x) and x.dim() == 3 else x


def _bmm(A, B, lp=None):
    """A @ B for two batches of matrices as the one call ``torch.bmm``; otherwise ``@`` (which
    broadcasts: a stack of heads against a head axis of 1). ``lp``: as ``_matmul``."""
    if lp is not None:
        return _bmm(A.to(lp), B.to(lp)).float()
    if A.dim() == 3 and B.dim() == 3 and A.shape[0] == B.shape[0]:
        return torch.bmm(A, B)
    if A.dim() == 4 and B.dim() == 4 and A.shape[:2] == B.shape[:2] and not (_foldable(A) and _foldable(B)):
        # stacks of heads of a batch, views of a grouped product: @ would copy them to fold the two
        # leading axes into one; one bmm an example reads them where they are
        out = A.new_empty(A.shape[:2] + (A.shape[-2], B.shape[-1]))
        for i in range(A.shape[0]):
            torch.bmm(A[i], B[i], out=out[i])
        return out
    return A @ B


_CAUSAL_BLOCK = 64  # the rows of a block of a causal product (fdsl.codegen.causal)


def _bmm_causal(A, B, kind, lp=None):
    """_bmm(A, B) where a causal mask makes a part of the product zero or unread (fdsl.codegen.
    causal): ``kind`` "L": A is lower triangular (zero above its diagonal); "U": A is upper
    triangular (the transpose of a lower one); "out": only the product's entries on and below
    the diagonal are read (the others are made zeros). Multiplied in blocks of rows, each with
    the columns (or rows of B) it needs: a context of 4 blocks does 5/8 of the product's work.
    Products too small for two blocks, or of stacks that broadcast, are made whole."""
    if lp is not None:
        return _bmm_causal(A.to(lp), B.to(lp), kind).float()
    n = A.shape[-2]
    if not _causal_fits(A, B, kind):
        return _bmm(A, B)
    if torch.compiler.is_compiling():  # (a traced graph writes no views: the blocks, concatenated)
        return torch.cat([_causal_block(A, B, kind, r0, min(r0 + _CAUSAL_BLOCK, n))
                          for r0 in range(0, n, _CAUSAL_BLOCK)], -2)
    out = A.new_empty(A.shape[:-1] + B.shape[-1:])
    if A.dim() == 3:
        _causal_blocks(A, B, kind, out)
    else:  # one example at a time: stacks of heads are views that do not fold (as _bmm)
        for i in range(A.shape[0]):
            _causal_blocks(A[i], B[i], kind, out[i])
    return out


def _causal_fits(A, B, kind):
    """Whether _bmm_causal(A, B, kind) multiplies in blocks: two _stacks, at least two blocks of
    rows, A square where it is the triangular one."""
    n = A.shape[-2]
    return _stacks(A, B) and n >= 2 * _CAUSAL_BLOCK and (kind == "out" or A.shape[-1] == n)


def _stacks(A, B):
    """Whether A and B are stacks of matrices (3-D or 4-D) of one leading shape and dtype, which
    the blocked products take as they are (none broadcasts)."""
    return A.dim() == B.dim() and A.dim() in (3, 4) and A.shape[:-2] == B.shape[:-2] and A.dtype == B.dtype


def _side_products(specs, lp=None):
    """_side_by_side of the stacks A_i @ B_i, each times its scale (``specs``: (A_i, B_i, kind_i,
    scale_i), the kind a _bmm_causal kind or None for a whole product, the scale a number or
    None), each product written into its columns of the side-by-side matrix as it is made (the
    scale its alpha): no stack made, none copied in (an attention's backward: dq, dk and dv).
    A product that does not multiply in blocks, or that broadcasts, is made and copied in;
    anything else (autocast's dtype, a traced graph, stacks of other shapes): _side_by_side of
    the products."""
    shapes = [A.shape[:-1] + B.shape[-1:] for A, B, _, _ in specs]
    if lp is not None or torch.compiler.is_compiling() or any(
            not _stacks(A, B) or s[:-1] != shapes[0][:-1] for (A, B, _, _), s in zip(specs, shapes)):
        return _side_by_side(tuple(_bmm_causal(A, B, k, lp) if k else _bmm(A, B, lp) for A, B, k, _ in specs),
                             tuple(c for _, _, _, c in specs))
    lead, h, rows = shapes[0][:-3], shapes[0][-3], shapes[0][-2]
    x = specs[0][0].new_empty(lead + (rows, h * sum(s[-1] for s in shapes)))
    at = 0
    for (A, B, kind, scale), s in zip(specs, shapes):
        block = x[..., at:at + h * s[-1]].unflatten(-1, (h, s[-1])).transpose(-3, -2)  # (..., h, rows, cols)
        at += h * s[-1]
        if kind is not None and not _causal_fits(A, B, kind):
            product = _bmm_causal(A, B, kind)
            if scale is None:
                block.copy_(product)
            else:
                torch.mul(product, scale, out=block)
        elif A.dim() == 3:
            _causal_blocks(A, B, kind, block, scale)
        else:  # one example at a time (as _bmm_causal)
            for i in range(A.shape[0]):
                _causal_blocks(A[i], B[i], kind, block[i], scale)
    return x


def _causal_softmax(A, B, M, scale=None, lp=None):
    """softmax(scale A B + M) for M a causal mask (0 on and below the diagonal, -inf above;
    fdsl.codegen.causal), made a block of rows at a time: each block's scores up to its diagonal
    (the product's alpha the scale), the mask's block added and the softmax taken while they are
    in cache, and zeros after the diagonal block, where the mask's -inf gives 0. Anything else (a
    scale of each example, products in autocast's dtype, a traced graph, a context of less than
    two blocks) is the whole spelling: the masked product of _bmm_causal, the mask, the softmax."""
    n = A.shape[-2]
    if lp is not None or torch.compiler.is_compiling() or not isinstance(scale, (int, float, type(None))) \
            or not _causal_fits(A, B, "out") or B.shape[-1] != n or tuple(M.shape) != (n, n) or M.dtype != A.dtype:
        return _softmax(_add_into(_bmm_causal(A if scale is None else scale * A, B, "out", lp), M))
    out = A.new_empty(A.shape[:-1] + (n,))
    if A.dim() == 3:
        _causal_softmax_blocks(A, B, M, scale, out)
    else:  # one example at a time (as _bmm_causal)
        for i in range(A.shape[0]):
            _causal_softmax_blocks(A[i], B[i], M, scale, out[i])
    return out


def _causal_softmax_blocks(A, B, M, scale, out):
    """_causal_softmax of two 3-D stacks, into ``out``."""
    n = A.shape[-2]
    for r0 in range(0, n, _CAUSAL_BLOCK):
        r1 = min(r0 + _CAUSAL_BLOCK, n)
        s = out[:, r0:r1, :r1]
        if scale is None:
            torch.bmm(A[:, r0:r1], B[:, :, :r1], out=s)
        else:  # (beta 0: what the block held is not read)
            torch.baddbmm(s, A[:, r0:r1], B[:, :, :r1], beta=0, alpha=scale, out=s)
        s.add_(M[r0:r1, :r1])
        s.copy_(torch.softmax(s, -1))
        out[:, r0:r1, r1:] = 0


def _causal_operands(A, B, kind, r0, r1):
    """(the part of A, the part of B, the columns) whose product is rows r0:r1 of
    _bmm_causal(A, B, kind): "L": rows r0:r1 of a lower A are zero after column r1; "U": those of
    an upper A before column r0; "out": they are read up to column r1 (``cols``; None: all)."""
    if kind == "L":
        return A[..., r0:r1, :r1], B[..., :r1, :], None
    if kind == "U":
        return A[..., r0:r1, r0:], B[..., r0:, :], None
    return A[..., r0:r1, :], B[..., :, :r1], r1


def _causal_block(A, B, kind, r0, r1):
    """Rows r0:r1 of _bmm_causal(A, B, kind), as a new array (zeros after the columns read)."""
    a, b, cols = _causal_operands(A, B, kind, r0, r1)
    return a @ b if cols is None else torch.nn.functional.pad(a @ b, (0, B.shape[-1] - cols))


def _causal_blocks(A, B, kind, out, alpha=None):
    """_bmm_causal of two 3-D stacks (kind None: the whole product), times ``alpha`` (None: 1, the
    products' own alpha), into ``out``."""
    n = A.shape[-2]
    if kind is None:
        _bmm_into(A, B, out, alpha)
        return
    for r0 in range(0, n, _CAUSAL_BLOCK):
        r1 = min(r0 + _CAUSAL_BLOCK, n)
        a, b, cols = _causal_operands(A, B, kind, r0, r1)
        if cols is None:
            _bmm_into(a, b, out[:, r0:r1], alpha)
        else:
            _bmm_into(a, b, out[:, r0:r1, :cols], alpha)
            out[:, r0:r1, cols:] = 0


def _bmm_into(a, b, out, alpha=None):
    """alpha a @ b written into ``out`` (a view: the rows of a side-by-side matrix, strided)."""
    if alpha is None:
        torch.bmm(a, b, out=out)
    else:  # (beta 0: what out held is not read)
        torch.baddbmm(out, a, b, beta=0, alpha=alpha, out=out)


def _foldable(x):
    """Whether the two leading axes of ``x`` fold into one without a copy."""
    return x.stride(0) == x.shape[1] * x.stride(1) or x.shape[0] == 1 or x.shape[1] == 1


def _matmul_total(A, B, nb, lp=None, alpha=None):
    """A @ B summed over the batch (a gradient): for two batches sum_b A_b B_b as one product, the
    examples side by side along the inner axis; a product that no example changes counts nb times.
    ``lp``: the product as ``_matmul``'s, a sum over the batch outside it in float32. ``alpha``: a
    number the sum is made times (the seed: the product's own alpha; None: 1)."""
    if lp is not None:
        if A.dim() == 3 and B.dim() == 3:
            out = _matmul_total(A.to(lp), B.to(lp), nb).float()
        elif A.dim() == 3:
            out = _matmul(A.sum(dim=0), B, lp)
        elif B.dim() == 3:
            out = _matmul(A, B.sum(dim=0), lp)
        else:
            out = _matmul(A, B, lp) * nb if nb else _matmul(A, B, lp)
        return out if alpha is None else out.mul_(alpha)
    if A.dim() == 3 and B.dim() == 3:
        return _product(A.mT.reshape(-1, A.shape[-2]).mT, B.reshape(-1, B.shape[-1]), alpha)
    if A.dim() == 3:
        return _product(A.sum(dim=0), B, alpha)
    if B.dim() == 3:
        return _product(A, B.sum(dim=0), alpha)
    if nb:
        return _product(A, B, nb if alpha is None else alpha * nb)
    return _product(A, B, alpha)


_ZERO: dict = {}  # (dtype, device) -> a 0-d zero, the input an addmm with beta 0 does not read


def _product(A, B, alpha=None):
    """alpha A @ B for two matrices, alpha as the product's own (addmm's, the input not read)."""
    if _on_onednn(A, B):
        return _gemm(A, B, None, alpha)
    if alpha is None:
        return A @ B
    zero = _ZERO.get((A.dtype, A.device))
    if zero is None or torch.compiler.is_compiling():
        zero = _ZERO[A.dtype, A.device] = A.new_zeros(())
    return torch.addmm(zero, A, B, beta=0, alpha=alpha)


def _cat(xs, dim):
    """The matrices side by side along ``dim`` (-1: columns, -2: rows); a matrix beside a batch
    is repeated for every example. Matrices that are neighbouring blocks of one tensor (the
    weights of a family a Model holds together: its heads' Q, K and V, their bias rows, the
    blocks of an output projection) are joined as a view of it, without a copy."""
    if len({x.dim() for x in xs}) > 1:
        nb = next(x.shape[0] for x in xs if x.dim() == 3)
        xs = [x if x.dim() == 3 else x.expand(nb, *x.shape) for x in xs]
    elif not torch.compiler.is_compiling():  # (a traced graph has no addresses to compare)
        joined = _neighbours(xs, dim)
        if joined is not None:
            return joined
    return torch.cat(xs, dim)


def _neighbours(xs, dim):
    """``torch.cat(xs, dim)`` as a view where the matrices xs are blocks of one tensor, one after
    the other along ``dim`` with the same strides (each starts where the one before ends); else
    None. Two tensors alive at once do not share addresses unless they share memory, so the
    addresses say it (a device's too: the first block's device, dtype and strides are every
    block's, and each block starts where the one before it ends)."""
    x0 = xs[0]
    strides = x0.stride()
    if len(strides) != 2 or len(xs) < 2:
        return None
    axis = dim % 2
    step = strides[axis] * x0.element_size()
    if not step:
        return None
    across, dtype, device = x0.shape[1 - axis], x0.dtype, x0.device
    at, total = x0.data_ptr(), 0
    for x in xs:  # (the cheapest test first: the address, which fails for anything else)
        if x.data_ptr() != at or x.stride() != strides:
            return None
        shape = x.shape
        if shape[1 - axis] != across or x.dtype != dtype:
            return None
        at += shape[axis] * step
        total += shape[axis]
    if xs[-1].device != device:
        return None
    return x0.as_strided((total, across) if axis == 0 else (across, total), strides, x0.storage_offset())


def _grouped(A, Bs, lp=None):
    """(A @ B for B in Bs), as the one product A [B_1 ... B_k], split back into views."""
    return torch.split(_matmul(A, _cat(Bs, -1), lp), [B.shape[-1] for B in Bs], -1)


def _grouped_rows(As, B, lp=None):
    """(A @ B for A in As), as the one product [A_1; ...; A_k] B, split back into views."""
    return torch.split(_matmul(_cat(As, -2), B, lp), [A.shape[-2] for A in As], -2)


def _grouped_total(A, Bs, nb, lp=None):
    """(_matmul_total(A, B, nb) for B in Bs), as one product."""
    return torch.split(_matmul_total(A, _cat(Bs, -1), nb, lp), [B.shape[-1] for B in Bs], -1)


def _grouped_total_rows(As, B, nb, lp=None):
    """(_matmul_total(A, B, nb) for A in As), as one product."""
    return torch.split(_matmul_total(_cat(As, -2), B, nb, lp), [A.shape[-2] for A in As], -2)


def _addmm(C, A, B, lp=None):
    """C + A @ B as one kernel (torch.addmm, as nn.Linear adds its bias), a batch of A folded into
    its rows; C a matrix of the result's shape or a row. Anything else: C + A @ B. ``lp``: the
    product as ``_matmul``'s, C (a residual stream, a bias) added to it in float32."""
    if lp is not None:
        return _add_into(_matmul(A, B, lp), C)
    if torch.is_tensor(C) and B.dim() == 2 and A.dim() in (2, 3) and 0 < C.dim() <= A.dim() \
            and C.shape[-1] == B.shape[-1]:
        rows = A.shape[:-1]
        if C.dim() == 2 and C.shape[0] == 1 or C.shape == rows + B.shape[-1:]:
            flat = A.reshape(-1, A.shape[-1])
            C = C.reshape(-1, C.shape[-1]) if C.shape[0] != 1 or C.dim() == 3 else C
            out = _gemm(flat, B, C) if _on_onednn(flat, B) else torch.addmm(C, flat, B)
            return out.view(*rows, B.shape[-1])
    return C + A @ B


def _add_into(P, Z):
    """P + Z, added into P (a new array read nowhere else) where Z broadcasts to P's shape."""
    if torch.is_tensor(Z) and Z.dtype == P.dtype and Z.dim() <= P.dim() and all(
            z in (1, p) for z, p in zip(Z.shape[::-1], P.shape[::-1])):  # (torch.broadcast_shapes is slow)
        return P.add_(Z)
    return P + Z


def _grouped_heads(A, Bs, h, lp=None, bias=None, t=False):
    """A [B_1 ... B_kh] (the h heads of each of k kinds, kind by kind) as k stacks of heads
    (..., h, rows, cols): views of the one product, no copies. ``bias``: a row for each B_i (its
    head's bias), added as the product is made (one addmm, as nn.Linear's fused c_attn). ``t``:
    the Bs given transposed (A [B_1^t ... B_kh^t], each B_i as a Model holds it, nn.Linear's
    layout): [B_1; ...; B_kh]^t, one transpose of their join."""
    W = _cat(Bs, -2).mT if t else _cat(Bs, -1)
    if bias is None:
        R = _matmul(A, W, lp)
    else:
        R = _addmm(_cat(bias, -1), A, W, lp)
    R = R.unflatten(-1, (len(Bs) // h, h, -1))
    return tuple(R.select(-3, j).transpose(-3, -2) for j in range(len(Bs) // h))


def _side_by_side(stacks, scales=None):
    """Stacks of heads (..., h, rows, cols) as one matrix (..., rows, h cols) each, the stacks one
    after the other along the columns: one copy, as autograd's attention makes; ``scales``: a
    number (or None) for each stack, multiplied in as it is copied."""
    parts = [s.transpose(-3, -2) for s in stacks]
    if torch.compiler.is_compiling():  # (a traced graph writes no views of an array: its compiler lays it out)
        scaled = [p if c is None else p * c for p, c in zip(parts, scales or [None] * len(parts))]
        x = torch.cat(scaled, -2).contiguous()
        return x.reshape(*x.shape[:-2], -1)
    # into a contiguous array: torch.cat would keep the layout of stacks read transposed (heads
    # made as q^t dS), whose rows are then strided and every product of them copies them first
    shape = list(parts[0].shape)
    shape[-2] = sum(p.shape[-2] for p in parts)
    dtype = parts[0].dtype
    for p in parts[1:]:
        dtype = torch.promote_types(dtype, p.dtype)
    x = torch.empty(shape, dtype=dtype, device=parts[0].device)
    if scales is None:
        torch.cat(parts, -2, out=x)
    else:
        at = 0
        for p, c in zip(parts, scales):
            block = x[..., at:at + p.shape[-2], :]
            at += p.shape[-2]
            if c is None:
                block.copy_(p)
            else:
                torch.mul(p, c, out=block)
    return x.reshape(*x.shape[:-2], -1)


def _split_total(A, B, nb, count, dim, lp=None, alpha=None):
    """_matmul_total(A, B, nb, lp, alpha) cut into ``count`` equal parts along ``dim`` (views). Cut
    along the columns, it is made as the transpose of B^t A^t: each part is then the transpose of
    a contiguous block, the layout of a weight a Model holds in a family (its gradient, so laid
    out, goes to ``.grad`` without a copy)."""
    if dim == -1:
        return tuple(part.mT for part in _matmul_total(B.mT, A.mT, nb, lp, alpha).chunk(count, -2))
    return _matmul_total(A, B, nb, lp, alpha).chunk(count, dim)


def _sum_of_products(As, Bs, lp=None):
    """A_1 @ B_1 + ... + A_k @ B_k as the one product [A_1 ... A_k] [B_1; ...; B_k]."""
    return _matmul(_cat(As, -1), _cat(Bs, -2), lp)

def _full(shape, value, nb, dtype, device):
    if torch.is_tensor(value):  # a per-example scalar: (batch, 1, 1)
        return value.sum(dim=0).expand(shape).clone()
    return torch.full(shape, value * (nb or 1), dtype=dtype, device=device)


def _copy(x):
    return x.clone()


def _half_sq(E, nb):
    """1/2 ||E||^2, summed over the batch."""
    s = 0.5 * (E * E).sum()
    return s * nb if nb and E.dim() == 2 else s


def _loss_total(L, nb, dtype, device):
    """A scalar loss L summed over the batch, as a 0-d tensor: per example it is a (batch, 1, 1)
    tensor; a loss that no example changes counts once per example."""
    if torch.is_tensor(L):
        return L.sum() if L.dim() == 3 else L.reshape(()) * (nb or 1)
    return torch.tensor(float(L) * (nb or 1), dtype=dtype, device=device)


def _is_scalar(x):
    return not torch.is_tensor(x) or x.dim() == 0 or tuple(x.shape[-2:]) == (1, 1) and x.dim() == 2


def _mul(*factors):
    """The product of the factors: scalars multiply, matrices are folded left to right with @."""
    coeff, product = 1.0, None
    for x in factors:
        if _is_scalar(x):
            coeff = coeff * (x.reshape(()) if torch.is_tensor(x) else x)
        elif product is None:
            product = x
        else:
            product = product @ x
    if product is None:
        return torch.full((1, 1), float(coeff))
    return product if not torch.is_tensor(coeff) and coeff == 1.0 else coeff * product


def _pair(a, b):
    """Two operands as tensors (a number takes the other's dtype and device)."""
    if not torch.is_tensor(a):
        a = torch.as_tensor(a, dtype=b.dtype, device=b.device)
    if not torch.is_tensor(b):
        b = torch.as_tensor(b, dtype=a.dtype, device=a.device)
    return a, b


def _layer_parts(A):
    """(Xhat, 1/sigma) of layer norm, row by row (eps 1e-5, biased variance)."""
    c = A - A.mean(dim=-1, keepdim=True)
    inv = 1.0 / torch.sqrt((c * c).mean(dim=-1, keepdim=True) + 1e-5)
    return c * inv, inv


def _dlayernorm_given(Xhat, inv, B):
    return inv * (B - B.mean(dim=-1, keepdim=True) - Xhat * (Xhat * B).mean(dim=-1, keepdim=True))


def _layernorm_stats(A):
    """(layernorm(A), its row means, its rows' 1/sigma): the forward, kept for the backward."""
    return torch.ops.aten.native_layer_norm(A, A.shape[-1:], None, None, 1e-5)


def _dlayernorm_stats(A, B, mean, rstd):
    """dlayernorm(A, B) from the statistics of layernorm(A): torch's fused layer-norm backward."""
    if A.shape != B.shape:
        return _dlayernorm(A, B)
    return torch.ops.aten.native_layer_norm_backward(B, A, A.shape[-1:], mean, rstd, None, None,
                                                    [True, False, False])[0]



def _layernorm_affine(A, g, b):
    """(layernorm(A) * g + b, its row means, its rows' 1/sigma), g and b rows (b None: none, a
    layer norm with its gain alone): torch's one fused layer norm with its gain and bias."""
    return torch.ops.aten.native_layer_norm(A, A.shape[-1:], g.reshape(-1), None if b is None else b.reshape(-1),
                                            1e-5)


def _dlayernorm_affine(G, A, mean, rstd, g, b, nb):
    """(dlayernorm(A, G o g), the gradient of the gain g, of the bias b) of layernorm(A) * g + b,
    from the forward's row statistics, the gradients summed over the rows and the batch: torch's
    one fused layer-norm backward (b None: no bias, and None for its gradient). A G that is not
    shaped like A: the same, term by term."""
    d = A.shape[-1]
    if G.shape == A.shape:
        dA, dg, db = torch.ops.aten.native_layer_norm_backward(
            G, A, A.shape[-1:], mean, rstd, g.reshape(-1), None if b is None else b.reshape(-1),
            [True, True, b is not None])
        dg, db = dg.view(1, d), None if b is None else db.view(1, d)
    else:
        Xhat = (A - mean) * rstd
        dA = _dlayernorm_given(Xhat, rstd, G * g)
        dg = (G * Xhat).reshape(-1, d).sum(0, keepdim=True)
        db = None if b is None else G.reshape(-1, d).sum(0, keepdim=True)
    if nb and G.dim() == 2:  # no example changes it: once per example
        dg, db = dg * nb, None if b is None else db * nb
    return dA, dg, db


def _dlayernorm(A, B):
    """layernorm's Jacobian at A on B (as fdsl.numbers.numpy_runtime._dlayernorm): torch's fused
    layer-norm backward (the Jacobian is symmetric), from the row statistics of A."""
    if A.shape != B.shape:
        Xhat, inv = _layer_parts(A)
        return _dlayernorm_given(Xhat, inv, B)
    shape = A.shape[-1:]
    _, mean, rstd = torch.ops.aten.native_layer_norm(A, shape, None, None, 1e-5)
    return torch.ops.aten.native_layer_norm_backward(B, A, shape, mean, rstd, None, None, [True, False, False])[0]


def _ddlayernorm(A, U, B):
    """layernorm's second derivative at A on (U, B) (as numpy_runtime._ddlayernorm)."""
    Xhat, inv = _layer_parts(A)
    JU, JB = _dlayernorm_given(Xhat, inv, U), _dlayernorm_given(Xhat, inv, B)
    mU, mB = (Xhat * U).mean(dim=-1, keepdim=True), (Xhat * B).mean(dim=-1, keepdim=True)
    return -inv * (mU * JB + mB * JU + Xhat * (JU * B).mean(dim=-1, keepdim=True))



def _dlogsoftmax_given(L, B):
    """dlogsoftmax(A, B) = B - softmax(A) rowsum(B) from L = logsoftmax(A): torch's fused
    log-softmax backward where B has L's shape."""
    if L.shape == B.shape:
        return torch._log_softmax_backward_data(B, L, -1, L.dtype)
    return B - torch.exp(L) * B.sum(dim=-1, keepdim=True)

def _sigmoid(A):
    return torch.sigmoid(A)


def _gelu(A):
    return torch.nn.functional.gelu(A)


def _dgelu(A, B):
    if A.shape == B.shape:
        return torch.ops.aten.gelu_backward(B, A)
    return (0.5 * (1.0 + torch.erf(A * 0.7071067811865476)) + A * torch.exp(-0.5 * A * A) * 0.3989422804014327) * B


def _ddgelu(A, B):
    return torch.exp(-0.5 * A * A) * 0.3989422804014327 * (2.0 - A * A) * B


def _dtanh(A, B):
    return (1.0 - torch.tanh(A) ** 2) * B


def _dsigmoid(A, B):
    S = torch.sigmoid(A)
    return S * (1.0 - S) * B


def _layernorm(A):
    return _layer_parts(A)[0]


def _logsoftmax(A):
    return torch.log_softmax(A, dim=-1)


def _dlogsoftmax(A, B):
    return B - (torch.softmax(A, dim=-1) * B).sum(dim=-1, keepdim=True)


class _np:
    """The numpy functions that fdsl's operator templates name (``fdsl.core.ops.NUMPY_FUNCTIONS``, the
    trace and relu), in torch: a rule file's operator runs on tensors unchanged."""

    tanh, sinh, cosh, exp, expm1 = torch.tanh, torch.sinh, torch.cosh, torch.exp, torch.expm1
    log, log1p, sqrt, abs, sign = torch.log, torch.log1p, torch.sqrt, torch.abs, torch.sign
    sin, cos, square, reciprocal = torch.sin, torch.cos, torch.square, torch.reciprocal
    arctan, arcsinh, negative = torch.atan, torch.asinh, torch.neg

    @staticmethod
    def cbrt(x):
        return torch.sign(x) * torch.abs(x) ** (1.0 / 3.0)

    @staticmethod
    def maximum(a, b):
        return torch.maximum(*_pair(a, b))

    @staticmethod
    def minimum(a, b):
        return torch.minimum(*_pair(a, b))

    @staticmethod
    def multiply(a, b):
        return a * b

    @staticmethod
    def add(a, b):
        return a + b

    @staticmethod
    def subtract(a, b):
        return a - b

    @staticmethod
    def divide(a, b):
        return a / b

    @staticmethod
    def hypot(a, b):
        return torch.hypot(*_pair(a, b))

    @staticmethod
    def arctan2(a, b):
        return torch.atan2(*_pair(a, b))

    @staticmethod
    def logaddexp(a, b):
        return torch.logaddexp(*_pair(a, b))

    @staticmethod
    def heaviside(x, at_zero):
        return torch.heaviside(*_pair(x, at_zero))

    @staticmethod
    def trace(x, axis1=0, axis2=1):
        return torch.diagonal(x, dim1=axis1, dim2=axis2).sum(-1)


# ---- ids: copied only into the modules of programs with onehot constants (targets.runtime) ----


def _ids(values, name, rows, vocab, device):
    """values[name] as ids on ``device``: integers in [0, vocab), shape (rows,) or (batch, rows)
    (rows None: any)."""
    x = torch.as_tensor(values[name], device=device)
    declared = "%s is declared onehot: its value is its ids, integers in [0, %d), shape (rows,) or (batch, rows)" % (
        name, vocab)
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        if x.dim() >= 2 and x.shape[-1] == vocab:
            raise ValueError("%s is a matrix of shape %s, where ids are declared (%s)"
                             % (name, tuple(x.shape), declared))
        raise ValueError("%s holds %s, not integer ids (%s)" % (name, x.dtype, declared))
    if x.dim() not in (1, 2) or (rows is not None and x.shape[-1] != rows):
        raise ValueError("%s has shape %s, not (%s,) or (batch, %s) (%s)"
                         % (name, tuple(x.shape), rows, rows, declared))
    bad = (x < 0) | (x >= vocab)
    if torch.compiler.is_compiling():  # a traced graph checks without leaving it (no message of where)
        torch._assert_async(bad.logical_not().all(), "%s has an id outside [0, %d)" % (name, vocab))
    elif bool(bad.any()):
        at = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError("%s has the id %d at %s, outside [0, %d)" % (name, int(x[at]), at, vocab))
    # int64, as torch's lookups, gathers and one_hot take them (uint8 or int16 ids, as a dataset
    # may hold them, are refused by embedding; int32 by gather and one_hot)
    return x if x.dtype == torch.int64 else x.long()


def _lookup(ids, A):
    """onehot(ids) @ A: the rows of A at the ids (an embedding lookup), per example for a batch."""
    if A.dim() == 2:
        return torch.nn.functional.embedding(ids, A)
    if ids.dim() == 1:
        return A[:, ids]
    return A[torch.arange(A.shape[0], device=A.device)[:, None], ids]


def _onehot(ids, vocab, dtype):
    """The one-hot matrix of the ids, (n, vocab) or (batch, n, vocab) in ``dtype``: for a use of a
    onehot constant that none of the helpers of ids computes (fdsl.codegen.onehot)."""
    return torch.nn.functional.one_hot(ids, vocab).to(dtype)


def _scatter(ids, G, vocab):
    """onehot(ids)^t @ G: the rows of G added at the ids into zeros (vocab, cols), per example for
    a batch."""
    if ids.dim() == 1 and G.dim() == 2:
        return G.new_zeros((vocab, G.shape[-1])).index_add_(0, ids, G)
    nb = ids.shape[0] if ids.dim() == 2 else G.shape[0]
    ids = ids.expand(nb, ids.shape[-1]) + vocab * torch.arange(nb, device=ids.device)[:, None]
    G = G.expand(nb, *G.shape[-2:])
    out = G.new_zeros((nb * vocab, G.shape[-1])).index_add_(0, ids.reshape(-1), G.reshape(-1, G.shape[-1]))
    return out.view(nb, vocab, G.shape[-1])


def _scatter_total(ids, G, vocab, nb):
    """_scatter summed over the batch (a gradient): every example's rows added into one (vocab,
    cols) tensor."""
    if not nb:
        return _scatter(ids, G, vocab)
    ids = ids.expand(nb, ids.shape[-1]).reshape(-1)
    G = G.expand(nb, *G.shape[-2:]).reshape(-1, G.shape[-1])
    return G.new_zeros((vocab, G.shape[-1])).index_add_(0, ids, G)


def _pick_sum(ids, A):
    """trace(onehot(ids)^t A): the sum of A's entries at the ids, row by row (a gather; as _trace:
    a number, or a (batch, 1, 1) tensor)."""
    if ids.dim() == 2 and A.dim() == 2:
        A = A.expand(ids.shape[0], *A.shape)
    t = A.gather(-1, ids.unsqueeze(-1).expand(*A.shape[:-1], 1)).sum(dim=(-2, -1))
    return _number(t) if t.dim() == 0 else t[..., None, None]


def _aa_ids(S, ids):
    """aa(A, onehot(ids)) from S = a(A): S o (onehot(ids) - p 1^t), p the entries of S at the ids
    (-p S, with p (1 - p) at the ids), per example for a batch."""
    if ids.dim() == 2 and S.dim() == 2:
        S = S.expand(ids.shape[0], *S.shape)
    index = ids.unsqueeze(-1).expand(*S.shape[:-1], 1)
    p = S.gather(-1, index)
    return (-p * S).scatter_(-1, index, p * (1 - p))


def _scatter_into(P, ids, G, vocab, nb, t):
    """P + onehot(ids)^t G (its transpose when ``t``), G's rows added at the ids into P, a product
    of the sum's own that dies here (``nb``: summed over the batch, as _scatter_total). Where the
    shapes or dtypes do not fit one index_add_ (a batch kept per example, a float32 G beside a
    lower-precision P), the scatter is made and added."""
    if P.dim() != 2 or P.dtype != G.dtype or not nb and (ids.dim() != 1 or G.dim() != 2):
        S = _scatter_total(ids, G, vocab, nb)
        return P + (S.mT if t else S)
    if nb:
        ids = ids.expand(nb, ids.shape[-1]).reshape(-1)
        G = G.expand(nb, *G.shape[-2:]).reshape(-1, G.shape[-1])
    (P.mT if t else P).index_add_(0, ids, G)
    return P


def _add_ids(P, ids, sign):
    """P + sign onehot(ids), written into P (a tensor of the sum's own; one without the batch
    axis of the ids, or of the sign, a number of each example (batch, 1, 1), is copied per
    example first)."""
    if torch.is_tensor(sign) and sign.dim() != 3:  # one number (a 1 x 1 or 0-d tensor)
        sign = sign.reshape(())
    if torch.is_tensor(sign) and sign.dim() == 3 and P.dim() == 2:  # one number an example
        P = P.expand(sign.shape[0], *P.shape).clone()
    if ids.dim() == 2 and P.dim() == 2:
        P = P.expand(ids.shape[0], *P.shape).clone()
    index = ids.unsqueeze(-1).expand(*P.shape[:-1], 1)
    if torch.is_tensor(sign):  # a scalar of the data or a weight: its numbers along the ids
        src = sign.to(P.dtype).expand(index.shape)
    else:
        src = torch.full(index.shape, sign, dtype=P.dtype, device=P.device)
    return P.scatter_add_(-1, index, src)
