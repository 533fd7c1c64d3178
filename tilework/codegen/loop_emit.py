"""The walk over loop IR that every target's code generator shares.

``LoopEmitter`` turns one TensorFunc into lines of source text: it names buffers and vars (a
target says which names are legal), keeps the indentation and the set of sym vars in scope,
and dispatches each statement, scalar expression and index expression to a method of the
target's emitter (``tilework.codegen.c.emit`` writes C, ``tilework.codegen.interp`` writes
Python). Subclasses implement the ``emit_*``/``render_*`` methods; the walk itself, the scope
rules and the error messages live here once.
"""

from __future__ import annotations

import abc
import re

import numpy as np

from tilework.errors import WellFormedError
from tilework.ir.dtype import is_float_dtype, np_dtype
from tilework.ir.lowp import round_scalar
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Cast,
    Const,
    For,
    INTRINSIC_ARITY,
    IfThenElse,
    Intrin,
    Load,
    Scalar,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    Unary,
    walk_stmts,
)
from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.kernel_abi import kernel_syms
from tilework.ir.sym import Dim, FloorDiv, FloorMod, Max, Min, Poly, SymExpr, SymVar
from tilework.schedule.reduction_primitives import init_empty_reductions


def const_value(c: Const) -> float | int | bool:
    """The value a constant has in computation: floats rounded to their dtype."""
    if c.dtype == "bool":
        return bool(c.value)
    if c.dtype == "float64":
        return float(c.value)
    if c.dtype == "float32":
        return float(np.float32(c.value))
    if c.dtype == "float16":
        return float(np.float16(c.value))
    if c.dtype == "bfloat16":
        return float(np.float32(c.value).astype(np_dtype("bfloat16")))
    if is_float_dtype(c.dtype):  # the float8/float4 formats
        return round_scalar(float(c.value), c.dtype)
    return int(c.value)


EMPTY_REDUCTION = (
    "a reduction over an empty domain, which this schedule cannot run: its init stays inside the "
    "reduce loops (e.g. a reduce loop fused with a spatial one), so the output would stay unwritten"
)


def comment(text: str) -> str:
    """``text`` safe inside a comment of any target language: names in the IR are data from
    wherever the IR came from, so nothing but plain characters goes into generated code."""
    return re.sub(r"[^A-Za-z0-9_ .,:=()-]", "?", text)[:200]


