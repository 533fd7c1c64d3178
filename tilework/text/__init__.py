"""The text format of tilework IR: Python-like, readable, and exact (``parse(print_module(m))``
is structurally equal to ``m``).

A module is a sequence of items::

    attrs = {"target": "cpu"}

    @graph(attrs={"num_inputs": 2})
    def main(x: Tensor((n, 4), "float32"), w: Tensor((4, 4), "float32"), c: Prim("bool")) -> Tensor((n, 4), "float32"):
        n = sym(lo=1, hi=4096)
        m = sym()
        with dataflow():
            lv: Tensor((n, 4), "float32") = matmul(x, w, out_dtype=None)
            gv: Tensor((n, 4), "float32") = exp(lv)
            output(gv)
        y = match_cast(gv, Tensor((m, 4), "float32"))
        z: Tensor((m, 4), "float32") = if c:
            a: Tensor((m, 4), "float32") = add(y, y)
            a
        else:
            y
        r: Tensor((n, 4), "float32") = call_tensor(@kernel, (x,), out=Tensor((n, 4), "float32"))
        s: Tensor((2,), "float32") = add(meta[0], const([0.5, 1.5], "float32"))
        return r

    @tensor(num_outputs=1)
    def kernel(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
        n = sym(lo=1)
        for i in parallel(n):
            for j in range(4):
                with block("B"):
                    vi = spatial(n, i)
                    vj = spatial(4, j)
                    reads(A)
                    writes(B)
                    B[vi, vj] = exp(A[vi, vj]) + float32(1.0)

    @gemm = extern("cblas_sgemm", Func(None, Any, pure=False))

    meta[0] = const(dtype="float32", shape=(2,), data="AACAPwAAAEA=")

Every sym var a function uses is declared first, with its bounds (``lo`` defaults to 0, ``hi``
to none); loop and iter vars with default bounds are introduced by their statement. A dataflow
block lists the vars that leave it with ``output(...)``. An ``If`` binds one var and each
branch ends with its value. Index arithmetic in TensorFuncs is ordinary arithmetic on ints and
sym vars; typed values are written ``float32(1.0)``, ``cast(x, "float16")``, ``select(c, a, b)``,
intrinsics ``exp(x)``, and the exact forms ``binary("+", a, b, dtype="int64")``.

Struct info: ``Any``, ``Prim("int64", value=n)``, ``Shape((n, 4))`` / ``Shape(ndim=2)``,
``Tensor((n, 4), "float32")`` / ``Tensor(ndim=2, dtype="float32")``, ``Tuple(a, b)``,
``Func([params], ret, pure=False)``. Leaves: ``const([[1.0, 2.0]], "float32")``, ``meta[i]``,
``shape(n, 4)``, ``prim(n + 1)``, ``prim(0.5, "float32")``, ``"text"``, ``@global``,
``extern("symbol")``. Op calls take every attribute as a keyword and the stated output struct
info as ``out=`` (``sinfo_args=[...]`` for several). A binding may leave out its struct info in
hand-written text: it is then inferred as the BlockBuilder would.
"""

from tilework.ir.display import register_printer
from tilework.text import printer as _printer
from tilework.text.parser import parse
from tilework.text.printer import print_binding, print_expr, print_func, print_info, print_module

register_printer(_printer)  # repr(mod) and diagnostics print through the text format

__all__ = ["parse", "print_module", "print_func", "print_expr", "print_info", "print_binding"]
