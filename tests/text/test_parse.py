"""Hand-written text parses (struct info may be left out and is then inferred), and bad text
fails with a ParseError that points at the line and column with a caret."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tilework import op
from tilework.errors import ParseError
from tilework.ir.builder import BlockBuilder
from tilework.ir.graph import Binding, Call, Constant, DataflowBlock, DataflowVar, GraphFunc, If, MatchCast, Var
from tilework.ir.info import AnyInfo, PrimInfo, TensorInfo
from tilework.ir.loop import Binary, Block, For, Load, Store, TensorFunc
from tilework.ir.structural import assert_structural_equal, structural_equal
from tilework.ir.sym import SymVar
from tilework.text import parse, print_module

HAND_WRITTEN = '''
# a module written by hand: most struct info is left to inference
@graph
def main(x: Tensor((n, 4), "float32"), w: Tensor((4, 4), float32), flag: Prim("bool")):
    n = sym(lo=1, hi=4096)
    m = sym()
    with dataflow():
        h = matmul(x, w)
        a = exp(add(h, const([1.0, 2.0, 3.0, 4.0], "float32")))
        out = astype(a, dtype="float16")
        output(out)
    y = match_cast(out, Tensor((m, 4), "float16"))
    z = if flag:
        t = multiply(y, y)
        t
    else:
        y
    k: Tensor((n, 4), "float32") = call_tensor(@double, (x,), out=Tensor((n, 4), "float32"))
    r = @twice(k)
    return (z, r, prim(n + 1))

@graph
def twice(v: Tensor((p, 4), "float32")) -> Tensor((p, 4), "float32"):
    p = sym()
    s = add(v, v)
    return s

@tensor
def double(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32")):
    n = sym(lo=1)
    for i in parallel(n):
        for j in range(4):
            with block("B"):
                vi = spatial(n, i)
                vj = spatial(4, j)
                reads(A)
                writes(B)
                B[vi, vj] = A[vi, vj] * float32(2.0)
'''


def test_hand_written_module_infers_struct_info() -> None:
    mod = parse(HAND_WRITTEN)
    assert list(mod) == ["main", "twice", "double"]
    main = mod["main"]
    assert isinstance(main, GraphFunc)
    n = main.params[0].info.shape[0]  # type: ignore[attr-defined]
    df = main.body.blocks[0]
    assert isinstance(df, DataflowBlock)
    h, a, out = (b.var for b in df.bindings)
    nested = df.bindings[1].value  # written nested, kept nested: the parser builds what is written
    assert isinstance(nested, Call) and isinstance(nested.args[0], Call) and nested.args[0].info == TensorInfo((n, 4), "float32")
    assert isinstance(h, DataflowVar) and not isinstance(out, DataflowVar)
    assert h.info == TensorInfo((n, 4), "float32")
    assert out.info == TensorInfo((n, 4), "float16")
    y_bind, z_bind, k_bind, r_bind = main.body.blocks[1].bindings
    assert isinstance(y_bind, MatchCast)
    m = y_bind.cast_info.shape[0]  # type: ignore[attr-defined]
    assert isinstance(m, SymVar) and m.name == "m"
    assert isinstance(z_bind.value, If) and z_bind.var.info == TensorInfo((m, 4), "float16")
    assert r_bind.var.info == TensorInfo((n, 4), "float32")  # through @twice's signature
    assert main.ret_info.fields[2] == PrimInfo("int64", n + 1)  # type: ignore[attr-defined]
    double = mod["double"]
    assert isinstance(double, TensorFunc) and isinstance(double.body, For) and double.body.kind == "parallel"


def test_hand_written_equals_the_built_module() -> None:
    n = SymVar("n", 1)
    x = Var("x", TensorInfo((n, 4), "float32"))
    bb = BlockBuilder()
    with bb.function("f", [x]):
        with bb.dataflow():
            y = bb.emit(op.exp(x))
            z = bb.emit_output(op.add(y, x))
        bb.emit_func_output(z)
    text = """
    @graph
    def f(a: Tensor((k, 4), "float32")):
        k = sym(lo=1)
        with dataflow():
            b = exp(a)
            c = add(b, a)
            output(c)
        return c
    """
    assert_structural_equal(bb.get(), parse(textwrap.dedent(text)))
    assert not structural_equal(bb.get(), parse(textwrap.dedent(text).replace("add(b, a)", "add(a, b)")))


def test_loop_expressions_fold_index_arithmetic() -> None:
    text = """
    @tensor(num_outputs=1)
    def k(A: Buffer((n * 2,), "float32"), B: Buffer((n,), "float32"), n: int64):
        n = sym()
        for i in range(n):
            B[i] = A[i * 2 + 1] + A[2 * i] * float32(0.5)
    """
    k = parse(textwrap.dedent(text))["k"]
    assert isinstance(k, TensorFunc)
    store = k.body.body  # type: ignore[attr-defined]
    assert isinstance(store, Store)
    i = k.body.var  # type: ignore[attr-defined]
    assert store.indices == (i,)
    assert isinstance(store.value, Binary) and store.value.op == "+" and store.value.dtype == "float32"
    left = store.value.a
    assert isinstance(left, Load) and left.indices[0] is 2 * i + 1  # canonical sym expr


def test_meta_extern_and_attrs_items() -> None:
    data = np.arange(40, dtype="float32").reshape(10, 4)
    import base64

    text = f"""
    attrs = {{"target": "cpu", "opt": [1, 2.5, "x", None, True]}}

    @lib = extern("libfoo_run", Func([Tensor(ndim=2, dtype="float32")], Any, pure=False))

    @graph(pure=False)
    def main() -> Any:
        c = meta[0]
        r: Any = @lib(c)
        return r

    meta[0] = const(dtype="float32", shape=(10, 4), data="{base64.b64encode(data.tobytes()).decode()}", name="w")
    """
    mod = parse(textwrap.dedent(text))
    assert mod.attrs["opt"] == (1, 2.5, "x", None, True)
    c = mod["main"].body.blocks[0].bindings[0].value  # type: ignore[union-attr]
    assert isinstance(c, Constant) and c.name == "w" and np.array_equal(c.data, data)
    assert mod["lib"].info.pure is False  # type: ignore[union-attr]


def _error(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(textwrap.dedent(text))
    return info.value


def _caret_column(err: ParseError) -> int:
    *_, src, caret = str(err).split("\n")
    assert caret.strip() == "^"
    return len(caret) - len("    ")


@pytest.mark.parametrize(
    "text, line, col, message",
    [
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = add(x x)
                return y
            """,
            4, 15, "expected ')' after arguments, found 'x'",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = add(x, x
                return y
            """,
            4, 12, "'(' is never closed",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = frobnicate(x)
                return y
            """,
            4, 9, "unknown op 'frobnicate'",
        ),
        (
            """
            @graph
            def main(x: Tensor((n, 4), "float32")):
                return x
            """,
            3, 21, "undefined name 'n'",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float33")):
                return x
            """,
            3, 26, "unknown dtype 'float33'",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = astype(x, dtyp="float16")
                return y
            """,
            4, 19, "op 'astype' has no attribute 'dtyp' (it accepts: dtype)",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = exp(x)
                  z = exp(y)
                return z
            """,
            5, 7, "unexpected indentation",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                x = exp(x)
                return x
            """,
            4, 5, "'x' is already defined",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                with dataflow():
                    y = exp(x)
                    output(q)
                return y
            """,
            6, 16, "output 'q' is not bound in this dataflow block",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = exp(x)
            """,
            5, 1, "a function body must end with 'return <value>'",
        ),
        (
            """
            @tensor
            def k(A: Buffer((4,), "float32")):
                for i in range(4):
                    A[i] = B[i]
            """,
            5, 16, "undefined name 'B'",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y: Tensor((4,), "float32") = "unterminated
                return y
            """,
            4, 34, "unterminated string",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = exp(x, x)
                return y
            """,
            4, 9, "op 'exp' takes 1 argument(s), got 2",
        ),
        (
            """
            @graph
            def main(x: Tensor((4,), "float32")):
                y = add(x, const([1.0, 2.0], "float32"))
                return y
            """,
            4, 9, "cannot infer the struct info of this call",
        ),
    ],
    ids=["missing-paren", "unclosed-paren", "unknown-op", "undefined-dim", "bad-dtype", "bad-attr", "bad-indent", "redefined", "bad-output", "no-return", "undefined-buffer", "unterminated", "arity", "inference"],
)
def test_parse_errors_point_at_the_token(text: str, line: int, col: int, message: str) -> None:
    err = _error(text)
    assert (err.line, err.column) == (line, col), str(err)
    assert message in str(err)
    assert str(err).startswith(f"line {line}, column {col}: ")
    assert _caret_column(err) == col