class LoopEmitter(abc.ABC):
    """Source text for one TensorFunc; see the module docstring."""

    indent = "    "

    def __init__(self, func: TensorFunc, name: str) -> None:
        self.func = init_empty_reductions(func)  # an init also runs when its reduction is empty
        self.kname = name
        self.names: dict[object, str] = {}
        self.taken: set[str] = set()
        self.scope: set[SymVar] = set()
        self.lines: list[str] = []
        self.depth = 1

    # -- names and output -----------------------------------------------------------------

    @abc.abstractmethod
    def legal_name(self, base: str) -> str:
        """``base`` (already reduced to ``[A-Za-z0-9_]``) made a legal, non-reserved name."""

    def bind(self, key: object, name: str) -> str:
        """A fresh name for ``key`` (a buffer, var or other object) based on ``name``."""
        base = self.legal_name(re.sub(r"\W", "_", name, flags=re.ASCII) or "v")
        out, k = base, 1
        while out in self.taken:
            out, k = f"{base}_{k}", k + 1
        self.taken.add(out)
        self.names[key] = out
        return out

    def known(self, key: object, what: str) -> str:
        """The name bound to ``key``; an error naming ``what`` when it has none."""
        name = self.names.get(key)
        if name is None:
            raise self.error(f"{what}, which is neither a param nor allocated")
        return name

    def empty_reduction_checks(self) -> list[tuple[str, Dim]]:
        """(block, reduce extent) for each block whose init stayed inside a reduction that may
        be empty (``init_empty_reductions`` could not move it out): the kernel must refuse to
        run when such an extent is below 1 rather than leave the block's output unwritten.
        Each extent is an expression of the kernel's sym params."""
        params = set(kernel_syms(self.func))
        out: list[tuple[str, Dim]] = []
        for s in walk_stmts(self.func.body):
            if isinstance(s, Block) and s.init is not None:
                for iv in s.iter_vars:
                    ext = iv.extent
                    if iv.kind == "reduce" and not sym.prove_ge(ext, 1) and set(sym_walk.free_vars(ext)) <= params:
                        out.append((s.name, ext))
        return out

    def line(self, text: str) -> None:
        self.lines.append(self.indent * self.depth + text)

    def nested(self, s: Stmt) -> None:
        self.depth += 1
        self.stmt(s)
        self.depth -= 1

    @abc.abstractmethod
    def error(self, msg: str) -> WellFormedError:
        """The error for malformed IR, naming the kernel."""

    # -- statements -----------------------------------------------------------------------

    def stmt(self, s: Stmt) -> None:
        if isinstance(s, SeqStmt):
            self.emit_seq(s)
        elif isinstance(s, Store):
            self.emit_store(s)
        elif isinstance(s, For):
            self.emit_for(s)
        elif isinstance(s, Block):
            self.emit_block(s)
        elif isinstance(s, IfThenElse):
            self.emit_if(s)
        elif isinstance(s, Allocate):
            self.emit_allocate(s)
        else:
            raise self.error(f"unknown statement {type(s).__name__}")

    def emit_seq(self, s: SeqStmt) -> None:
        for x in s.stmts:
            self.stmt(x)

    @abc.abstractmethod
    def emit_store(self, s: Store) -> None: ...

    @abc.abstractmethod
    def emit_for(self, s: For) -> None: ...

    @abc.abstractmethod
    def emit_block(self, b: Block) -> None: ...

    @abc.abstractmethod
    def emit_if(self, s: IfThenElse) -> None: ...

    @abc.abstractmethod
    def emit_allocate(self, s: Allocate) -> None: ...

    # -- index arithmetic -----------------------------------------------------------------

    def dim(self, d: Dim) -> str:
        """The text of an index expression (int64 arithmetic over the vars in scope)."""
        if isinstance(d, int):
            return self.render_int(d)
        if isinstance(d, SymVar):
            if d not in self.scope:
                raise self.error(f"sym var {d.name} is used outside the loop or block that binds it, or is not a kernel sym var")
            return self.names[d]
        if isinstance(d, (FloorDiv, FloorMod)):
            return self.render_divmod(d)
        if isinstance(d, (Min, Max)):
            return self.render_minmax(d)
        assert isinstance(d, Poly)
        return self.render_poly(d)

    @abc.abstractmethod
    def render_int(self, v: int) -> str: ...

    @abc.abstractmethod
    def render_divmod(self, d: FloorDiv | FloorMod) -> str: ...

    @abc.abstractmethod
    def render_minmax(self, d: Min | Max) -> str: ...

    @abc.abstractmethod
    def render_poly(self, d: Poly) -> str: ...

    # -- scalar expressions ---------------------------------------------------------------

    def expr(self, x: Scalar) -> str:
        if isinstance(x, (int, SymExpr)):
            return self.dim(x)
        if isinstance(x, Const):
            return self.render_const(x)
        if isinstance(x, Load):
            return self.render_load(x)
        if isinstance(x, Binary):
            return self.render_binary(x)
        if isinstance(x, Unary):
            if x.op not in ("not", "neg"):
                raise self.error(f"unknown unary op {x.op!r}")
            return self.render_unary(x)
        if isinstance(x, Cast):
            return self.render_cast(x)
        if isinstance(x, Select):
            return self.render_select(x)
        if isinstance(x, Intrin):
            n = INTRINSIC_ARITY.get(x.name, 1)
            if len(x.args) != n:
                raise self.error(f"intrinsic {x.name} takes {n} argument(s), got {len(x.args)}")
            return self.render_intrin(x)
        raise self.error(f"unknown scalar expression {type(x).__name__}")

    @abc.abstractmethod
    def render_const(self, c: Const) -> str: ...

    @abc.abstractmethod
    def render_load(self, x: Load) -> str: ...

    @abc.abstractmethod
    def render_binary(self, x: Binary) -> str: ...

    @abc.abstractmethod
    def render_unary(self, x: Unary) -> str: ...

    @abc.abstractmethod
    def render_cast(self, x: Cast) -> str: ...

    @abc.abstractmethod
    def render_select(self, x: Select) -> str: ...

    @abc.abstractmethod
    def render_intrin(self, x: Intrin) -> str: ...


__all__ = ["LoopEmitter", "comment", "const_value"]
