"""Library calls in exported C: which backends' externs have a C implementation, and the call.

- ``quant.linear.<fmt>`` and ``quant.linear_add.<fmt>`` (the ``quant`` backend):
  ``tw_qlinear_<fmt>`` and ``tw_qlinear_add_<fmt>`` of
  ``tilework/backend/quant_kernels.c``, which the export ships as the VM's library compiles it
  (``quant.source()``: plain C with AVX-512 and AVX2 paths, ``quant_float_avx2.c`` spliced in):
  the same code the VM calls, so the results are the same bits.
- ``quant.experts.<fmt>`` (the ``quant`` backend's ``expert_linear``): ``tw_qexperts_<fmt>`` of
  the same library (``quant_experts.c``, spliced into it), the ids' item size read from their
  dtype: the VM's bits too.
- ``blas.<f32|f64>.<kind>`` (the ``blas`` backend): tilework's portable C loops in
  ``c/tw_blas.c``. The exported library does not link a BLAS (so it builds anywhere with a C
  compiler); the summation order differs from the OpenBLAS the VM calls, so these regions
  agree with the VM to float32 rounding, not bit for bit.
- Every other library call (``torch.*``, ``onnxruntime.run``) runs Python-side code and cannot
  be exported: ``extern_call`` raises an ``ExportError`` that names the call, its op and its
  backend and says how to compile the model without it.

A call passes the VM's arguments (inputs, the dims shape, then the destination); ``vals`` are
the C ``const tw_val*`` expressions of those arguments.
"""

from __future__ import annotations

from typing import Any, Sequence

from tilework.backend import onnxruntime as onnxruntime_backend
from tilework.backend.quant import ERROR_TEXT as QUANT_ERROR_TEXT
from tilework.backend.quant import FORMATS as QUANT_FORMATS  # every format has all three entry points
from tilework.errors import BuildError

BLAS_KINDS = {"matmul": 2, "matmul_bias": 3, "linear": 2, "linear_bias": 3, "batch_matmul": 2}
_QUANT_ERRORS = ("", *(QUANT_ERROR_TEXT[rc] for rc in range(1, len(QUANT_ERROR_TEXT) + 1)))  # by the library's return code
QUANT_PREFIXES = ("quant.linear.", "quant.linear_add.", "quant.experts.")  # the quant library's calls
_EXPERTS_PARAMS = "const float* x, const uint8_t* w, const void* ids, int64_t ids_bytes, float* y, int64_t T, int64_t S, int64_t slots, int64_t E, int64_t N, int64_t K"


class ExportError(BuildError):
    """The model cannot be exported as C (a library call without a C implementation, a value the
    C runtime does not hold)."""


def extra_sources(symbols: Sequence[str]) -> list[str]:
    """The C files (beside the runtime) that the library calls ``symbols`` need."""
    out = []
    if any(s.startswith(QUANT_PREFIXES) for s in symbols):
        out.append("quant_kernels.c")
    if any(s.startswith("blas.") for s in symbols):
        out.append("tw_blas.c")
    return out


def declarations(symbols: Sequence[str], imported: bool = False, storage: str = "static") -> list[str]:
    """The C declarations of the library calls ``symbols``: prototypes, or with ``imported``
    file-scope function pointers of the same names (set when the model is loaded in process,
    to the functions the VM's own libraries hold: ``tilework.export.native``), declared
    ``storage`` (``extern TW_PRIVATE`` in the units of a split model.c but the one defining
    them). Only the quant library's calls can be imported."""
    lines = []
    for fmt in QUANT_FORMATS:
        for add, params in ((False, "const float* x, const uint8_t* w, float* y"), (True, "const float* x, const uint8_t* w, const float* r, float* y")):
            if f"quant.linear{'_add' * add}.{fmt}" in symbols:
                name = f"tw_qlinear{'_add' * add}_{fmt}"
                lines.append(f"{storage} int32_t (*{name})({params}, int64_t M, int64_t N, int64_t K);" if imported else f"int32_t {name}({params}, int64_t M, int64_t N, int64_t K);")
        if f"quant.experts.{fmt}" in symbols:
            lines.append(f"{storage} int32_t (*tw_qexperts_{fmt})({_EXPERTS_PARAMS});" if imported else f"int32_t tw_qexperts_{fmt}({_EXPERTS_PARAMS});")
    if imported:
        blas = sorted(s for s in symbols if s.startswith("blas."))
        if blas:
            raise ExportError(f"library call {blas[0]!r} cannot run in process on the C runtime (the VM calls OpenBLAS for it); compile without the blas backend")
        return lines
    for short, ctype in (("f32", "float"), ("f64", "double")):
        for kind, n_in in BLAS_KINDS.items():
            if f"blas.{short}.{kind}" not in symbols:
                continue
            ins = ", ".join(f"const {ctype}*" for _ in range(n_in))
            dims = "int64_t, int64_t, int64_t, int64_t" if kind == "batch_matmul" else "int64_t, int64_t, int64_t"
            lines.append(f"int32_t twb_{short}_{kind}({ins}, {ctype}*, {dims});")
    return lines


def _backend_of(symbol: str) -> tuple[str, str]:
    backend, _, op = symbol.partition(".")
    return backend, (op or symbol)