_KERNEL = """
@tensor
def k(A: Buffer((4,), "float32"), Bb: Buffer((4,), "float32")):
    n = sym()
    for i in range(4):
        Bb[i] = USE
"""


@pytest.mark.parametrize(
    "use, message",
    [
        ("B[i]", "undefined name 'B': no buffer 'B'; its buffers: A, Bb; did you mean Bb?"),
        ("z[i] + A[i]", "undefined name 'z': no buffer 'z'; its buffers: A, Bb"),
        ("sqrtt(A[i])", "undefined name 'sqrtt': unknown function 'sqrtt'; did you mean sqrt or rsqrt?"),
        ("frob(A[i])", "undefined name 'frob': unknown function 'frob'"),
        ("A[i] * nn", "undefined name 'nn'; did you mean n? Or declare a symbolic dim at the start of the function: nn = sym()"),
    ],
    ids=["buffer-close", "buffer", "function-close", "function", "dim"],
)
def test_an_undefined_name_in_a_tensor_function_is_hinted_by_its_use(use: str, message: str) -> None:
    """A buffer use or a call of an undefined name is said to be one (both were told to declare
    a symbolic dim: ``z = sym()``)."""
    err = _error(_KERNEL.replace("USE", use))
    assert err.line == 6 and str(err).startswith(f"line 6, column {err.column}: {message}\n"), str(err)
    assert err.column == 17 + use.index(message.split("'")[1])


