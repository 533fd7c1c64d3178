"""Structural equality and hashing of IR, modulo the names of bound things.

Two objects are structurally equal when they have the same shape of nodes with the same
fields, where bound objects correspond one to one instead of by identity:

- graph vars map on definition (function params, binding vars), buffers on definition
  (TensorFunc params, ``Allocate``); a use must then meet its partner;
- sym vars map on their first occurrence inside a function (the text format declares every sym
  var at the start of the function that uses it), and on definition elsewhere (``match_cast``
  info, loop and iter vars); two sym vars map only when their ``lo``/``hi`` bounds are equal.
  Each function has its own mapping, so one SymVar shared by two functions and two distinct
  ones compare the same. Dims compare after renaming, in canonical form.

Free objects (used, never bound) must be identical unless ``map_free_vars``. What is compared:
var kinds and struct info, op names, attrs, constants (dtype, shape, bytes), call struct info
arguments, block names, loop kinds, dtypes. Not compared: names, constant name hints, and the
struct info of compound graph expressions (calls, tuples, ifs), which is derived and is compared
through the vars it is bound to.

``structural_hash`` is consistent with equality (equal objects hash the same), independent of
names and deterministic across processes (blake2b over a canonical token stream), so it can key
persistent caches.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from typing import Any, Callable, Mapping

import numpy as np

from tilework.ir import sym
from tilework.ir import sym_walk
from tilework.ir.graph import (
    Binding,
    BindingBlock,
    Call,
    Constant,
    Expr,
    ExternFunc,
    GlobalVar,
    GraphFunc,
    If,
    MatchCast,
    OpRef,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
)
from tilework.ir.info import AnyInfo, FuncInfo, PrimInfo, ShapeInfo, StructInfo, TensorInfo, TupleInfo
from tilework.ir.loop import (
    Allocate,
    Binary,
    Block,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    Intrin,
    Load,
    PExpr,
    Select,
    SeqStmt,
    Stmt,
    Store,
    TensorFunc,
    Unary,
)
from tilework.ir.module import IRModule
from tilework.ir.sym import FloorDiv, FloorMod, Max, Min, Poly, SymExpr, SymVar
from tilework.ir.display import show_expr, show_info

_MAX_PERMUTED = 6  # sym vars first met together in one compound dim: try every pairing up to this

Field = tuple[str, str, Any]  # (path segment, how to compare it, value)


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _is_index(x: Any) -> bool:
    return isinstance(x, (int, SymExpr)) and not isinstance(x, bool)


def _category(v: Any) -> str:
    """The kind of an attribute / literal value; values of different kinds never compare equal."""
    v = _plain(v)
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "bool"
    if _is_index(v):
        return "dim"
    for cls, name in ((float, "float"), (str, "str"), ((tuple, list), "seq"), (Mapping, "map"), (StructInfo, "info")):
        if isinstance(v, cls):
            return name
    return "other"


def _same_dim(x: Any, y: Any) -> bool:
    """Canonical dims are interned: equal ones are the same object (or equal ints)."""
    return x is y or (isinstance(x, int) and isinstance(y, int) and x == y)


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


# -- the fields of each node, in traversal order ------------------------------------------


def _seq(seg: str, kind: str, items: tuple | list) -> list[Field]:
    return [(seg, "len", len(items))] + [(f"{seg}[{i}]", kind, x) for i, x in enumerate(items)]


def _opt(seg: str, kind: str, x: Any) -> list[Field]:
    head: list[Field] = [(seg, "known", x is not None)]
    if x is None:
        return head
    return head + (_seq(seg, "dim", x) if kind == "dim*" else [(seg, kind, x)])


def _fields(x: Any) -> list[Field]:
    """The children of node ``x`` with how each compares; equality zips two such lists and
    hashing walks one, so the two cannot drift apart."""
    if isinstance(x, GraphFunc):
        head = _seq(".params", "param", x.params)
        return head + [(".ret_info", "info", x.ret_info), (".attrs", "attrs", x.attrs), (".pure", "leaf", x.pure), (".body", "expr", x.body)]
    if isinstance(x, TensorFunc):
        kinds: list[Field] = [(".num_outputs", "leaf", x.num_outputs), (".params", "leaf", tuple(type(p).__name__ for p in x.params))]
        syms = [(f".params[{i}]", "sym_def", p) for i, p in enumerate(x.params) if isinstance(p, SymVar)]
        bufs = [(f".params[{i}]", "buffer_def", p) for i, p in enumerate(x.params) if isinstance(p, Buffer)]
        return kinds + syms + bufs + [(".attrs", "attrs", x.attrs), (".body", "stmt", x.body)]
    if isinstance(x, SeqExpr):
        return _seq(".blocks", "block", x.blocks) + [(".body", "expr", x.body)]
    if isinstance(x, BindingBlock):
        return _seq(".bindings", "binding", x.bindings)
    if isinstance(x, Binding):
        return [(".value", "expr", x.value), (".var", "var_def", x.var)]
    if isinstance(x, MatchCast):
        return [(".value", "expr", x.value), (".cast_info", "info_def", x.cast_info), (".var", "var_def", x.var)]
    if isinstance(x, Expr):
        return _expr_fields(x)
    if isinstance(x, StructInfo):
        return _info_fields(x)
    if isinstance(x, Stmt):
        return _stmt_fields(x)
    if isinstance(x, PExpr):
        return _scalar_fields(x)
    if isinstance(x, Mapping):
        return [("", "keys", tuple(x))] + [(f"[{k!r}]", "attr", v) for k, v in x.items()]
    return [("", "leaf", x)]


def _expr_fields(x: Expr) -> list[Field]:
    if isinstance(x, Var):
        return [(".info", "info", x.info)]
    if isinstance(x, Constant):
        arr = np.ascontiguousarray(x.data)
        return [(".dtype", "leaf", str(arr.dtype)), (".shape", "leaf", tuple(int(d) for d in arr.shape)), (".data", "data", arr.tobytes())]
    if isinstance(x, ShapeExpr):
        return _seq(".values", "dim", x.values)
    if isinstance(x, PrimValue):
        return [(".value", "attr", x.value), (".info", "info", x.info)]
    if isinstance(x, StringImm):
        return [(".value", "leaf", x.value)]
    if isinstance(x, (GlobalVar, OpRef)):
        return [(".name", "leaf", x.name)]
    if isinstance(x, ExternFunc):
        return [(".symbol", "leaf", x.symbol), (".info", "info", x.info)]
    if isinstance(x, Call):
        head = [(".callee", "expr", x.callee)] + _seq(".args", "expr", x.args)
        return head + [(".attrs", "attrs", x.attrs)] + _seq(".sinfo_args", "info", x.sinfo_args)
    if isinstance(x, Tuple):
        return _seq(".fields", "expr", x.fields)
    if isinstance(x, TupleGetItem):
        return [(".tuple_value", "expr", x.tuple_value), (".index", "leaf", x.index)]
    if isinstance(x, If):
        return [(".cond", "expr", x.cond), (".then_branch", "expr", x.then_branch), (".else_branch", "expr", x.else_branch)]
    if isinstance(x, SeqExpr):
        return _fields(x)
    return [("", "identity", x)]


def _info_fields(x: StructInfo) -> list[Field]:
    if isinstance(x, PrimInfo):
        return [(".dtype", "leaf", x.dtype)] + _opt(".value", "dim", x.value)
    if isinstance(x, ShapeInfo):
        return [(".ndim", "leaf", x.ndim)] + _opt(".values", "dim*", x.values)
    if isinstance(x, TensorInfo):
        return [(".dtype", "leaf", x.dtype), (".ndim", "leaf", x.ndim)] + _opt(".shape", "dim*", x.shape)
    if isinstance(x, TupleInfo):
        return _seq(".fields", "info", x.fields)
    if isinstance(x, FuncInfo):
        params = _opt(".params", "infos", x.params)
        return [(".pure", "leaf", x.pure)] + params + [(".ret", "info", x.ret)]
    return [] if isinstance(x, AnyInfo) else [("", "leaf", x)]


def _stmt_fields(x: Stmt) -> list[Field]:
    if isinstance(x, For):
        return [(".extent", "dim", x.extent), (".kind", "leaf", x.kind), (".var", "sym_def", x.var), (".body", "stmt", x.body)]
    if isinstance(x, Block):
        out: list[Field] = [(".name", "leaf", x.name), (".iter_vars", "len", len(x.iter_vars))]
        for i, iv in enumerate(x.iter_vars):
            seg = f".iter_vars[{i}]"
            out += [(seg + ".extent", "dim", iv.extent), (seg + ".kind", "leaf", iv.kind), (seg + ".binding", "dim", iv.binding), (seg + ".var", "sym_def", iv.var)]
        out += _seq(".reads", "buffer_use", x.reads) + _seq(".writes", "buffer_use", x.writes)
        return out + _opt(".init", "stmt", x.init) + [(".body", "stmt", x.body)]
    if isinstance(x, Store):
        return [(".buffer", "buffer_use", x.buffer)] + _seq(".indices", "scalar", x.indices) + [(".value", "scalar", x.value)]
    if isinstance(x, Allocate):
        return [(".buffer", "buffer_def", x.buffer), (".body", "stmt", x.body)]
    if isinstance(x, IfThenElse):
        return [(".cond", "scalar", x.cond), (".then_body", "stmt", x.then_body)] + _opt(".else_body", "stmt", x.else_body)
    if isinstance(x, SeqStmt):
        return _seq(".stmts", "stmt", x.stmts)
    return [("", "identity", x)]


def _scalar_fields(x: PExpr) -> list[Field]:
    head: list[Field] = [(".dtype", "leaf", x.dtype)]
    if isinstance(x, Const):
        return head + [(".value", "attr", x.value)]
    if isinstance(x, Load):
        return head + [(".buffer", "buffer_use", x.buffer)] + _seq(".indices", "scalar", x.indices)
    if isinstance(x, Binary):
        return head + [(".op", "leaf", x.op), (".a", "scalar", x.a), (".b", "scalar", x.b)]
    if isinstance(x, Unary):
        return head + [(".op", "leaf", x.op), (".a", "scalar", x.a)]
    if isinstance(x, Cast):
        return head + [(".value", "scalar", x.value)]
    if isinstance(x, Select):
        return head + [(".cond", "scalar", x.cond), (".a", "scalar", x.a), (".b", "scalar", x.b)]
    if isinstance(x, Intrin):
        return head + [(".name", "leaf", x.name)] + _seq(".args", "scalar", x.args)
    return [("", "identity", x)]


def _node_kind(x: Any) -> str:
    """The field kind under which a top-level object is compared."""
    if _is_index(x):
        return "dim"
    if isinstance(x, Expr):
        return "expr"
    if isinstance(x, (Stmt, PExpr)):
        return "stmt" if isinstance(x, Stmt) else "scalar"
    if isinstance(x, Buffer):
        return "buffer_def"
    if isinstance(x, Mapping) and not isinstance(x, IRModule):
        return "attrs"
    if isinstance(x, (str, float, bool, tuple)) or x is None:
        return "attr"
    return "node"


def _describe(x: Any) -> str:
    """A short text of ``x`` for a mismatch message."""
    if isinstance(x, Var):
        return f"%{x.name}"
    if isinstance(x, SymVar):
        return f"{x.name} (lo={x.lo}" + ("" if x.hi is None else f", hi={x.hi}") + ")"
    if _is_index(x):
        return sym.to_str(x)
    if isinstance(x, Buffer):
        return f"buffer {x.name}"
    if isinstance(x, bytes):
        return f"<{len(x)} bytes>"
    text = type(x).__name__ if isinstance(x, (GraphFunc, TensorFunc, Stmt, PExpr, Binding, MatchCast, BindingBlock)) else repr(x)
    try:
        if isinstance(x, StructInfo):
            text = show_info(x)
        elif isinstance(x, Expr):
            text = show_expr(x)
    except Exception:  # a description must never hide the mismatch itself
        pass
    return text if len(text) <= 80 else text[:77] + "..."


# -- equality -----------------------------------------------------------------------------


class _Mismatch(Exception):
    pass


class _Equal:
    """One comparison; raises ``_Mismatch`` at the first difference, naming its path."""

    def __init__(self, map_free_vars: bool) -> None:
        self.map_free = map_free_vars
        self.path: list[str] = []
        self.in_func = False
        self.defining = 0
        self._canon: dict[SymExpr, Any] = {}
        self.reset()

    def reset(self) -> None:
        self.fwd: dict[Any, Any] = {}  # vars, sym vars, buffers of the first object -> second
        self.rev: dict[Any, Any] = {}

    def fail(self, a: Any, b: Any, what: str = "") -> None:
        path = "".join(self.path)
        text = f"{what}: " if what else ""
        raise _Mismatch(f"{path}: {text}{_describe(a)} vs {_describe(b)}" if path else f"{text}{_describe(a)} vs {_describe(b)}")

    def top(self, a: Any, b: Any) -> None:
        if isinstance(a, IRModule) or isinstance(b, IRModule):
            if type(a) is not type(b):
                return self.fail(a, b, "types differ")
            return self.module(a, b)
        if isinstance(a, (GraphFunc, TensorFunc)):
            return self.func(a, b)
        self.node(_node_kind(a), a, b)

    def module(self, a: IRModule, b: IRModule) -> None:
        if set(a) != set(b):
            self.fail(sorted(set(a) - set(b)), sorted(set(b) - set(a)), "functions only in one module")
        self.in_func = True
        self.path = ["attrs"]
        self.node("attrs", a.attrs, b.attrs)
        for name in a:
            self.path = [name]
            self.func(a[name], b[name])

    def func(self, a: Any, b: Any) -> None:
        outer = self.in_func
        self.in_func = True
        self.reset()
        self.node("node", a, b)
        self.in_func = outer

    def mapped(self, a: Any, b: Any) -> bool | None:
        """True/False when ``a`` or ``b`` is already mapped (to each other or not), else None."""
        if a in self.fwd or b in self.rev:
            return self.fwd.get(a) is b
        return None

    def bind(self, a: Any, b: Any) -> None:
        self.fwd[a] = b
        self.rev[b] = a

    def node(self, kind: str, a: Any, b: Any) -> None:
        if kind == "leaf" or kind == "known":
            if a != b or type(a) is not type(b):
                self.fail(a, b)
        elif kind == "len":
            if a != b:
                self.fail(a, b, "lengths differ")
        elif kind == "keys":
            if a != b:
                self.fail(list(a), list(b), "attribute names differ")
        elif kind == "data":
            if a != b:
                self.fail(a, b, "constant data differs")
        elif kind == "identity":
            if a is not b:
                self.fail(a, b)
        elif kind in ("dim", "sym_def") or (kind == "scalar" and (_is_index(a) or _is_index(b))):
            self.defining += kind == "sym_def"
            self.dim(a, b)
            self.defining -= kind == "sym_def"
        elif kind == "attr":
            self.attr(a, b)
        elif kind in ("param", "var_def", "info_def"):
            self.defining += kind != "var_def"
            if kind == "info_def":
                self.node("info", a, b)
            else:
                self.var_def(a, b)
            self.defining -= kind != "var_def"
        elif kind == "expr" and isinstance(a, Var) and isinstance(b, Var) and type(a) is type(b):
            self.use(a, b, self.var_def)
        elif kind == "buffer_use":
            self.use(a, b, self.buffer_def)
        elif kind == "buffer_def":
            self.buffer_def(a, b)
        elif kind == "infos":
            self.children(_seq("", "info", a), _seq("", "info", b))
        else:
            if type(a) is not type(b):
                return self.fail(a, b, f"{type(a).__name__} vs {type(b).__name__}")
            self.children(_fields(a), _fields(b))

    def children(self, fa: list[Field], fb: list[Field]) -> None:
        for (seg, kind, x), (_, _, y) in zip(fa, fb):
            self.path.append(seg)
            self.node(kind, x, y)
            self.path.pop()

    def use(self, a: Any, b: Any, define: Callable[[Any, Any], None]) -> None:
        known = self.mapped(a, b)
        if known is not None:
            if not known:
                self.fail(a, b)
        elif self.map_free:
            define(a, b)
        elif a is not b:
            self.fail(a, b, "free (unbound) objects differ")

    def var_def(self, a: Var, b: Var) -> None:
        if type(a) is not type(b):
            return self.fail(a, b, f"{type(a).__name__} vs {type(b).__name__}")
        self.children(_fields(a), _fields(b))
        known = self.mapped(a, b)
        if known is None:
            self.bind(a, b)
        elif not known:
            self.fail(a, b, "bound twice")

    def buffer_def(self, a: Buffer, b: Buffer) -> None:
        known = self.mapped(a, b)
        if known is not None:
            if not known:
                self.fail(a, b, "bound twice")
            return
        self.node("leaf", a.dtype, b.dtype)
        self.children(_seq(".shape", "dim", a.shape), _seq(".shape", "dim", b.shape))
        self.bind(a, b)

    def attr(self, a: Any, b: Any) -> None:
        a, b = _plain(a), _plain(b)
        cat = _category(a)
        if cat != _category(b):
            return self.fail(a, b)
        if cat == "dim":
            return self.dim(a, b)
        if cat == "float":
            return self.node("leaf", _float_bits(a), _float_bits(b))
        if cat == "seq":
            return self.children(_seq("", "attr", tuple(a)), _seq("", "attr", tuple(b)))
        if cat in ("map", "info"):
            return self.node("node", a, b)
        if a != b:
            self.fail(a, b)

    # -- dims -----------------------------------------------------------------------------

    def can_map(self) -> bool:
        return self.in_func or self.defining > 0 or self.map_free

    def canonical(self, e: Any) -> Any:
        if not isinstance(e, SymExpr) or isinstance(e, SymVar):
            return e
        got = self._canon.get(e)
        if got is None:
            got = self._canon[e] = sym_walk.simplify(e)
        return got

    def dim(self, a: Any, b: Any) -> None:
        a, b = _plain(a), _plain(b)
        if isinstance(a, int) or isinstance(b, int):
            if not (isinstance(a, int) and isinstance(b, int) and a == b):
                self.fail(a, b)
            return
        if isinstance(a, SymVar) and isinstance(b, SymVar):
            return self.sym_var(a, b)
        if isinstance(a, SymVar) or isinstance(b, SymVar):
            return self.fail(a, b)
        new_a = [v for v in sym_walk.free_vars(a) if v not in self.fwd]
        new_b = [v for v in sym_walk.free_vars(b) if v not in self.rev]
        target = self.canonical(b)
        if (new_a or new_b) and self.can_map():
            if len(new_a) != len(new_b):
                return self.fail(a, b)
            return self.pair_new(a, b, target, new_a, new_b)
        got = sym_walk.substitute(a, {v: self.fwd.get(v, v) for v in sym_walk.free_vars(a)})
        if not _same_dim(got, target):
            self.fail(a, b)

    def sym_var(self, a: SymVar, b: SymVar) -> None:
        known = self.mapped(a, b)
        if known is not None:
            if not known:
                self.fail(a, b)
        elif not self.can_map():
            if a is not b:
                self.fail(a, b, "free sym vars differ")
        elif (a.lo, a.hi) != (b.lo, b.hi):
            self.fail(a, b, "sym var bounds differ")
        else:
            self.bind(a, b)

    def pair_new(self, a: SymExpr, b: SymExpr, target: Any, new_a: list[SymVar], new_b: list[SymVar]) -> None:
        """Map sym vars first met together inside one compound dim: the pairing that fits."""
        candidates = itertools.permutations(new_b) if len(new_b) <= _MAX_PERMUTED else iter([tuple(new_b)])
        for cand in candidates:
            if any((x.lo, x.hi) != (y.lo, y.hi) for x, y in zip(new_a, cand)):
                continue
            mapping = {v: self.fwd.get(v, v) for v in sym_walk.free_vars(a)}
            mapping.update(zip(new_a, cand))
            if _same_dim(sym_walk.substitute(a, mapping), target):
                for x, y in zip(new_a, cand):
                    self.bind(x, y)
                return
        self.fail(a, b)


def structural_equal(a: Any, b: Any, map_free_vars: bool = False) -> bool:
    """Whether ``a`` and ``b`` are the same IR up to the names of bound things (see the module
    docstring); free vars must be identical unless ``map_free_vars``."""
    try:
        _Equal(map_free_vars).top(a, b)
    except _Mismatch:
        return False
    return True


def assert_structural_equal(a: Any, b: Any, map_free_vars: bool = False) -> None:
    """Raise AssertionError naming the path of the first difference, e.g.
    ``main.body.blocks[0].bindings[2].value.args[1]: %x vs %y``."""
    try:
        _Equal(map_free_vars).top(a, b)
    except _Mismatch as e:
        raise AssertionError(f"not structurally equal: {e}") from None


# -- hashing ------------------------------------------------------------------------------


class _Hash:
    """Walks the fields ``_Equal`` compares: a bound thing hashes as its definition index, a
    free sym var as its bounds, other free things as a plain tag; commutative parts of a dim
    are sorted."""

    def __init__(self) -> None:
        self.h = hashlib.blake2b(digest_size=8)
        self.in_func = False
        self.defining = 0
        self._canon: dict[SymExpr, Any] = {}
        self.reset()

    def reset(self) -> None:
        self.idx: dict[Any, int] = {}
        self.counter = 0
        # ``sexpr`` digests of dims whose every var had its index (a var keeps it in a function)
        self._digests: dict[SymExpr, bytes] = {}
        self._unindexed = 0  # vars without an index met by ``sexpr``: a digest made then is not kept

    def put(self, *items: Any) -> None:
        for x in items:
            if isinstance(x, bool):
                b = b"b1" if x else b"b0"
            elif isinstance(x, int):
                b = b"i" + str(x).encode()
            elif isinstance(x, float):
                b = b"f" + _float_bits(x)
            elif isinstance(x, str):
                b = b"s" + x.encode("utf-8", "surrogatepass")
            elif isinstance(x, bytes):
                b = b"y" + hashlib.blake2b(x, digest_size=16).digest()
            elif isinstance(x, tuple):
                self.put("tuple", len(x), *x)
                continue
            else:
                b = b"n" if x is None else b"o"
            self.h.update(len(b).to_bytes(4, "little") + b)

    def define(self, x: Any) -> None:
        if x in self.idx:
            self.put("again", self.idx[x])
        else:
            self.idx[x] = self.counter
            self.counter += 1

    def top(self, x: Any) -> None:
        if isinstance(x, IRModule):
            self.in_func = True
            self.node("attrs", x.attrs)
            for name in sorted(x):
                self.put(name)
                self.func(x[name])
        elif isinstance(x, (GraphFunc, TensorFunc)):
            self.func(x)
        else:
            self.node(_node_kind(x), x)

    def func(self, f: Any) -> None:
        outer = self.in_func
        self.in_func = True
        self.reset()
        self.node("node", f)
        self.in_func = outer

    def node(self, kind: str, x: Any) -> None:
        if kind in ("leaf", "known", "len", "keys", "data"):
            self.put(x)
        elif kind == "identity":
            self.put("identity")
        elif kind in ("dim", "sym_def") or (kind == "scalar" and _is_index(x)):
            self.defining += kind == "sym_def"
            self.dim(x)
            self.defining -= kind == "sym_def"
        elif kind == "attr":
            self.attr(x)
        elif kind in ("param", "var_def", "info_def"):
            self.defining += kind != "var_def"
            if kind == "info_def":
                self.node("info", x)
            else:
                self.var_def(x)
            self.defining -= kind != "var_def"
        elif kind in ("buffer_use",) or (kind == "expr" and isinstance(x, Var)):
            self.put(type(x).__name__, self.idx.get(x, -1))
        elif kind == "buffer_def":
            self.buffer_def(x)
        elif kind == "infos":
            self.children(_seq("", "info", x))
        else:
            self.put(type(x).__name__)
            self.children(_fields(x))

    def children(self, fields: list[Field]) -> None:
        for _, kind, x in fields:
            self.node(kind, x)

    def var_def(self, v: Var) -> None:
        self.put(type(v).__name__)
        self.children(_fields(v))
        self.define(v)

    def buffer_def(self, b: Buffer) -> None:
        if b in self.idx:
            self.put("again", self.idx[b])
            return
        self.put(b.dtype)
        self.children(_seq(".shape", "dim", b.shape))
        self.define(b)

    def attr(self, v: Any) -> None:
        v = _plain(v)
        cat = _category(v)
        self.put(cat)
        if cat == "dim":
            self.dim(v)
        elif cat == "seq":
            self.children(_seq("", "attr", tuple(v)))
        elif cat in ("map", "info"):
            self.node("node", v)
        elif cat != "other":
            self.put(v)

    def dim(self, d: Any) -> None:
        d = _plain(d)
        if isinstance(d, int):
            return self.put("i", d)
        mappable = self.in_func or self.defining > 0
        if isinstance(d, SymVar):
            if d in self.idx:
                return self.put("s", self.idx[d])
            self.put("sdef" if mappable else "sfree", d.lo, d.hi)
            if mappable:
                self.define(d)
            return None
        canon = self._canon.get(d)
        if canon is None:
            canon = self._canon[d] = sym_walk.simplify(d)
        new = [v for v in sym_walk.free_vars(d) if v not in self.idx]
        if new and mappable:
            self.put("group", len(new))
            for v in new:  # met together, so they share an index: the pairing is not known
                self.idx[v] = self.counter
            self.counter += 1
        self.put("c", self.sexpr(canon))

    def sexpr(self, e: Any) -> bytes:
        """A digest of a canonical dim, independent of the order of its commutative parts."""

        def digest(*items: Any) -> bytes:
            saved, self.h = self.h, hashlib.blake2b(digest_size=8)
            self.put(*items)
            out, self.h = self.h.digest(), saved
            return out

        if isinstance(e, int):
            return digest("i", e)
        if isinstance(e, SymVar):
            if e not in self.idx:
                self._unindexed += 1
            return digest("s", self.idx.get(e, -1), e.lo, e.hi)
        known = self._digests.get(e)
        if known is not None:
            return known
        unindexed = self._unindexed
        if isinstance(e, (FloorDiv, FloorMod)):
            out = digest(type(e).__name__, self.sexpr(e.a), self.sexpr(e.b))
        elif isinstance(e, (Min, Max)):
            out = digest(type(e).__name__, *sorted([self.sexpr(e.a), self.sexpr(e.b)]))
        else:
            assert isinstance(e, Poly)
            terms = sorted(digest("t", c, *sorted(self.sexpr(a) for a in m)) for m, c in e.terms)
            out = digest("P", e.const, *terms)
        if self._unindexed == unindexed:
            self._digests[e] = out
        return out


def structural_hash(x: Any) -> int:
    """A 64-bit hash of ``x`` that structurally equal objects share; independent of names and
    stable across processes."""
    h = _Hash()
    h.top(x)
    return int.from_bytes(h.h.digest(), "little")


__all__ = ["structural_equal", "assert_structural_equal", "structural_hash"]