def extern_call(symbol: str, vals: Sequence[str], where: str) -> list[str]:
    """C statements running library call ``symbol`` on argument expressions ``vals``."""
    if symbol.startswith(("quant.linear.", "quant.linear_add.")):
        fmt = symbol.rpartition(".")[2]
        add = symbol.startswith("quant.linear_add.")
        if fmt not in QUANT_FORMATS or len(vals) != 4 + add:
            raise ExportError(f"{where}: library call {symbol!r} with {len(vals)} arguments has no C implementation")
        x, w, *residual, dims, out = vals
        fn, extra = (f"tw_qlinear_add_{fmt}", f"(const float*)({residual[0]})->data, ") if add else (f"tw_qlinear_{fmt}", "")
        errors = "{" + ", ".join(f'"{e}"' for e in _QUANT_ERRORS) + "}"
        return [
            f"{{ const tw_val* d_ = {dims}; int32_t rc_ = {fn}((const float*)({x})->data, (const uint8_t*)({w})->data, {extra}(float*)({out})->data, d_->shape[0], d_->shape[1], d_->shape[2]);",
            f"  if (rc_) {{ static const char* const e_[] = {errors}; return twrt_fail(m, \"quant_linear ({fmt}, rows=%\" PRId64 \", out_features=%\" PRId64 \", in_features=%\" PRId64 \"): the library refused the call: %s\", d_->shape[0], d_->shape[1], d_->shape[2], rc_ > 0 && rc_ < {len(_QUANT_ERRORS)} ? e_[rc_] : \"an error code\"); }} }}",
        ]
    if symbol.startswith("quant.experts."):
        fmt = symbol.rpartition(".")[2]
        if fmt not in QUANT_FORMATS or len(vals) != 5:
            raise ExportError(f"{where}: library call {symbol!r} with {len(vals)} arguments has no C implementation")
        x, w, ids, dims, out = vals
        errors = "{" + ", ".join(f'"{e}"' for e in _QUANT_ERRORS) + "}"
        dim_args = ", ".join(f"d_->shape[{i}]" for i in range(6))
        return [
            f"{{ const tw_val* d_ = {dims}; const tw_val* i_ = {ids}; int32_t rc_ = tw_qexperts_{fmt}((const float*)({x})->data, (const uint8_t*)({w})->data, i_->data, tw__dtypes[i_->dtype].itemsize, (float*)({out})->data, {dim_args});",
            f"  if (rc_) {{ static const char* const e_[] = {errors}; return twrt_fail(m, \"expert_linear ({fmt}, tokens=%\" PRId64 \", slots=%\" PRId64 \", experts=%\" PRId64 \", out_features=%\" PRId64 \", in_features=%\" PRId64 \"): the library refused the call: %s\", d_->shape[0], d_->shape[2], d_->shape[3], d_->shape[4], d_->shape[5], rc_ > 0 && rc_ < {len(_QUANT_ERRORS)} ? e_[rc_] : \"an error code\"); }} }}",
        ]
    if symbol.startswith("blas."):
        parts = symbol.split(".")
        if len(parts) != 3 or parts[1] not in ("f32", "f64") or parts[2] not in BLAS_KINDS:
            raise ExportError(f"{where}: library call {symbol!r} has no C implementation")
        short, kind = parts[1], parts[2]
        ctype = "float" if short == "f32" else "double"
        n_in = BLAS_KINDS[kind]
        if len(vals) != n_in + 2:
            raise ExportError(f"{where}: library call {symbol!r} with {len(vals)} arguments has no C implementation")
        ins = ", ".join(f"(const {ctype}*)({v})->data" for v in vals[:n_in])
        dims, out = vals[n_in], vals[n_in + 1]
        nd = 4 if kind == "batch_matmul" else 3
        dim_args = ", ".join(f"d_->shape[{i}]" for i in range(nd))
        return [f"{{ const tw_val* d_ = {dims}; twb_{short}_{kind}({ins}, ({ctype}*)({out})->data, {dim_args}); }}"]
    raise refusal(symbol, where)


def exports(symbol: str) -> bool:
    """Whether library call ``symbol`` has a C implementation (of some arity): else the export
    refuses it before it looks at its arguments (an onnxruntime call's serialized model)."""
    return symbol.startswith((*QUANT_PREFIXES, "blas."))


def refusal(symbol: str, where: str, args: Sequence[Any] = ()) -> ExportError:
    """The error for a library call that has no C implementation, naming its op and backend
    (an onnxruntime region's ONNX ops, read from its model: its first argument)."""
    backend, op = _backend_of(symbol)
    what = f"op {op}"
    if symbol == onnxruntime_backend.SYMBOL and args and isinstance(args[0], str):
        ops = onnxruntime_backend.region_ops(args[0])
        what = f"a region of ONNX {', '.join(ops)}" if ops else "a region"
    return ExportError(
        f"{where} calls library function {symbol!r} ({what}, backend {backend}), which has no C implementation: "
        f"the exported library runs without Python. Compile the model with backends whose calls export "
        f"(--backends codegen,blas or codegen,quant; codegen alone always does) and export again."
    )


__all__ = ["ExportError", "extern_call", "exports", "refusal", "extra_sources", "declarations", "QUANT_FORMATS", "QUANT_PREFIXES"]