def test_a_module_function_called_without_its_at_is_hinted() -> None:
    text = """
    @graph
    def helper(x: Tensor((4,), "float32")) -> Tensor((4,), "float32"):
        return x

    @graph
    def main(x: Tensor((4,), "float32")):
        y = helper(x)
        z = expp(y)
        return z
    """
    err = _error(text)
    assert (err.line, err.column) == (8, 9) and "unknown op 'helper'; did you mean @helper (a function of this module)?" in str(err)
    err = _error(text.replace("helper(x)", "@helper(x)"))
    assert (err.line, err.column) == (9, 9) and "unknown op 'expp'; did you mean exp or exp2 or expm1?" in str(err)


def test_a_byte_order_mark_is_skipped() -> None:
    """A UTF-8 BOM at the start (as some editors write) is skipped (it was 'unexpected
    character'); errors still point at the right line and column."""
    text = textwrap.dedent(HAND_WRITTEN)
    assert_structural_equal(parse("\ufeff" + text), parse(text))
    with pytest.raises(ParseError) as err:
        parse("\ufeff@graph\ndef main(x: Tensor((4,), \"float32\")):\n    return q\n")
    assert (err.value.line, err.value.column) == (3, 12)


def test_error_shows_the_source_line() -> None:
    err = _error(
        """
        @graph
        def main(x: Tensor((4,), "float32")):
            y = add(x x)
            return y
        """
    )
    lines = str(err).split("\n")
    assert lines == ["line 4, column 15: expected ')' after arguments, found 'x'", "        y = add(x x)", "    " + " " * 14 + "^"]


def test_unknown_top_level_item() -> None:
    err = _error("hello = 3\n")
    assert (err.line, err.column) == (1, 1) and "expected a function" in str(err)


def test_round_trip_of_parsed_hand_written_text() -> None:
    mod = parse(HAND_WRITTEN)
    assert_structural_equal(mod, parse(print_module(mod)))


def test_annotation_overrides_inference() -> None:
    text = """
    @graph
    def main(x: Tensor((4,), "float32")):
        y: Tensor(ndim=1, dtype="float32") = exp(x)
        z: Any = y
        return z
    """
    main = parse(textwrap.dedent(text))["main"]
    y, z = main.body.blocks[0].bindings  # type: ignore[union-attr]
    assert isinstance(y, Binding) and isinstance(y.value, Call)
    assert y.var.info == y.value.info == TensorInfo(None, "float32", 1)
    assert z.var.info == AnyInfo() and z.value is y.var


_TWO_INPUTS = """
@graph
def main(x: Tensor((n, m), "float32"), y: Tensor((m, n), "float32")) -> Tensor((n, m), "float32"):
    n = sym(lo=1, hi=64)
    m = sym(lo=1)
    with dataflow():
        lv0: Tensor((n, m), "float32") = permute_dims(y, axes=None)
        gv0: ANNOTATION = add(x, lv0)
        output(gv0)
    return gv0
"""


@pytest.mark.parametrize(
    "annotation, message",
    [
        ('Tensor((n, 5), "float32")', 'has struct info Tensor((n, 5), "float32"), but its parts give Tensor((n, m), "float32"), which it is not provably a base of (an annotation may widen a value\'s info, not narrow it): to claim Tensor((n, 5), "float32"), bind the value as it is and match_cast it'),
        ('Tensor((m, n), "float32")', 'has struct info Tensor((m, n), "float32"), but its parts give Tensor((n, m), "float32"), which it is not provably a base of'),
        ('Tensor((n, m + 1), "float32")', 'has struct info Tensor((n, m + 1), "float32"), but its parts give Tensor((n, m), "float32")'),
        ('Tensor((n, m), "float16")', 'has struct info Tensor((n, m), "float16"), but its parts give Tensor((n, m), "float32")'),
    ],
    ids=["claim", "swapped", "provably-different", "dtype"],
)
def test_an_annotation_that_narrows_its_value_is_refused_by_verify(annotation: str, message: str) -> None:
    """A binding's annotation is the call's info: verify checks that it is a base of what the
    call infers, dims included (``(n, 5)`` for ``add``'s ``(n, m)`` passed and was never
    checked); a claim is a match_cast. The binding is shown underlined."""
    from tilework import verify
    from tilework.errors import WellFormedError

    mod = parse(_TWO_INPUTS.replace("ANNOTATION", annotation))
    with pytest.raises(WellFormedError) as err:
        verify(mod)
    text = str(err.value)
    assert "error[struct-info] in @main: the call of add in the value of %gv0 " + message in text
    line = f"        gv0: {annotation} = add(x, lv0)"
    assert line + "\n        " + "^" * (len(line) - 8) + " rule 6" in text


def test_an_annotation_may_widen_and_a_match_cast_claims() -> None:
    from tilework import verify

    for widened in ('Tensor(ndim=2, dtype="float32")', 'Tensor(dtype="float32")'):
        verify(parse(_TWO_INPUTS.replace("gv0: ANNOTATION = add(x, lv0)", f"gv0: {widened} = add(x, lv0)").replace('-> Tensor((n, m), "float32")', "")))
    claimed = _TWO_INPUTS.replace("gv0: ANNOTATION = add(x, lv0)", 'lv1: Tensor((n, m), "float32") = add(x, lv0)\n        gv0: Tensor((n, 5), "float32") = match_cast(lv1, Tensor((n, 5), "float32"))')
    verify(parse(claimed.replace('-> Tensor((n, m), "float32")', '-> Tensor((n, 5), "float32")')))


def test_loop_parse_of_blocks_with_init() -> None:
    text = """
    @tensor
    def s(A: Buffer((n, m), "float32"), B: Buffer((n,), "float32")):
        n = sym()
        m = sym()
        for i in range(n):
            for k in range(m):
                with block("sum"):
                    vi = spatial(n, i)
                    vk = reduce(m, k)
                    reads(A)
                    writes(B)
                    with init():
                        B[vi] = float32(0.0)
                    B[vi] = B[vi] + A[vi, vk]
    """
    s = parse(textwrap.dedent(text))["s"]
    blk = s.body.body.body  # type: ignore[union-attr]
    assert isinstance(blk, Block) and [iv.kind for iv in blk.iter_vars] == ["spatial", "reduce"]
    assert isinstance(blk.init, Store) and blk.reads == (s.params[0],)  # type: ignore[union-attr]
